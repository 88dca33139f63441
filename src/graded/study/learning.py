"""Tasks, grading arms and the training loop of the sample-efficiency study (E1) and of E2.

**Tasks** (:data:`TASKS`), each a fixed pool of training examples (nested training sets are
prefixes of a seed's permutation of the pool), a fixed validation and a fixed test set:

- ``poly_e1`` / ``poly_e5``: degree-weighted polynomial regression (000 Ex 5.24,
  :class:`graded.tasks.PolynomialRegression`, graded energy target) with emphasis 1 (every
  degree weighs the same: no structure for a grading to match, the negative control) and 5
  (degree 3 carries 125/156 of the weight). Feature grades: the monomial degree 0..3.
- ``needle_w8`` / ``needle_w32``: a "needle" in ``width`` Gaussian features over 4 tokens;
  the target y = (Σ_t x_{t,j*})²/4 − 1 depends on one coordinate j* only. Feature grades: 3 on
  the needle, 0 elsewhere.
- ``dyck``: next-token prediction on Dyck-2 words (:class:`graded.tasks.DyckLM`), graded by
  nesting depth per token (``token_grades``), so graded attention, graded positions and
  per-token grades can act; there are no feature grades.

**Arms** (:data:`ARMS`): ``none`` (ungraded); ``fixed_*`` (EGT λ = 2 on the input stage only,
grades fixed at the aligned, reversed (max − q) or shuffled (a permutation of the aligned
grades) values); ``learned_*`` (the same, grades learned from neutral (q = 0), aligned or
reversed starts, projected on q ≥ 0 after each step as 000 Def 6.1 requires); ``lgt`` and
``egt`` (every stage graded, grades learned from the aligned start by the recipes of 000
Algorithm 5.1 and 7.1, :mod:`graded.train.recipes`; on the sequence task also graded
positions with α = ``POSITION_ALPHA``, and the recipes' graded loss weighting each target
token by λ_t^depth or f(depth); the regression tasks' one target carries no grade, so there
they train on the plain loss) with ``egt_fixed_base`` the EGT recipe without the
annealing of λ; ``twin`` (the *preconditioning twin*: an ungraded model whose input
projection is initialised as W·M_aligned, i.e. the fixed-aligned model's effective weights, then
trained ungraded: a fixed input grading placed before a linear map is a reparametrisation, so
the twin tells an effect of the grading from an effect of the initial scale); and, when the
model supports it (``TransformerConfig.token_grading``), ``token_*`` (per-token grades M_{q_i}
driven by the task's token grades: aligned, reversed, shuffled).

Every run is paired: the seed fixes the weight initialisation (identical across arms, see
:func:`build_model`), the training subset and the minibatch order.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from graded.grading import ExponentialGrading
from graded.kinds import get_kind
from graded.tasks.base import IGNORE_INDEX
from graded.tasks.dyck import DyckLM
from graded.tasks.polynomial_regression import PolynomialRegression
from graded.train.recipes import get_recipe
from graded.transformer.config import TransformerConfig
from graded.transformer.graded import gradings
from graded.transformer.models import TransformerClassifier, TransformerLM

__all__ = [
    "ARMS",
    "TASKS",
    "Arm",
    "TaskData",
    "TaskSpec",
    "arm_grades",
    "arms_for",
    "build_model",
    "evaluate",
    "fit",
    "make_data",
    "needle_data",
    "supports_token_grading",
    "train_run",
]

POOL = 3200
FEATURE_MODEL = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, positional="none", dropout=0.0,
                     init_std=0.1)
SEQUENCE_MODEL = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, positional="learned",
                      dropout=0.0, init_std=0.1)
BASE = 2.0  # λ of the fixed and learned input gradings
POSITION_ALPHA = 0.02  # α of the graded positions (000 Def 5.21) of the all-stage arms
#: The lm kind, whose loss_grades give the grade of each target token (the graded loss).
LM_KIND = get_kind("lm")


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


@dataclass(frozen=True)
class Arm:
    """How one arm grades the model (see the module docstring)."""

    name: str
    grading: str | None = None  # None, "exponential" (input stage) or "linear"/"exponential" (all)
    start: str = "neutral"  # aligned | reversed | shuffled | neutral
    learnable: bool = False
    all_stages: bool = False
    recipe: str = "plain"
    anneal: bool = True
    twin: bool = False
    token: str | None = None  # per-token grades: aligned | reversed | shuffled
    features: bool = True  # needs feature grades (not on the sequence task)


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("none"),
    Arm("fixed_aligned", "exponential", "aligned"),
    Arm("fixed_reversed", "exponential", "reversed"),
    Arm("fixed_shuffled", "exponential", "shuffled"),
    Arm("learned_neutral", "exponential", "neutral", learnable=True, features=False),
    Arm("learned_aligned", "exponential", "aligned", learnable=True),
    Arm("learned_reversed", "exponential", "reversed", learnable=True),
    Arm("lgt", "linear", "aligned", learnable=True, all_stages=True, recipe="lgt-alg5.1",
        features=False),
    Arm("egt", "exponential", "aligned", learnable=True, all_stages=True, recipe="egt-alg7.1",
        features=False),
    Arm("egt_fixed_base", "exponential", "aligned", learnable=True, all_stages=True,
        recipe="egt-alg7.1", anneal=False, features=False),
    Arm("twin", None, "aligned", twin=True),
    Arm("token_aligned", None, token="aligned", features=False),
    Arm("token_reversed", None, token="reversed", features=False),
    Arm("token_shuffled", None, token="shuffled", features=False),
)}


@functools.lru_cache(maxsize=1)
def supports_token_grading() -> bool:
    """Whether the transformer offers per-token grading: ``TransformerConfig.token_grading``
    accepts True on an exponential grading and ``TransformerLM.forward`` takes
    ``token_grades``. The per-token arms run only then."""
    if "token_grading" not in TransformerConfig.model_fields:
        return False
    if "token_grades" not in inspect.signature(TransformerLM.forward).parameters:
        return False
    try:
        TransformerConfig(vocab_size=8, d_model=8, n_heads=2, n_layers=1, max_len=8,
                          grading="exponential", token_grading=True)
    except ValueError:
        return False
    return True


def arms_for(task: TaskSpec) -> list[str]:
    """The arms that apply to ``task``: feature-grade arms on feature tasks; on the sequence
    task the ungraded, learned, recipe and (when available) per-token arms."""
    names = []
    for arm in ARMS.values():
        if arm.token is not None:
            if task.family == "dyck" and supports_token_grading():
                names.append(arm.name)
            continue
        if task.family == "dyck" and arm.features and arm.name != "none":
            continue
        names.append(arm.name)
    return names


# --------------------------------------------------------------------------- data


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


# --------------------------------------------------------------------------- arms


def _derangement(size: int, seed: int) -> list[int]:
    """A permutation of range(size) with no fixed point (size >= 2), drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    while True:
        p = rng.permutation(size)
        if size < 2 or not np.any(p == np.arange(size)):
            return [int(i) for i in p]


