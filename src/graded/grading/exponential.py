"""The EGT grading map :class:`ExponentialGrading`, M_{q,λ} = diag(λ^q) (000 Def 6.1,
Prop 6.5; 001 Def 2.3), computed as exp(q·ln λ); its overflow guard and λ = 1 rule are
described in :mod:`graded.grading`."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from graded._precision import at_least_float32, held_precision, widen_loaded
from graded.folding import _autocast_on
from graded.grading.base import GradingMap
from graded.grading.batching import _stack_grades
from graded.grading.grades import GradesLike, _describe_bad, has_values, straight_through_floor

__all__ = ["ExponentialGrading"]


def _finite_exponent(dtype: torch.dtype, rounded_to: torch.dtype | None = None) -> float:
    """The largest exponent e whose exp(e), computed in float32 (or ``dtype``, when wider)
    and rounded to ``dtype``, is finite: ln of the largest finite value of ``dtype``, lowered
    by the relative 8ε of the exponent's precision (some ten units in its last place), since
    ln(max) rounded to float32 (88.7228391 up to 88.7228394) has an exp that is inf in
    float32; exp's own error stays well below that margin. With ``rounded_to``, the dtype
    the scale is rounded to before it is cast to ``dtype`` (bfloat16 grades under a float16
    autocast), the largest value of ``rounded_to`` not above that of ``dtype`` takes its
    place: exp(ln 65504) rounds to 65536 in bfloat16, inf in float16."""
    eps = torch.finfo(at_least_float32(dtype)).eps
    top = torch.finfo(dtype).max
    if rounded_to is not None and rounded_to != dtype:
        top = _largest_not_above(top, rounded_to)
    return math.log(top) * (1.0 - 8.0 * eps)


@functools.cache
def _largest_not_above(top: float, dtype: torch.dtype) -> float:
    """The largest value of ``dtype`` that is at most ``top`` (computed once per pair)."""
    held = torch.tensor(top, dtype=torch.float64).to(dtype)
    if float(held) > top:
        held = torch.nextafter(held, torch.zeros_like(held))
    return min(top, float(held))


# λ is held in float32 at least, whatever the module is cast to (graded._precision)
_HELD = {"base": at_least_float32}


class ExponentialGrading(GradingMap):
    """EGT grading map M_{q,λ} = diag(λ^q), q ≥ 0, λ > 1 (000 Def 6.1, Prop 6.5; 001 Def 2.3).

    Computed as exp(q·ln λ) with the exponent clamped at ``max_log_scale`` (warning on clamp),
    lowered where the compute dtype cannot hold exp of it: every scale is finite.
    The base λ is a buffer (saved in state dicts) that :meth:`set_base` changes at run time, as
    the λ annealing of 000 §7.2 (iii) does every step. ``grades=None`` gives q = 0, M = I.

    λ is held in float32 at least, whatever the module is cast to: the grades follow a cast as
    any parameter does, but in bfloat16 λ = 1.01 would be 1.0078 and the first values of the
    annealing schedule (1 + ε) would all be 1. The scales (:meth:`scales`, :meth:`scales_at`,
    :meth:`inverse_scales`, :func:`graded.grading.stacked_scales`) and :meth:`scale_of` (the
    weights of the graded losses) are computed in float32 at least, ln λ at λ's precision,
    and rounded once to the grades' dtype (q's for :meth:`scale_of`): in bfloat16, ln 2
    rounded to 0.6914, q·ln λ rounded again and its exp rounded a third time made 2^10 come
    out as 1000 and 2^4 as 15.875; in float16 2^3 was 8.0078. A cast
    to float64 (``.double()``) carries λ along; a state dict whose λ is in a narrower dtype
    (saved from a bfloat16 model before λ kept its precision) loads into the float32 buffer.
    """

    base: Tensor

    def __init__(
        self,
        dim: int,
        grades: GradesLike | None = None,
        base: float = 2.0,
        learnable: bool = False,
        *,
        num_heads: int | None = None,
        max_log_scale: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        b = self._check_base(base, allow_one=False)
        self.max_log_scale = max_log_scale  # checked by its property, here and when set later
        super().__init__(dim, grades, learnable, num_heads=num_heads, neutral=0.0,
                         device=device, dtype=dtype)
        self.register_buffer("base", torch.tensor(b, dtype=at_least_float32(self.grades.dtype),
                                                  device=self.grades.device))
        if has_values(self.grades):
            self._check_overflow()

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> ExponentialGrading:
        """``nn.Module._apply`` (``.to``, ``.bfloat16``, ...) with λ kept in float32 at least."""
        with held_precision(self, _HELD):
            super()._apply(fn, recurse)
        return self

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              *args: Any, **kwargs: Any) -> None:
        widen_loaded(state_dict, prefix, _HELD)  # a bfloat16 λ of an older state dict
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @staticmethod
    def _check_base(base: float | Tensor, *, allow_one: bool) -> float:
        try:
            b = float(base)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"base must be a real number, got {base!r}") from exc
        ok = b >= 1.0 if allow_one else b > 1.0
        if not (math.isfinite(b) and ok):
            need = "base >= 1" if allow_one else "base > 1"
            raise ValueError(f"the exponential grading needs {need} (000 Def 6.1), got base={b!r}")
        return b

    def set_base(self, value: float | Tensor) -> None:
        """Set λ in place (λ ≥ 1; λ = 1 is the start of 000 §7.2 (iii) annealing)."""
        b = self._check_base(value, allow_one=True)
        with torch.no_grad():
            self.base.fill_(b)
        if self.base.device.type == "cpu":  # reads the exponents: not on a GPU (as scales())
            self._check_overflow()

    def _validate(self, grades: Tensor) -> None:
        bad = grades < 0
        if not self.learnable and bool(bad.any()):
            raise ValueError(
                f"the exponential grading needs grades q >= 0 (000 Def 6.1), got "
                f"{_describe_bad(grades, bad)}"
            )

    _options = ("max_log_scale",)

    @property
    def max_log_scale(self) -> float | None:
        """The cap on the exponent q·ln λ (None: half the log of the compute dtype's largest
        finite value, minus 1). A cap above the largest exponent whose exp is finite in the
        compute dtype (ln 65504 ≈ 11.09 for float16) is lowered to it there (:meth:`_cap`):
        every scale stays finite. Set later, it is checked as the constructor checks it and
        the scales are computed afresh with it."""
        return self._max_log_scale

    @max_log_scale.setter
    def max_log_scale(self, value: float | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not (value > 0 and math.isfinite(value))):
            raise ValueError(f"max_log_scale must be a positive finite number, got {value!r}")
        self._set_option("max_log_scale", None if value is None else float(value))

    def _compute_dtype(self) -> torch.dtype:
        """The dtype the scales must be finite in: the grades', or the autocast dtype when
        autocast is on and narrower (an fp16 or bf16 forward pass)."""
        dtype = self.grades.dtype
        fast = _autocast_on(self.grades.device.type)
        if fast is not None and torch.finfo(fast).max < torch.finfo(dtype).max:
            dtype = fast
        return dtype

    def _cap(self, dtype: torch.dtype | None = None,
             rounded_to: torch.dtype | None = None) -> float:
        """The largest exponent q·ln λ used, for scales rounded to ``dtype`` (None: the compute
        dtype, :meth:`_compute_dtype`). Without ``max_log_scale``, half the log of the largest
        finite value of ``dtype``, minus 1: exp(cap)² stays finite, so a product of two
        scales does too (the squared grading of the "queries_keys" attention variant). With
        it, the smaller of ``max_log_scale`` and :func:`_finite_exponent` of ``dtype``: a cap
        may exceed the default (the user's choice, where one scale is used alone: the
        "scores" variant, the weights of the graded losses), where a product of two scales
        can overflow, but never the exponent whose exp is not finite in ``dtype`` (exp(20) is
        inf in float16); :meth:`_check_overflow` says when the lower cap clamps.
        ``rounded_to``: the dtype the scales are rounded to, when it is not ``dtype``
        (:func:`_finite_exponent`)."""
        if dtype is None:
            dtype = self._compute_dtype()
        if self.max_log_scale is None:
            return 0.5 * math.log(torch.finfo(dtype).max) - 1.0
        return min(self.max_log_scale, _finite_exponent(dtype, rounded_to))

    def _sources(self) -> tuple[Tensor, ...]:
        return (self.grades, self.base)

    def _log_base(self) -> Tensor:
        """ln λ in the dtype the scales are computed in, float32 at least (the grades' dtype
        when wider), taken at λ's precision; kept while the base and that dtype are
        unchanged."""
        wide = at_least_float32(self.grades.dtype)
        return self._kept_value(("log_base", wide), (self.base,),
                                lambda: torch.log(self.base).to(wide))

    def _exponent(self) -> Tensor:
        """q·ln λ in float32 at least (:meth:`_log_base`), not rounded to the grades' dtype."""
        return self._exponent_of(self.grades, self._log_base())

    def _exponent_of(self, q: Tensor, log_base: Tensor) -> Tensor:
        if self.learnable:
            q = straight_through_floor(q, 0.0)  # exact in any dtype: max(q, 0)
        return q.to(log_base.dtype) * log_base  # the gradient reaches q in its own dtype

    def _batch_signature(self) -> tuple:
        return (*super()._batch_signature(), self.max_log_scale)

    def _batched_scales(self, gradings: Sequence[GradingMap]) -> Tensor:
        q = _stack_grades(gradings)
        log_base = torch.stack([g._log_base() for g in gradings])  # each its own λ
        e = self._exponent_of(q, log_base.reshape((-1,) + (1,) * (q.dim() - 1)))
        if e.device.type == "cpu":
            tops = e.detach().flatten(1).amax(1).tolist()  # one read for all the gradings
            for g, top in zip(gradings, tops, strict=True):
                g._check_overflow(top)
        return self._capped_exp(e, q.dtype)

    def _check_overflow(self, top: float | None = None) -> None:
        """Warn when the largest exponent q·ln λ (``top``, computed here when not given) is
        above the cap, where the scales are clamped; the warning says when the cap is
        ``max_log_scale`` lowered to what the compute dtype holds (:meth:`_cap`)."""
        dtype = self._compute_dtype()
        cap = self._cap(dtype, self.grades.dtype)
        if top is None:
            top = float(self._exponent().detach().max())
        if top > cap:
            asked = self.max_log_scale
            what = (f"max_log_scale={cap:.4g}" if asked is None or asked <= cap else
                    f"max_log_scale={asked:.4g} lowered to {cap:.4g}, the largest exponent "
                    f"whose exp is finite in {dtype}")
            warnings.warn(
                f"exponential grading: q·ln(λ) reaches {top:.4g} (λ={float(self.base):.4g}), "
                f"above {what}; scales are clamped to exp({cap:.4g})",
                RuntimeWarning,
                stacklevel=3,
            )

    def scales(self) -> Tensor:
        """diag(M_{q,λ}) = λ^q = exp(q·ln λ), shape ``grades.shape`` (overflow-guarded),
        computed in float32 at least and rounded once to the grades' dtype."""
        return self._memoized(self._scales)

    def _scales(self) -> Tensor:
        e = self._exponent()
        if e.device.type == "cpu" and not torch.compiler.is_compiling():
            self._check_overflow(float(e.detach().max()))
        return self._capped_exp(e, self.grades.dtype)

    def _capped_exp(self, e: Tensor, dtype: torch.dtype, *, inverse: bool = False) -> Tensor:
        """exp(min(e, cap)) (``inverse``: exp(−min(e, cap))) rounded once to ``dtype``: an
        exponent q·ln λ, computed in float32 at least, to a scale, overflow-guarded
        (:meth:`_cap` of the compute dtype, which ``dtype`` is at least as wide as: exp(cap)
        is finite in it, and under autocast in the autocast dtype too)."""
        e = e.clamp(max=self._cap(rounded_to=dtype))
        return torch.exp(-e if inverse else e).to(dtype)

    def scale_of(self, q: Tensor) -> Tensor:
        """λ^q = exp(q·ln λ) elementwise, in q's dtype (float32 for integer q), clamped at the
        cap of that dtype (:meth:`_cap`; ``max_log_scale`` where set, lowered to what that
        dtype holds), whatever the grades' or the autocast dtype: a float32 q (the graded
        losses' weights) is clamped where float32 overflows, not where a float16 activation
        would. The exponent and its exp are computed in float32 at least and rounded once to
        that dtype: in bfloat16, ln 2 rounded to 0.6914 and q·ln λ rounded again made 2^10
        come out as 1000, three units in the last place from 1024."""
        wide = at_least_float32(q.dtype)
        out = q.dtype if q.is_floating_point() else wide
        e = q.to(wide) * torch.log(self.base.to(wide))  # ln λ in q's precision when wider
        return torch.exp(e.clamp(max=self._cap(out))).to(out)

    def scales_at(self, multiplier: Tensor | None) -> Tensor:
        """diag(M_{s·q,λ}) = λ^{s·q} for each multiplier s ≥ 0: (…) -> (…, dim), clamped as
        :meth:`scales` is but without a warning (:mod:`graded.grading`); None is s = 1."""
        if multiplier is None:
            return self.scales()
        self._check_multiplier(multiplier)
        # s·q·ln λ in float32 at least, rounded once at the end to the dtype that s·q has
        out = torch.promote_types(multiplier.dtype, self.grades.dtype)
        e = self._exponent()
        wide = torch.promote_types(at_least_float32(out), e.dtype)
        # a grade whose q·ln λ overflows (inf) times s = 0 is NaN; λ^{0·q} is 1 (exponent 0)
        product = (multiplier.unsqueeze(-1).to(wide) * e.to(wide)).nan_to_num(nan=0.0)
        return self._capped_exp(product, out)

    def inverse_scales(self) -> Tensor:
        """diag(M_{q,λ}^{-1}) = λ^{-q} (001 Prop 2.4 (1)), consistent with the clamp of scales(),
        computed as they are and rounded once to the grades' dtype."""
        return self._capped_exp(self._exponent(), self.grades.dtype, inverse=True)

    def max_grade(self) -> float:
        self._check_overflow()
        return super().max_grade()

    def max_scale(self) -> float:
        self._check_overflow()
        return super().max_scale()

    def set_grades(self, grades: GradesLike) -> None:
        super().set_grades(grades)
        self._check_overflow()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, base={float(self.base):.4g}"
