"""The Linearly and Exponentially Graded Transformers (LGT, EGT): 000 §5-6, 001 §4.

A graded model is an ordinary model of :mod:`graded.transformer.models` whose stages carry a
grading (``config.grading = "linear"`` or ``"exponential"``):

=================  ========================================================  ================
stage              formula                                                   config switch
=================  ========================================================  ================
input              x' = M x, optionally x'' = x'/max(‖x'‖, ε)  (Def 5.19)     grade_input
positions          Pe' = (1 − α t)·Pe (LGT, Def 5.21), λ^{−α t}·Pe (EGT)      grade_positions
attention          graded scores/queries-keys/values/multi-head (Def 5.22)   grade_attention
feed-forward       M·Fnn(x), optionally normalised  (Def 5.23, 6.15)          grade_ffn
output             z = W_out (M h) + b  (Def 5.23, 6.15)                      grade_output
per-token          M_{q_i}, q_i = s_i·p: input, ffn, output (§6.2)            token_grading
=================  ========================================================  ================

Two more switches act on the input representation: ``grade_input_activation="relu"`` applies
000 Def 5.19's h_i = ReLU(W x''_i + b) (W the input projection of feature models, a map of its
own for token models), and ``grade_position_normalize`` Eq. 48's z'_i = z_i/‖z_i‖ after the
graded positions are added (z_i = h_i + Pe'(t_i)).

One feature grading M = diag(m(q)) over d_model, with grades q, is shared by the input,
feed-forward and output stages (000 uses the same M_q in each definition); every attention
layer has its own grades q_i over head_dim, shared by its heads or one tuple per head
(``grades_per_head``). With neutral grades (q = 0 for EGT and "shift"; f(q) = 1 in general),
α = 0 and no normalisation, each stage multiplies by exactly 1 and the graded model equals its
ungraded twin bit for bit. Normalisation departs from that on purpose (it changes the model).

Where a grading M = diag(m) sits next to a linear map inside the stack, ``config.fold_grading``
(default) folds it into the map's weights (:func:`graded.folding.graded_linear`): the
feed-forward grading into its output layer, (W_2, b_2) ← (diag(m) W_2, m·b_2), the output
grading into the head, W_out ← W_out diag(m), and each attention grading into the projections
(:mod:`graded.attention.graded`). It is the same map, up to rounding, at O(d²) per call instead
of O(B·T·d). Per-token grading and normalisation still act on the activations, after it. The
input grading stays on the activations (see :class:`~graded.transformer.models.InputEmbedding`).

The gradings are made once, from the config, by a :class:`GradingPlan`, and handed to each
stage through its constructor (``InputEmbedding(config, plan=plan)``, ``TransformerStack``,
the blocks, ``AttentionSublayer``, ``FeedForwardSublayer``, the output head). Each grading
carries its ``role`` ("input", "feature", "attention" or "token"); :func:`gradings`,
:func:`feature_gradings`, :func:`head_gradings` and :func:`feature_grading` find them by role.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from graded.attention.graded import (
    PER_HEAD_VARIANTS,
    apply_grading,
    make_grading,
    packed_rows_together,
    rows_together,
)
from graded.checks import check_finite_nonnegative, check_float, check_int, inputs_checked
from graded.folding import FoldedLinears
from graded.grading import (
    GRADINGS,
    ExponentialGrading,
    GradingMap,
    is_diagonal,
    stacked_scales,
)
from graded.grading.base import _stamp
from graded.positional import check_positions, position_start
from graded.transformer.config import TransformerConfig

__all__ = [
    "GRADE_INITS",
    "ROLES",
    "GradedFeatures",
    "GradedPositions",
    "GradingPlan",
    "TokenGrading",
    "feature_grading",
    "feature_gradings",
    "foldable_grading",
    "graded_stage",
    "gradings",
    "head_gradings",
    "held_gradings",
    "hold_plan",
    "normalize_rows",
    "per_token",
    "resolve_plan",
]

# What a grading of a graded model acts on: the raw input features (feature models only), the
# d_model features shared by the input, feed-forward and output stages, or one attention
# layer's head dimension, or the per-token profile p of per-token grading.
ROLES = ("input", "feature", "attention", "token")
# How a new grading's grades start (TransformerConfig.grade_init; see _initial_grades).
GRADE_INITS = ("neutral", "zeros", "constant", "warm_start")


def _initial_grades(config: TransformerConfig, dim: int, heads: int | None) -> Tensor | None:
    """Grades for a new grading from ``config.grade_init``: neutral (M = I), zeros, constant
    c = grade_init_value, or the warm start q_k = c·k of 000 Alg 5.1 / 7.1."""
    init, c = config.grade_init, float(config.grade_init_value)
    shape = (dim,) if heads is None else (heads, dim)
    if init == "neutral":
        return None
    if init == "zeros":
        return torch.zeros(shape)
    if init == "constant":
        return torch.full(shape, c)
    if init == "warm_start":
        q = c * torch.arange(dim, dtype=torch.get_default_dtype())
        return q.expand(shape).clone()
    raise ValueError(
        f"TransformerConfig.grade_init={init!r} is invalid: expected 'neutral', 'zeros', "
        "'constant' or 'warm_start'"
    )


def normalize_rows(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / max(‖x‖₂, ε) over the last axis (000 Def 5.19, Eq. 48)."""
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=eps)