def arm_grades(grades: list[float], start: str, *, seed: int = 0) -> list[float]:
    """Feature grades of an arm's start: ``aligned`` (the natural grades), ``reversed``
    (max + min − q), ``shuffled`` (the natural grades under a fixed-point-free permutation
    drawn from ``seed``) or ``neutral`` (zeros)."""
    if start == "aligned":
        return list(grades)
    if start == "reversed":
        hi, lo = max(grades), min(grades)
        return [hi + lo - q for q in grades]
    if start == "shuffled":
        perm = _derangement(len(grades), seed)
        return [grades[i] for i in perm]
    if start == "neutral":
        return [0.0] * len(grades)
    raise ValueError(f"start={start!r}; expected aligned, reversed, shuffled or neutral")


def token_grade_map(start: str, max_grade: int, *, seed: int = 0) -> Tensor:
    """A lookup table t ↦ grade for per-token arms: the identity (aligned), max − 1 − t
    (reversed) or a fixed-point-free permutation of 0..max−1 (shuffled)."""
    levels = list(range(max_grade))
    return torch.tensor(arm_grades([float(v) for v in levels], start, seed=seed))


def _config(data: TaskData, arm: Arm, seed: int) -> TransformerConfig:
    base = FEATURE_MODEL if data.spec.kind == "regression" else SEQUENCE_MODEL
    fields: dict[str, Any] = dict(base, vocab_size=data.vocab_size, input_dim=data.input_dim,
                                  max_len=data.max_len)
    if arm.token is not None:
        fields.update(grading="exponential", grading_base=BASE, token_grading=True,
                      grade_input=False, grade_attention=False, grade_ffn=False,
                      grade_output=False, grade_positions=False)
    elif arm.grading is not None:
        fields.update(grading=arm.grading, grading_base=BASE, learnable_grades=arm.learnable)
        if data.grades:
            fields["input_grades"] = arm_grades(data.grades, arm.start, seed=seed)
        if not arm.all_stages:
            fields.update(grade_attention=False, grade_ffn=False, grade_output=False,
                          grade_positions=False)
        elif fields["positional"] != "none":
            fields["grade_position_alpha"] = POSITION_ALPHA
    return TransformerConfig(**fields)


