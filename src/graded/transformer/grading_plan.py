"""The grading plan of an LGT/EGT model (000 §5-6): which stages and attention layers a
config grades, and the gradings it makes for them, once (:class:`GradingPlan`).

Each stage method of the plan returns the module of a stage
(:mod:`graded.transformer.graded_stages`) or None where the config leaves it ungraded;
:func:`graded_stage` turns None into the identity, and :func:`resolve_plan` gives a part built on
its own a plan of its own. Every grading made carries its ``role`` (:data:`ROLES`); its grades
start as ``config.grade_init`` says (:data:`GRADE_INIT_ENTRIES`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from graded.attention.graded import PER_HEAD_VARIANTS, make_grading
from graded.grading import ExponentialGrading, GradingMap
from graded.positional import position_start
from graded.transformer.config import TransformerConfig
from graded.transformer.graded_stages import GradedFeatures, GradedPositions, TokenGrading

__all__ = [
    "GRADE_INITS",
    "GRADE_INIT_ENTRIES",
    "ROLES",
    "GradeInit",
    "GradingPlan",
    "graded_stage",
    "resolve_plan",
]

# What a grading of a graded model acts on: the raw input features (feature models only), the
# d_model features shared by the input, feed-forward and output stages, or one attention
# layer's head dimension, or the per-token profile p of per-token grading.
ROLES = ("input", "feature", "attention", "token")


@dataclass(frozen=True)
class GradeInit:
    """One way a new grading's grades start (``TransformerConfig.grade_init``).

    ``grades(shape, c)``: the grades of a grading of ``shape`` ((dim,), or (heads, dim) per
    head) with c = ``grade_init_value``, or None for the grading's neutral grades (M = I).
    ``reads_value``: whether ``grades`` reads c; :class:`TransformerConfig` refuses a
    ``grade_init_value`` set beside an init that does not, as it would change nothing."""

    grades: Callable[[tuple[int, ...], float], Tensor | None]
    reads_value: bool = False


def _warm_start(shape: tuple[int, ...], c: float) -> Tensor:
    """The warm start q_k = c·k along the grading's dimension (000 Alg 5.1 / 7.1), computed in
    float64 and rounded once to the default dtype: each grade is the value of that dtype
    nearest to c·k, as ``constant``'s grade is c's (c·k computed in float32 rounds c first,
    and missed the nearest float32 at 12 of 64 grades for c = 0.1)."""
    q = c * torch.arange(shape[-1], dtype=torch.float64)
    return q.to(torch.get_default_dtype()).expand(shape).clone()


# How a new grading's grades start, by name (TransformerConfig.grade_init): neutral (M = I),
# zeros, the constant c = grade_init_value, or the warm start. One entry adds an init.
GRADE_INIT_ENTRIES: dict[str, GradeInit] = {
    "neutral": GradeInit(lambda shape, c: None),
    "zeros": GradeInit(lambda shape, c: torch.zeros(shape)),
    "constant": GradeInit(lambda shape, c: torch.full(shape, c), reads_value=True),
    "warm_start": GradeInit(_warm_start, reads_value=True),
}
GRADE_INITS = tuple(GRADE_INIT_ENTRIES)


def _initial_grades(config: TransformerConfig, dim: int, heads: int | None) -> Tensor | None:
    """Grades for a new grading from the entry of ``config.grade_init`` in
    :data:`GRADE_INIT_ENTRIES`, with c = ``grade_init_value``."""
    init = config.grade_init
    entry = GRADE_INIT_ENTRIES.get(init)
    if entry is not None:
        return entry.grades((dim,) if heads is None else (heads, dim),
                            float(config.grade_init_value))
    if init not in GRADE_INITS:
        raise ValueError(f"TransformerConfig.grade_init={init!r} is invalid: expected one of "
                         f"{', '.join(map(repr, GRADE_INITS))}")
    # A name added to GRADE_INITS without its entry.
    raise NotImplementedError(
        f"TransformerConfig.grade_init={init!r} is listed in "
        f"graded.transformer.grading_plan.GRADE_INITS but _initial_grades has no construction "
        f"for it; add its GradeInit to GRADE_INIT_ENTRIES in graded/transformer/grading_plan.py")


class GradingPlan:
    """The gradings of one LGT/EGT model, made from its config (000 §5-6).

    ``feature`` is the grading M over d_model shared by the input, feed-forward and output
    stages (one module: 000 uses the same M_q in Defs 5.19, 5.23). ``inputs`` is the grading
    of the input stage: ``feature`` itself for token models; for models over real features a
    grading of its own over ``input_dim``, initialised from ``config.input_grades`` when given
    (a task's natural grades). Each call of :meth:`head_grading` makes a new grading for one
    attention layer. The stage methods return None where the config switches a stage off;
    constructors take them through :func:`graded_stage`, which falls back to the identity.

    The modules that own a plan (the models, and a standalone encoder or decoder) register
    ``feature`` as ``feature_grading`` and a separate ``inputs`` as ``input_grading``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        if config.grading is None:
            raise ValueError("GradingPlan needs a graded config: TransformerConfig.grading is "
                             "None; expected 'linear' or 'exponential'")
        self.config = config
        self.feature = self._grading(config.d_model, "feature")
        if config.vocab_size is None:
            grades = None if config.input_grades is None else torch.tensor(config.input_grades)
            self.inputs = self._grading(config.input_dim, "input", grades=grades)
        else:
            self.inputs = self.feature
        self.heads: list[GradingMap] = []
        # the self-attention layers and feed-forward sublayers built with this plan, in model
        # order: where a grading may be folded into a linear map (the owner folds them
        # together, _hold_folds)
        self.self_attention: list[nn.Module] = []
        self.ffn_sublayers: list[nn.Module] = []
        self.token: GradingMap | None = None
        if config.token_grading:
            d = config.d_model
            ramp = torch.arange(d, dtype=torch.float64) / max(d - 1, 1)
            self.token = self._grading(d, "token", grades=ramp.to(torch.get_default_dtype()))

    def token_stage(self, stage: str) -> bool:
        """Whether per-token grading acts at ``stage`` (input, ffn or output)."""
        return self.token is not None and stage in self.config.token_grade_stages

    @classmethod
    def from_config(cls, config: TransformerConfig) -> GradingPlan | None:
        """The plan of a graded config; None for an ungraded one (``grading=None``)."""
        return None if config.grading is None else cls(config)

    def _grading(self, dim: int, role: str, *, heads: int | None = None,
                 grades: Tensor | None = None) -> GradingMap:
        c = self.config
        grading = make_grading(
            c.grading, dim, grades if grades is not None else _initial_grades(c, dim, heads),
            base=c.grading_base, f=c.grading_f, learnable=c.learnable_grades, num_heads=heads,
        )
        grading.role = role
        return grading

    def input_stage(self) -> GradedFeatures | None:
        """x' = M x, normalised with ``grade_normalize`` (000 Def 5.19); for token inputs also
        the per-token M_{q_i} (before the normalisation, 000 §6.2)."""
        c = self.config
        per_token = self.token_stage("input") and c.vocab_size is not None
        if not (c.grade_input or per_token):
            return None
        return GradedFeatures(self.inputs if c.grade_input else None, c.grade_normalize,
                              per_token=per_token)

    def projected_input_stage(self) -> GradedFeatures | None:
        """The per-token M_{q_i} of a model over real features, on the projected embedding
        (the input grading itself acts on the raw features, before the projection)."""
        if self.config.vocab_size is not None or not self.token_stage("input"):
            return None
        return GradedFeatures(None, per_token=True)

    def position_stage(self) -> GradedPositions | None:
        """(1 − α t)·Pe or λ^{−α t}·Pe (000 Def 5.21, §6); None when α = 0."""
        c = self.config
        if not (c.grade_positions and c.grade_position_alpha > 0):
            return None
        base = self.feature if isinstance(self.feature, ExponentialGrading) else None
        return GradedPositions(c.grading, c.grade_position_alpha, c.max_len, base,
                               start=position_start(c.positional))

    def head_grading(self) -> GradingMap | None:
        """A new grading over head_dim for one attention layer (000 Def 5.22), one grade
        tuple per head with ``grades_per_head`` or a per-head variant."""
        c = self.config
        if not c.grade_attention:
            return None
        per_head = c.grades_per_head or c.grade_attention_variant in PER_HEAD_VARIANTS
        grading = self._grading(c.head_dim, "attention", heads=c.n_heads if per_head else None)
        self.heads.append(grading)
        return grading

    def ffn_stage(self) -> GradedFeatures | None:
        """M·Fnn(x), then the per-token M_{q_i}, normalised with ``grade_normalize`` (000 Def
        5.23, 6.15, Remark 6.16)."""
        c = self.config
        per_token = self.token_stage("ffn")
        if not (c.grade_ffn or per_token):
            return None
        return GradedFeatures(self.feature if c.grade_ffn else None, c.grade_normalize,
                              per_token=per_token)

    def output_stage(self) -> nn.Module | None:
        """M of the graded output z = W_out (M h) + b (000 Def 5.23, 6.15), the feature
        grading itself; with per-token grading at the output also M_{q_i} (Remark 6.16), as a
        :class:`GradedFeatures`. Never normalised. M_{q_i} needs the output's tokens: the LM's
        and the seq2seq decoder's heads get their token scales; a classifier's head gets one
        pooled vector, which has no token grade, and applies M alone
        (``TransformerClassifier.UNAPPLIED_TOKEN_STAGES``; a run config refuses "output" for
        it)."""
        c = self.config
        if not self.token_stage("output"):
            return self.feature if c.grade_output else None
        return GradedFeatures(self.feature if c.grade_output else None, per_token=True)

    def token_grading(self) -> TokenGrading | None:
        """The module that turns token grades into M_{q_i} (None without per-token grading)."""
        return None if self.token is None else TokenGrading(self.token)

    def built(self) -> list[GradingMap]:
        """Every grading this plan made: feature, a separate input grading, the per-token
        profile, then the heads."""
        own = [self.feature] if self.inputs is self.feature else [self.feature, self.inputs]
        return own + ([self.token] if self.token is not None else []) + self.heads


def resolve_plan(config: TransformerConfig, plan: GradingPlan | None) -> GradingPlan | None:
    """``plan`` when a model hands one down, else a new plan for a part built on its own
    from a graded config (None for an ungraded config)."""
    return plan if plan is not None else GradingPlan.from_config(config)


def graded_stage(plan: GradingPlan | None,
                 stage: Callable[[GradingPlan], nn.Module | None]) -> nn.Module:
    """The module ``stage(plan)`` (e.g. ``GradingPlan.ffn_stage``) gives, or the identity for
    an ungraded model or a stage the config leaves ungraded."""
    module = stage(plan) if plan is not None else None
    return module if module is not None else nn.Identity()