class GradedFeatures(nn.Module):
    """x ↦ M x, then the per-token M_{q_i} (``per_token``), optionally normalised to
    y / max(‖y‖₂, ε) (000 Def 5.19, 5.23, §6.2). ``grading`` None is M = I (a stage graded per
    token only)."""

    def __init__(self, grading: nn.Module | None, normalize: bool = False, eps: float = 1e-6,
                 *, per_token: bool = False) -> None:
        super().__init__()
        self.grading = grading
        self.normalize = normalize
        self.eps = eps
        self.per_token = per_token

    def forward(self, x: Tensor, token_scales: Tensor | None = None, *,
                folded: bool = False) -> Tensor:
        """The stage on ``x``; ``folded``: M is already applied (folded into the linear map
        that made ``x``), only the per-token grading and the normalisation remain."""
        # in x's dtype: a grading (or token profile) held in another dtype than the model
        # must not promote the activations (apply_grading)
        y = x if self.grading is None or folded else apply_grading(self.grading, x)
        if self.per_token:
            if token_scales is None:
                raise ValueError("this stage is graded per token: pass token_grades to the model")
            y = y * token_scales.to(y.dtype)
        return normalize_rows(y, self.eps) if self.normalize else y


class TokenGrading(nn.Module):
    """Per-token grading matrices (000 §6.2, Remark 6.16): token i with grade s_i ≥ 0 (its
    nesting depth, degree, …) has the grading tuple q_i = s_i·p, where p over d_model is the
    grades of ``profile`` (role ``"token"``; a ramp p_k = k/(d−1) at the start, learnable with
    ``learnable_grades``), and M_{q_i} = diag(λ^{q_i}) (EGT) or diag(f(q_i)) (LGT). Unlike a
    fixed grading next to a linear map, this is not a reparametrisation: the same token gets
    different representations at different grades."""

    def __init__(self, profile: GradingMap) -> None:
        super().__init__()
        self.profile = profile

    def forward(self, token_grades: Tensor, batch: int, length: int) -> Tensor:
        """(B, T) grades -> (B, T, d_model) diagonals of M_{q_i}."""
        if not isinstance(token_grades, Tensor):
            raise TypeError(f"token_grades must be a Tensor, got {type(token_grades).__name__}")
        if token_grades.dtype == torch.bool or token_grades.is_complex():
            # a bool mask would be read as the grades 0 and 1
            raise TypeError(f"token_grades must hold real grades (a floating or integer "
                            f"tensor), got dtype {token_grades.dtype}")
        if tuple(token_grades.shape) != (batch, length):
            raise ValueError(f"token_grades has shape {tuple(token_grades.shape)}; expected "
                             f"(batch, length) = ({batch}, {length})")
        s = token_grades.to(self.profile.grades.dtype)
        if not torch.compiler.is_compiling() and not inputs_checked():
            check_finite_nonnegative(s, "token_grades")  # q_i = s_i·p, 000 §6.2
        return self.profile.scales_at(s)