def build_model(data: TaskData, arm: Arm | str, seed: int) -> nn.Module:
    """The model of ``arm`` on ``data``, initialised from ``seed``. Grading modules draw no
    random numbers, so every arm starts from the same weights for the same seed; the twin is
    the ungraded model with its input projection W replaced by W·diag(m(q_aligned))."""
    arm = ARMS[arm] if isinstance(arm, str) else arm
    torch.manual_seed(seed)
    config = _config(data, arm, seed)
    model = (TransformerLM(config) if data.spec.kind == "lm"
             else TransformerClassifier(config, num_outputs=1))
    if arm.twin:
        if not data.grades:
            raise ValueError(f"the twin arm needs feature grades; task {data.spec.name!r} has "
                             "none")
        scales = ExponentialGrading(len(data.grades), data.grades, base=BASE).scales()
        with torch.no_grad():
            model.encoder.embed.tokens.weight.mul_(scales.detach()[None, :])
    return model


# --------------------------------------------------------------------------- training


def _forward(model: nn.Module, batch: dict[str, Tensor], arm: Arm, token_map: Tensor | None
             ) -> Tensor:
    mask = batch.get("key_padding_mask")
    kwargs: dict[str, Any] = {}
    if arm.token is not None:
        assert token_map is not None
        kwargs["token_grades"] = token_map[batch["token_grades"].clamp(0, len(token_map) - 1)]
    return model(batch["inputs"], mask, **kwargs) if mask is not None else model(
        batch["inputs"], **kwargs)


def _loss(output: Tensor, batch: dict[str, Tensor], kind: str,
          weights: Tensor | None = None) -> Tensor:
    """Mean token cross-entropy or MSE; ``weights`` (B, T) weight each token's cross-entropy
    (the recipes' graded loss, 000 Def 5.37 / 7.1), the mean still over the scored tokens."""
    if kind == "lm":
        per = F.cross_entropy(output.flatten(0, 1), batch["targets"].flatten(),
                              ignore_index=IGNORE_INDEX, reduction="none")
        scored = (batch["targets"] != IGNORE_INDEX).sum().clamp(min=1)
        if weights is not None:
            per = per * weights.flatten().to(per.dtype)
        return per.sum() / scored
    return F.mse_loss(output, batch["targets"])


@torch.no_grad()
def evaluate(model: nn.Module, data: dict[str, Tensor], kind: str, arm: Arm | str = "none",
             token_map: Tensor | None = None) -> float:
    """Mean loss of ``model`` on ``data`` (MSE of standardised targets, i.e. about 1 − R², or
    token cross-entropy), in eval mode."""
    arm = ARMS[arm] if isinstance(arm, str) else arm
    was = model.training
    model.eval()
    loss = float(_loss(_forward(model, data, arm, token_map), data, kind))
    model.train(was)
    return loss


