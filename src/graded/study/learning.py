"""Grading arms and the training loop of the sample-efficiency study (E1) and of E2.

The tasks (:data:`TASKS`: polynomial regression, the needle, Dyck-2) and their pool,
validation and test sets are :mod:`graded.study.learning_tasks`, whose names this module also
gives (``TASKS``, ``TaskSpec``, ``TaskData``, ``make_data``, ``needle_data``, ``POOL``).

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
from graded.study.learning_tasks import POOL as POOL
from graded.study.learning_tasks import TASKS, TaskData, TaskSpec, make_data, needle_data
from graded.tasks.base import IGNORE_INDEX
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

FEATURE_MODEL = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, positional="none", dropout=0.0,
                     init_std=0.1)
SEQUENCE_MODEL = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, positional="learned",
                      dropout=0.0, init_std=0.1)
BASE = 2.0  # λ of the fixed and learned input gradings
POSITION_ALPHA = 0.02  # α of the graded positions (000 Def 5.21) of the all-stage arms
#: The lm kind, whose loss_grades give the grade of each target token (the graded loss).
LM_KIND = get_kind("lm")


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
