"""The tasks of the learning study (E1, E2: :mod:`graded.study.learning`) and their data.

Each task (:data:`TASKS`) is a fixed pool of training examples (nested training sets are
prefixes of a seed's permutation of the pool, :meth:`TaskData.train_subset`), a fixed
validation and a fixed test set (:func:`make_data`):

- ``poly_e1`` / ``poly_e5``: degree-weighted polynomial regression (000 Ex 5.24,
  :class:`graded.tasks.PolynomialRegression`, graded energy target) with emphasis 1 (every
  degree weighs the same: no structure for a grading to match, the negative control) and 5
  (degree 3 carries 125/156 of the weight). Feature grades: the monomial degree 0..3.
- ``needle_w8`` / ``needle_w32``: a "needle" in ``width`` Gaussian features over 4 tokens;
  the target y = (Σ_t x_{t,j*})²/4 − 1 depends on one coordinate j* only
  (:func:`needle_data`). Feature grades: 3 on the needle, 0 elsewhere.
- ``dyck``: next-token prediction on Dyck-2 words (:class:`graded.tasks.DyckLM`), graded by
  nesting depth per token (``token_grades``), so graded attention, graded positions and
  per-token grades can act; there are no feature grades.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from graded.tasks.dyck import DyckLM
from graded.tasks.polynomial_regression import PolynomialRegression

__all__ = ["POOL", "TASKS", "TaskData", "TaskSpec", "make_data", "needle_data"]

#: The number of training examples in each task's pool (nested training sets are its prefixes).
POOL = 3200


@dataclass(frozen=True)
class TaskSpec:
    """One task of the study: ``family`` (poly, needle, dyck), its options, whether it has
    structure a grading can match (False for the negative control)."""

    name: str
    family: str
    options: tuple[tuple[str, Any], ...]
    structured: bool
    description: str

    @property
    def kind(self) -> str:
        return "lm" if self.family == "dyck" else "regression"


TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec("poly_e1", "poly", (("emphasis", 1.0),), False,
             "polynomial regression, emphasis 1 (no degree structure: negative control)"),
    TaskSpec("poly_e5", "poly", (("emphasis", 5.0),), True,
             "polynomial regression, emphasis 5 (high degrees dominate)"),
    TaskSpec("needle_w8", "needle", (("width", 8),), True, "needle feature among 8"),
    TaskSpec("needle_w32", "needle", (("width", 32),), True, "needle feature among 32"),
    TaskSpec("dyck", "dyck", (("k", 2), ("max_length", 16), ("max_depth", 4)), True,
             "Dyck-2 next-token prediction, words ≤ 16, depth ≤ 4 (per-token depth grades)"),
)}


@dataclass
class TaskData:
    """Pool, validation and test tensors of one task, and its grades."""

    spec: TaskSpec
    pool: dict[str, Tensor]
    val: dict[str, Tensor]
    test: dict[str, Tensor]
    grades: list[float]  # natural feature grades (empty for the sequence task)
    importance: list[float]  # true importance of each feature (000-I)
    vocab_size: int | None = None
    input_dim: int | None = None
    max_len: int = 8
    max_token_grade: int = 0

    def train_subset(self, n: int, seed: int) -> dict[str, Tensor]:
        """The first ``n`` examples of the pool in the order of ``seed`` (nested in n)."""
        size = self.pool["inputs"].shape[0]
        if not 1 <= n <= size:
            raise ValueError(f"n={n} must lie in [1, {size}] (the pool size)")
        order = torch.randperm(size, generator=torch.Generator().manual_seed(10_000 + seed))
        idx = order[:n]
        return {k: v[idx] for k, v in self.pool.items()}


def needle_data(n: int, width: int, seed: int, *, tokens: int = 4, needle: int | None = None
                ) -> dict[str, Tensor]:
    """The needle task: x (n, tokens, width) standard Gaussian, y = (Σ_t x_{t,j*})²/tokens − 1
    with j* = ``needle`` (default width // 3); targets (n, 1)."""
    if width < 2:
        raise ValueError(f"width must be >= 2 for a needle among distractors, got {width}")
    j = width // 3 if needle is None else needle
    if not 0 <= j < width:
        raise ValueError(f"needle={j} must lie in [0, {width})")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, tokens, width, generator=g)
    y = x[:, :, j].sum(dim=1).square() / tokens - 1.0
    return {"inputs": x, "targets": y[:, None]}


def make_data(spec: TaskSpec, *, n_eval: int, pool: int = POOL) -> TaskData:
    """Generate the pool, validation and test sets of ``spec`` (fixed seeds 1, 2, 3), with
    regression targets standardised by the pool's mean and standard deviation."""
    opts = dict(spec.options)
    if spec.family == "poly":
        task = PolynomialRegression(emphasis=opts["emphasis"], target="graded_energy")
        sets = [task.generate(m, seed=s).tensors for m, s in ((pool, 1), (n_eval, 2),
                                                               (n_eval, 3))]
        sets = [{k: v for k, v in d.items() if k in ("inputs", "targets", "key_padding_mask")}
                for d in sets]
        grades = list(task.grades)
        importance = task.degree_weights.tolist()
        extra = dict(input_dim=task.input_dim, max_len=task.max_len)
    elif spec.family == "needle":
        width = int(opts["width"])
        sets = [needle_data(m, width, s) for m, s in ((pool, 1), (n_eval, 2), (n_eval, 3))]
        grades = [0.0] * width
        grades[width // 3] = 3.0
        importance = [1.0 if g > 0 else 0.0 for g in grades]
        extra = dict(input_dim=width, max_len=4)
    elif spec.family == "dyck":
        task = DyckLM(**opts)
        sets = [task.generate(m, seed=s).tensors for m, s in ((pool, 1), (n_eval, 2),
                                                               (n_eval, 3))]
        keep = ("inputs", "targets", "key_padding_mask", "token_grades")
        sets = [{k: v for k, v in d.items() if k in keep} for d in sets]
        grades, importance = [], []
        extra = dict(vocab_size=len(task.vocab), max_len=task.max_len,
                     max_token_grade=int(opts["max_depth"]))
    else:
        raise ValueError(f"unknown task family {spec.family!r}; expected poly, needle or dyck")
    if spec.kind == "regression":
        y = sets[0]["targets"]
        mean, std = y.mean(), y.std().clamp(min=1e-8)
        for d in sets:
            d["targets"] = (d["targets"] - mean) / std
    return TaskData(spec, *sets, grades=grades, importance=importance, **extra)
