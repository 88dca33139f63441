"""The modules of the graded stages of an LGT/EGT model (000 §5-6; the table of
:mod:`graded.transformer.graded`): the feature grading x ↦ M x of the input, feed-forward and
output stages with its per-token and normalised forms (:class:`GradedFeatures`,
:func:`normalize_rows`), the per-token grading matrices M_{q_i} (:class:`TokenGrading`), the
graded positional encodings (:class:`GradedPositions`), and what the layers next to a stage
ask of it (:func:`per_token`, :func:`foldable_grading`). A
:class:`~graded.transformer.grading_plan.GradingPlan` makes them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from graded.attention.graded import apply_grading
from graded.checks import check_finite_nonnegative, check_float, check_int, inputs_checked
from graded.grading import GRADINGS, ExponentialGrading, GradingMap, is_diagonal
from graded.grading.base import _stamp
from graded.positional import check_positions

__all__ = [
    "GradedFeatures",
    "GradedPositions",
    "TokenGrading",
    "foldable_grading",
    "normalize_rows",
    "per_token",
]


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
