"""Training recipes for graded models: 000 Algorithm 5.1 (LGT) and Algorithm 7.1 (EGT).

A recipe says how grades are optimised; the trainer calls it at four points:

- :meth:`Recipe.param_groups` — AdamW groups with the grades in a group of their own (no weight
  decay, learning rate ``grade_lr``), the rest as :func:`graded.train.optim.param_groups`;
- :meth:`Recipe.regularization` — added to the loss: γ‖q‖² on the feature grades,
  γ′Σ_i‖q_i‖² on the attention-head grades and γ_coord Σ_i‖q_i − mean_j q_j‖², the head
  coordination term (000 Alg 5.1, 7.1);
- :meth:`Recipe.on_step` — after each optimizer and scheduler step, it prepares the next step:
  sets λ_{t} = 1 + (λ_max − 1)·t/T on every exponential grading (000 Alg 7.1, §7.2 (iii)) and
  caps the grade learning rate below the bound of the algorithms
  (:mod:`graded.train.grade_lr`), η_q < 1/q_max (LGT, q_max =
  max f(q), the largest entry of M_q) or η_q < 1/(λ_t^{q_max} ln λ_t) (EGT, q_max the largest
  grade), recomputed from the current grades (over feature and head grades); with
  ``lr_bound="off"`` the bound is logged but not applied. The cap is ``lr_margin`` × bound;
  where the bound is infinite (q_max ≤ 0 for LGT, λ_t = 1 for EGT) the scheduled rate stands.
  It caps the ``grades`` group of :meth:`Recipe.param_groups` and any other optimizer group
  that holds learnable grades (an optimizer built by hand); a group that mixes grades with
  other parameters is refused (ValueError), as its rate cannot bound the grades alone. The
  scheduled rate is the group's rate as a scheduler (or the user) last set it: without a
  scheduler, a bound that loosens again gives the rate back (the group keeps ``scheduled_lr``
  and ``capped_lr`` to tell the two apart).
  With per-token grading (000 Remark 6.16: token i scaled by M_{s_i·q}) the bound is still
  taken at the largest grade q_max, not at the largest s_i·q: the algorithms state it for the
  grades, the learned parameters, and the multipliers s_i are data that change from batch to
  batch (a bound read from them would move with the batch). Where the multipliers exceed 1,
  λ^{s·q} is steeper in q than λ^q, and ``lr_margin`` is the knob that tightens the cap.
  For EGT it also projects learnable grades onto q ≥ 0 (000 Def 6.1), so recorded grades are
  the grades used;
- :meth:`Recipe.loss_weights` — the graded loss the algorithms minimise (000 Def 5.37,
  Eq. 63: L = Σ_i Σ_k f(q_k) ℓ(ŷ_ik, y_ik); Def 7.1: L = Σ_i Σ_k λ^{q_k} ℓ(ŷ_ik, y_ik)) as
  weights w on the loss items of the task kind: w = f(q) with the model's f
  (``TransformerConfig.grading_f``) for LGT, w = λ_t^q for EGT with λ_t the base of the
  model's exponential grading at that step (annealed by :meth:`Recipe.on_step`). The grades
  are data, not parameters: no gradient flows through w.

*Which grades q_k weight the loss* (the definitions index the output dimensions k of token i;
:meth:`graded.kinds.TaskKind.loss_grades`):

- regression: the grade of each target coordinate k (``Task.output_grades``; e.g. the weight
  w_k of normal-form coordinate k of ``weighted_projective``): Eq. 63 with ℓ the squared error;
- classification: the grade of each class (``Task.output_grades``); ℓ is the cross-entropy
  term −y_k log p_k, so with one-hot targets Σ_k w_k ℓ_k = w_y·(−log p_y), the cross-entropy
  weighted by the true class's weight; with label smoothing ε the targets are
  y = (1 − ε)·one_hot + ε/C and every class's term counts with its own weight,
  (1 − ε)·w_y·(−log p_y) + (ε/C)·Σ_k w_k·(−log p_k), the letter of Eq. 63;
- lm and seq2seq (a task whose ``graded_object`` is "tokens"): *a decision*, not the letter of
  the definitions: the vocabulary carries no grades, so the loss weights the target *tokens*
  i, not the dimensions k, each by the grade of the token it predicts, from the batch's
  ``token_grades`` (``decoder_token_grades``): nesting depth, monomial degree. This is 000
  §5.4.1's intent, that "critical features, such as high-degree polynomial terms or syntactic
  heads, contribute more significantly to the optimization objective".

Where the task declares no such grades (most classification tasks, scalar regression, token
tasks without ``token_grades``) the trainer trains on the plain loss and says so once, as a
``RuntimeWarning`` and a ``warning`` event in the run's ``history.jsonl``; never silently.
The trainer keeps its sum / count accounting: the loss of a step is Σ w·ℓ over its items
divided by the number of items, so with all weights 1 it is the plain loss exactly (the
definitions' plain sum, divided by the count as the plain loss is). ``graded_loss=False``
trains on the plain loss. The evaluation loss stays the plain loss, comparable across recipes.

Gradient clipping at τ is the trainer's ``clip_norm``; the recipes carry a default τ.
The printed grade-gradient formulas of 000 are not used: gradients come from autograd.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from graded.checks import check_float
from graded.grading import ExponentialGrading, GradingMap
from graded.train.grade_lr import cap_grade_lr, grade_groups, grade_lr_bound, read_host, to_host
from graded.train.optim import is_grade_parameter, param_groups
from graded.transformer.graded import feature_grading, gradings

__all__ = [
    "KIND_OPTIONS",
    "LR_BOUNDS",
    "RECIPES",
    "RECIPE_KINDS",
    "Recipe",
    "anneal_lambda",
    "coordination_penalty",
    "get_recipe",
    "grade_lr_bound",
]


#: Recipe options that may be None (off): ``false`` reads as None too, as for every config key
#: that can be off (TOML has no null; :func:`graded.train.options.takes_false_for_null`).
OPTIONAL_OPTIONS = ("lambda_max", "clip_norm")
#: Recipe kinds: plain (None), LGT (``"linear"``), EGT (``"exponential"``).
RECIPE_KINDS = (None, "linear", "exponential")
#: The options (fields of :class:`Recipe`) a recipe of each kind reads. A plain recipe trains
#: no grades (no regulariser, grade learning-rate bound or graded loss); LGT has no λ to
#: anneal. ``clip_norm`` is every recipe's default τ (read by loops written by hand: the
#: trainer clips at its own ``train.clip_norm``).
KIND_OPTIONS: dict[str | None, tuple[str, ...]] = {
    None: ("clip_norm",),
    "linear": ("gamma", "gamma_heads", "gamma_coord", "lr_margin", "clip_norm", "lr_bound",
               "graded_loss"),
    "exponential": ("gamma", "gamma_heads", "gamma_coord", "anneal", "lambda_max", "lr_margin",
                    "clip_norm", "lr_bound", "graded_loss"),
}


def anneal_lambda(step: int, total_steps: int, lambda_max: float) -> float:
    """λ_t = 1 + (λ_max − 1)·t/T, clamped to [1, λ_max] (000 Alg 7.1)."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    check_float("lambda_max", lambda_max, minimum=1, strict_min=True)
    frac = min(max(step / total_steps, 0.0), 1.0)
    return 1.0 + (lambda_max - 1.0) * frac