class GradedPositions(nn.Module):
    """Position-graded encodings: (1 − α t)·Pe(t) for LGT (000 Def 5.21, Eq. 47) and
    λ^{−α t}·Pe(t) for EGT (000 §6), with λ the feature grading's base (so it follows λ
    annealing) and t the position the encoding table indexes: t = r + ``start`` for the row r
    (0-based) of the sequence, ``start`` = 1 with the 1-indexed sinusoids of 000 §4.2
    (``positional="sinusoidal1"``, :func:`position_start`), 0 otherwise, so the factor and Pe
    read the same t as Eq. 47 writes them. For LGT the factor must stay positive up to the last
    position: α·(max_len − 1 + start) < 1, checked at construction.

    The factors are computed in float64 (λ^{−α t} as a power, at λ's own precision) and
    rounded once to the dtype asked for: computed in float32 as exp(−α t ln λ), 2^{−100}
    (λ = 2, α = 1, t = 100) came out 7.8885926e-31 for 7.8886091e-31, 35 float32 spacings
    off. For int64 or int32 positions the factors of every position of the table,
    t = ``start`` … ``max_len`` − 1 + ``start``, are kept per dtype and device and taken with
    one index per call, while α, λ's storage and λ's version counter are unchanged (as a fixed
    grading keeps its scales, :meth:`~graded.grading.base.GradingMap._kept_value`:
    ``set_base``, the λ annealing of 000 §7.2 (iii), and ``load_state_dict`` change λ in
    place and are seen, a write through ``.data`` is not). Such positions must lie in
    [0, max_len): checked here outside :func:`graded.checks.checked_inputs` (a model checks
    them at its entry). Positions of another dtype (float ones: a derivative in t) and the
    cases where nothing is kept (λ a parameter or taking a gradient, ``torch.compile``,
    ``torch.inference_mode``) get the factors of the positions given, computed the same way."""

    def __init__(self, kind: str, alpha: float, max_len: int,
                 base_source: ExponentialGrading | None = None, *, start: int = 0) -> None:
        super().__init__()
        if kind not in GRADINGS:
            raise ValueError(f"kind must be one of {GRADINGS}, got {kind!r}")
        alpha = check_float("grade_position_alpha", alpha, minimum=0)
        max_len = check_int("max_len", max_len, minimum=1)
        if check_int("start (the first position)", start) not in (0, 1):
            raise ValueError(f"start must be 0 or 1 (the first position), got {start!r}")
        if kind == "exponential" and base_source is None:
            raise ValueError("EGT graded positions λ^(-α t) need base_source, the exponential "
                             "feature grading whose base λ they use; got None")
        last = max_len - 1 + start
        if kind == "linear" and alpha * last >= 1.0:
            raise ValueError(
                f"LGT positional factor 1 - alpha*t must stay positive up to the last position "
                f"t = {last}: alpha={alpha} with max_len={max_len} gives 1 - alpha*{last} = "
                f"{1 - alpha * last:.4g}; need alpha < {1 / max(last, 1):.4g}"
            )
        self.kind = kind
        self.alpha = alpha
        self.max_len = max_len
        self.start = start
        self.base_source = [base_source]  # a list keeps it out of this module's children

    # the kept factor tables: (dtype, device) -> (what they were computed with, the stamp of
    # λ, λ itself (its storage held, so its address is not reused), the table, its version:
    # a 0-d position takes a view of the table, which its receiver may change in place)
    _tables: dict | None = None

    def __getstate__(self) -> dict[str, Any]:
        """``nn.Module``'s state without the kept tables (see ``GradingMap.__getstate__``: a
        copy's stamps would name addresses its storage does not hold)."""
        state = super().__getstate__()
        state.pop("_tables", None)
        return state

    def _sources(self) -> tuple[Tensor, ...]:
        """The tensors the factors are computed from besides the positions: λ for EGT."""
        return () if self.kind == "linear" else (self.base_source[0].base,)

    def _of(self, t: Tensor, sources: tuple[Tensor, ...]) -> Tensor:
        """The factors at the float64 positions ``t``, in float64."""
        if self.kind == "linear":
            return 1.0 - self.alpha * t
        base = sources[0].to(device=t.device, dtype=torch.float64)
        return torch.pow(base, -self.alpha * t)

    def _table(self, dtype: torch.dtype, device: torch.device) -> Tensor | None:
        """The factors of the positions 0 … max_len − 1 in ``dtype`` on ``device``, kept while
        nothing they are computed from changes; None where none may be kept (:func:`_stamp`)."""
        sources = self._sources()
        stamp = _stamp(sources)
        if stamp is None:
            return None
        made = (self.kind, self.alpha, self.start, self.max_len)
        tables = self._tables
        entry = None if tables is None else tables.get((dtype, device))
        if (entry is not None and entry[0] == made and entry[1] == stamp
                and entry[3]._version == entry[4]):
            return entry[3]
        t = torch.arange(self.start, self.max_len + self.start, dtype=torch.float64,
                         device=device)
        table = self._of(t, sources).to(dtype)
        if tables is None:
            tables = self.__dict__["_tables"] = {}  # a plain attribute, not a buffer
        tables[(dtype, device)] = (made, stamp, tuple(s.detach() for s in sources), table,
                                   table._version)
        return table

    def factors(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """The factor of each position, computed in float64 and rounded once to ``dtype``
        (a position is never rounded: in bfloat16 t = 1001 would be 1000)."""
        if positions.dtype in (torch.int64, torch.int32):
            table = self._table(dtype, positions.device)
            if table is not None:
                check_positions(positions, self.max_len, "GradedPositions")
                return table[positions]
        t = positions.to(torch.float64)
        if self.start:
            t = t + self.start
        return self._of(t, self._sources()).to(dtype)

    def forward(self, pe: Tensor, positions: Tensor) -> Tensor:
        return pe * self.factors(positions, pe.dtype).unsqueeze(-1)


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
        pooled vector, which has no token grade, and applies M alone (its stages are
        :data:`~graded.transformer.config.POOLED_TOKEN_GRADE_STAGES`; a run config refuses
        "output" for it)."""
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


def hold_plan(module: nn.Module, plan: GradingPlan | None, *, register: bool) -> None:
    """Keep ``plan`` as ``module.grading_plan``; the module that owns it (``register``) also
    holds its shared gradings, as ``feature_grading``, for feature inputs ``input_grading``,
    and with per-token grading ``token_profile`` (state-dict keys ``feature_grading.*``,
    ``input_grading.*``, ``token_profile.*``)."""
    module.grading_plan = plan
    if plan is None or not register:
        return
    module.feature_grading = plan.feature
    # the shared feature scales once per forward pass (shared_scales), the learnable head
    # scales together
    module.register_forward_pre_hook(_hold_plan_scales)
    module.register_forward_hook(_release_plan_scales, always_call=True)
    if plan.inputs is not plan.feature:
        module.input_grading = plan.inputs
    if plan.token is not None:
        module.token_profile = plan.token


def _hold_plan_scales(module: nn.Module, args: Any) -> None:
    """Forward pre-hook of a plan's owner: its feature grading's scales are computed once for
    the whole pass (:func:`graded.grading.shared_scales`, here as a pair of hooks), and, in
    an eager pass, the learnable scales of all its attention layers together
    (:func:`graded.grading.stacked_scales`), each layer then reading its own row (a view
    made when it asks), the folds using the stacked tensor, and the folded
    weights of all its layers together (:func:`_hold_folds`): the same values and gradients
    in fewer kernels. ``module.batch_grading = False`` computes them layer by layer."""
    if module.feature_grading._hold_scales():
        module.__dict__["_holds_scales_memo"] = True
    if not module.__dict__.get("batch_grading", True) or torch.compiler.is_compiling():
        return
    heads = module.grading_plan.heads
    stacked = None
    if len(heads) > 1 and all(g._scales_memo is None and g.grades.requires_grad
                              for g in heads):
        stacked = stacked_scales(heads)
        if stacked is not None:
            key = heads[0]._memo_key(heads[0].grades)  # alike gradings: one key for all
            for i, g in enumerate(heads):
                g._hold_given_scales(stacked, i, key=key)
            module.__dict__["_holds_head_scales"] = True
    module.__dict__["_held_folds"] = _hold_folds(
        module.grading_plan, None if stacked is None else (heads, stacked))


def _hold_folds(plan: GradingPlan,
                heads: tuple[list[GradingMap], Tensor] | None = None) -> list[nn.Module]:
    """Give each layer that folds a grading into a linear map a ``_held_fold``: its folded
    weight and bias, computed for all such layers together (:class:`graded.folding.FoldedLinears`:
    the first asked for alone, the others at the next ask): the packed projections of the
    self-attention layers (:meth:`~graded.attention.GradedMultiheadAttention.packs_folded_rows`,
    their row scales built together, :func:`~graded.attention.graded.packed_rows_together`)
    and the output layers of the feed-forward sublayers (``folded_output``). ``heads``: the
    plan's head gradings and their scales stacked (:func:`graded.grading.stacked_scales`),
    when the pass computed them so. Returns the layers given one."""
    attention = [m for m in plan.self_attention if m.packs_folded_rows()]
    outputs = [(m, fold) for m in plan.ffn_sublayers if (fold := m.folded_output()) is not None]
    layers = attention + [m for m, _ in outputs]
    if len(layers) < 2:
        return []
    maps = ([(m.in_proj_weight, m.in_proj_bias) for m in attention]
            + [(lin.weight, lin.bias) for _, (lin, _) in outputs])
    scales = _FoldScales(attention, [g for _, (_, g) in outputs], heads)
    n = len(attention)
    # the previous form (side-by-side timing) folded each kind in a batch of its own
    batches = ([list(range(n)), list(range(n, len(maps)))] if FoldedLinears.previous_form
               else [list(range(len(maps)))])
    held: list[nn.Module] = []
    for group in batches:
        if len(group) < 2:
            continue
        batch = FoldedLinears([maps[i] for i in group],
                              lambda which, group=group: scales([group[j] for j in which]))
        for k, i in enumerate(group):
            layers[i].__dict__["_held_fold"] = functools.partial(batch.fold, k)
            held.append(layers[i])
    return held


class _FoldScales:
    """The row scales of the maps :func:`_hold_folds` folds, asked for by index (the
    attention layers' packed projections, then the feed-forward output layers): the
    attention rows of learnable scales of alike layers in one chain for all layers at the
    first ask (one concatenation; the rest are views), fixed ones (kept by each layer)
    layer by layer, as they are asked for; the output layers' the scales of their grading
    (the shared feature grading's, computed once per pass)."""

    def __init__(self, attention: list[nn.Module], outputs: list[GradingMap],
                 heads: tuple[list[GradingMap], Tensor] | None) -> None:
        self.attention = attention
        self.outputs = outputs
        self.together: list[Tensor] | None = [] if rows_together(attention) else None
        # the attention layers' scales: a slice of the heads' stacked ones when their
        # gradings are consecutive heads (all of an LM's; not a seq2seq decoder's, whose
        # cross-attention heads lie between)
        self.stacked = None
        if heads is not None and self.together is not None:
            where = {id(g): i for i, g in enumerate(heads[0])}
            first = where.get(id(attention[0].grading))
            if first is not None and all(where.get(id(m.grading)) == first + k
                                         for k, m in enumerate(attention)):
                stacked = heads[1]
                self.stacked = (stacked if len(attention) == stacked.shape[0]
                                else stacked[first:first + len(attention)])

    def __call__(self, which: list[int]) -> list[Tensor]:
        n = len(self.attention)
        scales: dict[int, Tensor] = {}  # the output layers share a grading: asked once

        def output(g: GradingMap) -> Tensor:
            if id(g) not in scales:
                scales[id(g)] = g.scales()
            return scales[id(g)]

        return [self._rows(j) if j < n else output(self.outputs[j - n]) for j in which]

    def _rows(self, j: int) -> Tensor:
        if self.together is None:
            return self.attention[j].packed_projection_rows()
        if not self.together:
            self.together = packed_rows_together(self.attention, self.stacked)
        return self.together[j]


def _release_plan_scales(module: nn.Module, args: Any, output: Any) -> None:
    """Forward hook (also on an exception): drop what :func:`_hold_plan_scales` kept."""
    if module.__dict__.pop("_holds_scales_memo", False):
        module.feature_grading._drop_scales()
    if module.__dict__.pop("_holds_head_scales", False):
        for g in module.grading_plan.heads:
            g._drop_scales()
    for m in module.__dict__.pop("_held_folds", ()):
        m.__dict__.pop("_held_fold", None)


def per_token(stage: nn.Module) -> bool:
    """Whether a stage module made by :func:`graded_stage` takes the per-token scales."""
    return isinstance(stage, GradedFeatures) and stage.per_token


def foldable_grading(stage: nn.Module) -> GradingMap | None:
    """The shared grading M of a stage made by :func:`graded_stage` (the grading itself or a
    :class:`GradedFeatures`) when it is diagonal, so that it can be folded into the linear
    map next to the stage; None for the identity, a stage graded per token only, or another
    grading module."""
    grading = stage.grading if isinstance(stage, GradedFeatures) else stage
    return grading if grading is not None and is_diagonal(grading) else None


def graded_stage(plan: GradingPlan | None,
                 stage: Callable[[GradingPlan], nn.Module | None]) -> nn.Module:
    """The module ``stage(plan)`` (e.g. ``GradingPlan.ffn_stage``) gives, or the identity for
    an ungraded model or a stage the config leaves ungraded."""
    module = stage(plan) if plan is not None else None
    return module if module is not None else nn.Identity()


def gradings(model: nn.Module, role: str | None = None) -> dict[str, GradingMap]:
    """Every distinct grading module of a model, by its first qualified name; only those of
    ``role`` (one of :data:`ROLES`) when given."""
    if role is not None and role not in ROLES:
        raise ValueError(f"unknown grading role {role!r}; expected one of {ROLES}")
    held = _HELD.get()
    if held is not None and held[0] is model:
        return {name: m for name, m in held[1].items() if role is None or m.role == role}
    found: dict[str, GradingMap] = {}
    seen: set[int] = set()
    for name, m in model.named_modules():
        if isinstance(m, GradingMap) and id(m) not in seen:
            seen.add(id(m))
            if role is None or m.role == role:
                found[name] = m
    return found


_HELD: contextvars.ContextVar[tuple[nn.Module, dict[str, GradingMap]] | None] = \
    contextvars.ContextVar("held_gradings", default=None)


@contextlib.contextmanager
def held_gradings(model: nn.Module) -> Iterator[dict[str, GradingMap]]:
    """Inside the block, :func:`gradings` of ``model`` (and the functions built on it) answer
    from the gradings found on entry instead of walking the module tree again: a walk costs
    about 150 µs of host time on a 12-layer model, and a graded training step needs three (the
    regularisation, the loss weights, the grade learning-rate bound). For a caller that adds
    or removes no module of ``model`` inside the block, such as the trainer, whose optimizer
    holds the parameters the model was built with. Yields the gradings."""
    found = gradings(model)
    token = _HELD.set((model, found))
    try:
        yield found
    finally:
        _HELD.reset(token)


def head_gradings(model: nn.Module) -> list[GradingMap]:
    """The gradings of attention heads (role ``"attention"``), one per attention layer."""
    return list(gradings(model, "attention").values())


def feature_gradings(model: nn.Module) -> list[GradingMap]:
    """The gradings over features, every grading that is not an attention head's."""
    return [g for g in gradings(model).values() if g.role != "attention"]


def feature_grading(model: nn.Module) -> GradingMap | None:
    """The model's shared d_model grading (role ``"feature"``); None for an ungraded model."""
    found = list(gradings(model, "feature").values())
    if len(found) > 1:
        raise ValueError(f"{type(model).__name__} holds {len(found)} feature gradings; "
                         "expected one (the grading of one GradingPlan)")
    return found[0] if found else None