def _project_egt(model: nn.Module) -> None:
    """q ≥ 0 for learnable exponential grades (000 Def 6.1)."""
    with torch.no_grad():
        for g in gradings(model).values():
            if isinstance(g, ExponentialGrading) and g.learnable:
                g.grades.clamp_(min=0.0)


def train_run(data: TaskData, arm_name: str, **options: Any) -> dict[str, Any]:
    """:func:`fit` without the model: the figures of one run (JSON-able)."""
    return fit(data, arm_name, **options)[1]


def fit(data: TaskData, arm_name: str, *, n: int, seed: int, lr: float, steps: int,
        batch_size: int = 64, weight_decay: float = 0.01, evals: int = 8
        ) -> tuple[nn.Module, dict[str, Any]]:
    """Train the ``arm_name`` model on the first ``n`` pool examples of ``seed`` with AdamW
    (the arm's recipe, if any, sets the parameter groups, regularisation, λ annealing and grade
    learning-rate cap) for ``steps`` minibatch steps; evaluate the validation loss ``evals``
    times and keep the test loss at the best validation loss (early stopping as model
    selection). Returns the model in its state at the best validation loss (eval mode) and its
    figures: the losses, the first and last training losses, whether the run diverged, and the
    input grades of a graded arm at the best validation loss."""
    arm = ARMS[arm_name]
    kind = data.spec.kind
    train = data.train_subset(n, seed)
    model = build_model(data, arm, seed)
    recipe_options: dict[str, Any] = {}
    if arm.recipe == "egt-alg7.1":
        recipe_options["anneal"] = arm.anneal
    recipe = get_recipe(arm.recipe, **recipe_options)
    groups = recipe.param_groups(model, lr=lr, weight_decay=weight_decay)
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    token_map = (token_grade_map(arm.token, data.max_token_grade, seed=seed)
                 if arm.token is not None else None)
    gen = torch.Generator().manual_seed(20_000 + seed)
    recipe.on_step(model, opt, 0, steps)
    every = max(1, steps // evals)
    best_val, test_at_best, first, last, diverged = math.inf, math.inf, math.nan, math.nan, False
    tail: list[float] = []
    best_state = copy.deepcopy(model.state_dict())
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randint(0, n, (min(batch_size, n),), generator=gen)
        batch = {k: v[idx] for k, v in train.items()}
        # the recipes' graded loss weights each target token by its grade; the regression
        # tasks' single target has no grade, so their recipe arms train on the plain loss
        weights = (recipe.loss_weights(model, LM_KIND.loss_grades(batch)) if kind == "lm"
                   else None)
        loss = _loss(_forward(model, batch, arm, token_map), batch, kind, weights)
        total = loss + recipe.regularization(model)
        if not torch.isfinite(total):
            diverged = True
            break
        opt.zero_grad(set_to_none=True)
        total.backward()
        if recipe.clip_norm is not None and arm.recipe != "plain":
            nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_norm)
        opt.step()
        recipe.on_step(model, opt, step, steps)
        if arm.learnable and arm.recipe == "plain":
            _project_egt(model)
        value = float(loss.detach())
        if step == 1:
            first = value
        tail.append(value)
        if step % every == 0 or step == steps:
            val = evaluate(model, data.val, kind, arm, token_map)
            if val < best_val:
                best_val = val
                test_at_best = evaluate(model, data.test, kind, arm, token_map)
                best_state = copy.deepcopy(model.state_dict())
    if tail:
        last = float(np.mean(tail[-max(1, steps // 20):]))
    out: dict[str, Any] = {"val": best_val, "test": test_at_best, "train_first": first,
                           "train_last": last, "diverged": diverged}
    model.load_state_dict(best_state)
    model.eval()
    if arm.grading is not None and data.grades:
        grading = model.encoder.embed.input_grading.grading
        out["input_grades"] = grading.grades.detach().flatten().tolist()
    return model, out