def coordination_penalty(grades: Tensor) -> Tensor:
    """Σ_i ‖q_i − (1/h) Σ_j q_j‖² over the heads (rows) of (h, d_k) grades; 0 if shared."""
    if grades.dim() < 2:
        return grades.new_zeros(())
    return (grades - grades.mean(dim=0, keepdim=True)).square().sum()


@dataclass(frozen=True)
class Recipe:
    """How to train grades. ``kind`` is None (plain), ``"linear"`` or ``"exponential"``."""

    name: str = "plain"
    kind: str | None = None
    gamma: float = 0.0
    gamma_heads: float = 0.0
    gamma_coord: float = 0.0
    anneal: bool = False
    lambda_max: float | None = None
    lr_margin: float = 0.9
    clip_norm: float | None = 1.0
    lr_bound: str = "paper"
    graded_loss: bool = True

    def __post_init__(self) -> None:
        if self.lr_bound is False:  # YAML 1.1 reads a bare `off` as false
            object.__setattr__(self, "lr_bound", "off")
        if self.lr_bound not in LR_BOUNDS:
            raise ValueError(f"lr_bound={self.lr_bound!r}; expected one of {LR_BOUNDS}")
        if self.kind not in RECIPE_KINDS:
            raise ValueError(f"kind={self.kind!r}; expected one of {RECIPE_KINDS}")
        # the numbers (graded.checks.check_float); false turns an optional one off, as None
        for name in OPTIONAL_OPTIONS:
            if getattr(self, name) is False:  # TOML has no null (docs/training.md)
                object.__setattr__(self, name, None)
        check_float("lr_margin", self.lr_margin, minimum=0, maximum=1, strict_min=True)
        for name in ("gamma", "gamma_heads", "gamma_coord"):
            # a negative weight would reward large grades
            check_float(name, getattr(self, name), minimum=0)
        if self.lambda_max is not None:  # λ is annealed from 1 up to it; None: the model's base
            check_float("lambda_max (None for the model's base)", self.lambda_max, minimum=1,
                        strict_min=True)
        if self.kind != "exponential" and (self.anneal or self.lambda_max is not None):
            given = "anneal=True" if self.anneal else f"lambda_max={self.lambda_max!r}"
            raise ValueError(f"{given}: λ is the base of an exponential grading, but recipe "
                             f"{self.name!r} has kind {self.kind!r}; annealing is for "
                             "egt-alg7.1")
        if self.kind == "exponential" and self.lambda_max is not None and not self.anneal:
            # without annealing λ stays the model's base: lambda_max would be read by nothing
            raise ValueError(f"lambda_max={self.lambda_max!r} with anneal=False would have no "
                             f"effect: recipe {self.name!r} anneals λ up to lambda_max only "
                             "with anneal=True, and keeps the model's grading_base otherwise")
        if self.clip_norm is not None:
            check_float("clip_norm (None or false for no clipping)", self.clip_norm, minimum=0,
                        strict_min=True)

    def check(self, model: nn.Module) -> None:
        """Refuses a model whose grading this recipe does not train: an LGT recipe needs linear
        gradings, an EGT recipe exponential ones, and neither runs on an ungraded model."""
        if self.kind is None:
            return
        found = {("exponential" if isinstance(g, ExponentialGrading) else "linear")
                 for g in gradings(model).values()}
        if not found:
            raise ValueError(f"recipe {self.name!r} trains {self.kind} grades but the model has "
                             "no grading; use recipe 'plain' or build a graded model")
        if found != {self.kind}:
            raise ValueError(f"recipe {self.name!r} trains {self.kind} grades but the model's "
                             f"gradings are {sorted(found)}; use the recipe of the model's "
                             "grading (lgt-alg5.1 for linear, egt-alg7.1 for exponential)")

    @property
    def options(self) -> tuple[str, ...]:
        """The options (hyperparameter fields) this recipe reads (:data:`KIND_OPTIONS`)."""
        return KIND_OPTIONS[self.kind]

    def with_options(self, **changes: object) -> Recipe:
        """A copy with some hyperparameters changed (names as the fields). An option the
        recipe does not read (:attr:`options`: ``gamma`` on ``plain``, say) is refused,
        ValueError naming it, its value and the recipe's options: it would have no effect."""
        recipe = replace(self, **changes)  # the values' own checks first
        unused = [f"{key}={value!r}" for key, value in changes.items()
                  if key not in recipe.options]
        if unused:
            raise ValueError(f"recipe {self.name!r} does not use {', '.join(unused)}, which "
                             f"would have no effect; its options are {list(recipe.options)}")
        return recipe

    # -------------------------------------------------------------- optimiser groups
    def param_groups(
        self, model: nn.Module, *, lr: float, weight_decay: float, grade_lr: float | None = None
    ) -> list[dict]:
        groups = param_groups(model, weight_decay, include_grades=False)
        grades = [p for n, p in model.named_parameters()
                  if p.requires_grad and is_grade_parameter(n)]
        if grades:
            groups.append({"params": grades, "weight_decay": 0.0, "name": "grades",
                           "lr": grade_lr if grade_lr is not None else lr})
        return groups

    # -------------------------------------------------------------- loss terms
    def regularization(self, model: nn.Module) -> Tensor:
        learnable = ([g for g in gradings(model).values() if g.learnable]
                     if self.kind is not None else [])
        device = learnable[0].grades.device if learnable else next(model.parameters()).device
        total = torch.zeros((), device=device)
        for g in learnable:
            q = g.grades
            if g.role == "attention":  # a head grading (graded.grading.GradingMap.role)
                if self.gamma_heads:
                    total = total + self.gamma_heads * q.square().sum()
                if self.gamma_coord:
                    total = total + self.gamma_coord * coordination_penalty(q)
            elif self.gamma:
                total = total + self.gamma * q.square().sum()
        return total

    @property
    def uses_graded_loss(self) -> bool:
        """Whether this recipe trains on the graded loss (a graded recipe, ``graded_loss``)."""
        return self.kind is not None and self.graded_loss

    def loss_weights(self, model: nn.Module, grades: Tensor | None) -> Tensor | None:
        """The weights w of the graded loss for the grades q of the loss items
        (:meth:`graded.kinds.TaskKind.loss_grades`): f(q) (LGT) or λ_t^q (EGT) from the
        model's grading now (module docstring), float32 on the grading's device, without
        gradient. None (the plain loss) for a plain recipe, ``graded_loss=False`` or
        ``grades`` None.

        The weights are computed in float32 (or the grading's dtype, if wider), also for a
        float16 or bfloat16 model and under autocast: they weight float32 losses, so neither
        the grades nor λ^q are rounded to the model's dtype, and λ^q is clamped where float32
        needs it (at exp(½ ln max − 1) ≈ 6.8e18, or at the grading's ``max_log_scale``, never
        above ln max), not where a float16 activation would (exp(4.5) ≈ 94)."""
        if not self.uses_graded_loss or grades is None:
            return None
        grading = self._loss_grading(model)
        dtype = torch.promote_types(grading.grades.dtype, torch.float32)
        q = grades.to(device=grading.grades.device, dtype=dtype)
        device = q.device.type
        plain = (torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device)
                 else contextlib.nullcontext())
        with torch.no_grad(), plain:
            return grading.scale_of(q).float()  # q in float32: λ^q capped where float32 is

    def check_loss_grades(self, model: nn.Module, grades: Tensor) -> None:
        """Refuses grades that are not finite (a NaN output grade made every step's loss NaN,
        reported as a learning rate too high) and grades that get a negative loss weight
        (f = identity on a negative grade): a negative weight makes the graded loss unbounded
        below (a host synchronisation)."""
        weights = self.loss_weights(model, grades)
        if weights is None:
            return
        finite = torch.isfinite(grades) if grades.is_floating_point() else None
        if finite is not None and not bool(finite.all()):
            bad = sorted({str(v) for v in grades[~finite].flatten().cpu().tolist()})
            raise ValueError(f"recipe {self.name!r}: the grades of the loss items (the task's "
                             f"output_grades, or token grades) must be finite numbers; got "
                             f"{', '.join(bad)}")
        if bool((weights < 0).any()):
            bad = sorted(set(grades.flatten().cpu()[(weights < 0).flatten().cpu()].tolist()))[:5]
            raise ValueError(f"recipe {self.name!r}: the model's grading gives grades {bad} "
                             "negative loss weights; the graded loss needs w >= 0 (use another "
                             "grading_f, or graded_loss: false)")

    def _loss_grading(self, model: nn.Module) -> GradingMap:
        """The grading whose f or λ_t weights the loss: the feature grading, else any of the
        recipe's kind (all share the config's f, and on_step gives all the same λ_t)."""
        grading = feature_grading(model)
        if grading is None:
            grading = next(iter(gradings(model).values()), None)
        if grading is None:
            raise ValueError(f"recipe {self.name!r} weights the loss by the model's grading, but "
                             "the model has none")
        return grading

    # -------------------------------------------------------------- per step
    def lambda_target(self, model: nn.Module) -> float:
        """λ_max: the recipe's ``lambda_max``, else the model config's ``grading_base``."""
        if self.lambda_max is not None:
            return self.lambda_max
        config = getattr(model, "config", None)
        base = getattr(config, "grading_base", None)
        if base is None:
            raise ValueError(
                f"recipe {self.name!r} anneals lambda but neither the recipe's lambda_max nor a "
                "model.config.grading_base is set"
            )
        return float(base)

    def on_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, total_steps: int
    ) -> dict[str, float]:
        """Prepare optimizer step ``step + 1`` (``step`` steps are done; call with 0 before
        the first): anneal λ and cap the grade learning rate. Returns values to log."""
        return self.start_step(model, optimizer, step, total_steps)()

    def start_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, total_steps: int
    ) -> Callable[[], dict[str, float]]:
        """:meth:`on_step` in two halves, so that a trainer need not wait for a GPU after every
        step. This call does what reads no value (anneals λ, projects EGT's grades onto
        q ≥ 0) and queues the values the bound needs (q_max, a fixed λ) for the host; the
        function it returns reads them, waiting at most for the device to reach this point,
        caps the grade learning rate and returns the values to log (the same on every call).
        Call it before the next optimizer step and before saving the optimizer's state."""
        gs = list(gradings(model).values()) if self.kind is not None else []
        if not gs:
            return lambda: {}
        capped = grade_groups(model, optimizer, recipe=self.name, lr_bound=self.lr_bound)
        lam = None
        queued = []
        with torch.no_grad():
            if self.kind == "exponential":
                exps = [g for g in gs if isinstance(g, ExponentialGrading)]
                if self.anneal:
                    lam = anneal_lambda(step + 1, total_steps, self.lambda_target(model))
                    for g in exps:
                        g.set_base(lam)
                else:
                    queued.append(torch.stack([g.base.double().reshape(()) for g in exps]).max())
                # 000 Def 6.1 needs q >= 0: project learnable grades back after each step
                for g in exps:
                    if g.learnable:
                        g.grades.clamp_(min=0.0)
            # 000 Alg 5.1: q_max is the largest entry of M_q = diag(f(q)) (LGT), not the
            # largest grade; 000 Alg 7.1 bounds by the largest grade (EGT)
            tops = [(g.scales() if self.kind == "linear" else g.grades).detach().max().double()
                    for g in gs]
            queued.insert(0, torch.stack([t.to(tops[0].device) for t in tops]).max())
            values = to_host(torch.stack([t.to(queued[0].device) for t in queued]))
        done: dict[str, float] | None = None

        def finish() -> dict[str, float]:
            nonlocal done
            if done is None:
                read = read_host(values)  # q_max, then a fixed λ
                done = cap_grade_lr(optimizer, capped, kind=self.kind, lr_bound=self.lr_bound,
                                    lr_margin=self.lr_margin, q_max=read[0],
                                    lam=lam if lam is not None else read[1] if len(read) > 1
                                    else None)
            return done

        return finish


#: Grade learning-rate policies: ``paper`` caps η_q below the algorithms' bound; ``off`` leaves
#: the scheduled rate (under Adam the bound, derived for plain gradient steps, can freeze grades).
LR_BOUNDS = ("paper", "off")

RECIPES: dict[str, Recipe] = {
    "plain": Recipe(),
    "lgt-alg5.1": Recipe(name="lgt-alg5.1", kind="linear", gamma=1e-4, gamma_coord=1e-4),
    "egt-alg7.1": Recipe(name="egt-alg7.1", kind="exponential", gamma=1e-4, gamma_heads=1e-4,
                         gamma_coord=1e-4, anneal=True),
}


def get_recipe(name: str, **options: object) -> Recipe:
    """A recipe by name (``plain``, ``lgt-alg5.1``, ``egt-alg7.1``), options overriding its
    hyperparameters (``gamma``, ``gamma_heads``, ``gamma_coord``, ``anneal``, ``lambda_max``,
    ``lr_margin``, ``clip_norm``, ``lr_bound``, ``graded_loss``). Only the options the recipe
    reads are taken (:attr:`Recipe.options`): ``plain`` takes ``clip_norm`` alone, LGT all
    but ``anneal`` and ``lambda_max``; any other is refused (:meth:`Recipe.with_options`)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}")
    recipe = RECIPES[name]
    if recipe.name != name:
        raise ValueError(f"recipe {name!r} in RECIPES is a Recipe named {recipe.name!r}; "
                         f"its key and its name must agree (runs record the name)")
    fields = set(recipe.__dataclass_fields__) - {"name", "kind"}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for recipe {name!r}; allowed: "
                         f"{sorted(fields)}")
    return recipe.with_options(**options) if options else recipe
