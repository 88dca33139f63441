"""The LGT grading map :class:`LinearGrading`, M_q = diag(f(q)) (000 Def 5.1, Lemma 5.5,
Def 5.37 (iv)); rules shared with the exponential map are in :mod:`graded.grading`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from graded._precision import at_least_float32
from graded.grading.base import GradingMap
from graded.grading.batching import _stack_grades
from graded.grading.grades import GradesLike, _describe_bad, straight_through_floor

__all__ = ["LINEAR_FUNCTIONS", "LinearGrading"]

# LinearGrading's f (000 Ex. 5.4/5.38), each with its neutral grade (f(q) = 1): q + 1, |q| + 1,
# softplus(q) (1 at q = log(e − 1)), q. A new f is one entry here; learnable grades under it
# are floored at ``floor`` unless it is listed below.
_FUNCTIONS: dict[str, tuple[Callable[[Tensor], Tensor], float]] = {
    "shift": (lambda q: q + 1.0, 0.0),
    "abs_shift": (lambda q: q.abs() + 1.0, 0.0),
    "softplus": (nn.functional.softplus, math.log(math.expm1(1.0))),
    "identity": (lambda q: q, 1.0),
}
LINEAR_FUNCTIONS = tuple(_FUNCTIONS)
# f ≥ 1 everywhere: no floor; positive but unbounded below 1: floored at the least positive value
_UNFLOORED = ("abs_shift",)
_LEAST_FLOORED = ("softplus",)


def _least_positive(dtype: torch.dtype) -> float:
    """The smallest positive value of the floating ``dtype`` (its least subnormal)."""
    info = torch.finfo(dtype)
    return info.tiny * info.eps


class LinearGrading(GradingMap):
    """LGT grading map M_q = diag(f(q)) (000 Def 5.1, Lemma 5.5; Def 5.37 (iv)).

    ``f`` is one of ``"shift"`` (q + 1, 000 Ex. 5.4/5.38), ``"abs_shift"`` (|q| + 1),
    ``"softplus"`` (log(1 + e^q)) or ``"identity"`` (q itself; requires q > 0).
    ``grades=None`` gives the neutral grading, whose scales are 1 (0 for "shift"/"abs_shift",
    1 for "identity", log(e − 1) for "softplus", where the scale is 1 up to rounding), so a
    model built with it equals its ungraded twin. Learnable grades under "shift" and "identity"
    are floored at ``floor``, those under "softplus" at the least positive value of the scales'
    dtype (straight-through; see :mod:`graded.grading`).
    """

    def __init__(
        self,
        dim: int,
        grades: GradesLike | None = None,
        f: str = "shift",
        learnable: bool = False,
        *,
        num_heads: int | None = None,
        floor: float = 1e-4,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.f = f  # each checked by its property, here and when set later
        self.floor = floor
        super().__init__(dim, grades, learnable, num_heads=num_heads, neutral=_FUNCTIONS[f][1],
                         device=device, dtype=dtype)

    _options = ("f", "floor")

    @property
    def f(self) -> str:
        """The map f, one of :data:`LINEAR_FUNCTIONS`. Set later, it is checked as the
        constructor checks it, fixed grades must give positive scales under it (refused
        otherwise), and the scales are computed afresh."""
        return self._f

    @f.setter
    def f(self, value: str) -> None:
        if value not in LINEAR_FUNCTIONS:
            raise ValueError(f"f must be one of {LINEAR_FUNCTIONS}, got {value!r}")
        self._set_option("f", value)

    @property
    def floor(self) -> float:
        """The floor of learnable grades' scales under "shift" and "identity" (a positive
        finite number); set later, it acts at the next call."""
        return self._floor

    @floor.setter
    def floor(self, value: float) -> None:
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value > 0)):
            raise ValueError(f"floor must be a positive finite number, got {value!r}")
        self._set_option("floor", float(value))

    def _raw_scales(self, q: Tensor) -> Tensor:
        return _FUNCTIONS[self.f][0](q)

    def _validate(self, grades: Tensor) -> None:
        if self.learnable:
            return
        s = self._raw_scales(grades)
        bad = s <= 0
        if bool(bad.any()):
            need = {"identity": "q > 0", "shift": "q > -1",
                    "softplus": f"q for which softplus(q) does not underflow to 0 in "
                                f"{grades.dtype}"}.get(self.f, "q with f(q) > 0")
            raise ValueError(
                f"f={self.f!r} needs {need} so that every scale f(q) is positive; got grades "
                f"{_describe_bad(grades, bad)}"
            )

    def scales(self) -> Tensor:
        """diag(M_q) = f(q), shape ``grades.shape``, computed in float32 at least and rounded
        once to the grades' dtype."""
        return self._memoized(lambda: self.scales_at(None))

    def scale_of(self, q: Tensor) -> Tensor:
        return self._raw_scales(q)

    def scales_at(self, multiplier: Tensor | None) -> Tensor:
        """diag(M_{s·q}) = f(s·q) for each multiplier s: (…) -> (…, dim); None is s = 1.
        s·q and f(s·q) are computed in float32 at least and rounded once, to the dtype s·q
        has: in bfloat16, s·q rounded and then s·q + 1 rounded again gave 1.1·1.3 + 1 (the
        bfloat16 1.1015625·1.296875 + 1) as 2.4375, where it is 2.421875 rounded once. In
        float16 and bfloat16 a scale beyond that dtype's largest finite value (in magnitude)
        is that value: s·q of two float16 numbers can pass it (300·300 + 1 was inf), where
        f(q) of one cannot (|f(q)| ≤ |q| + 1, which rounds to at most the largest value); in
        float32 and wider, computed in that dtype, it is not clamped."""
        if multiplier is None:
            return self._scales_from(self.grades, self.grades.dtype)
        self._check_multiplier(multiplier)
        out = torch.promote_types(multiplier.dtype, self.grades.dtype)
        wide = at_least_float32(out)
        s = self._scales_from(multiplier.unsqueeze(-1).to(wide) * self.grades.to(wide), wide,
                              rounded_to=out)
        if out != wide:  # float16, bfloat16: saturate instead of rounding to ±inf
            big = torch.finfo(out).max
            s = s.clamp(-big, big)
        return s.to(out)

    def _scales_from(self, q: Tensor, dtype: torch.dtype | None = None, *,
                     rounded_to: torch.dtype | None = None) -> Tensor:
        """f(q) (floored for learnable grades), computed in float32 at least and rounded once
        to ``dtype`` (None: q's); the gradient reaches q in its own dtype. f(q) of a q in
        ``dtype`` is finite in it (|f(q)| ≤ |q| + 1). ``rounded_to`` (default ``dtype``) is
        the dtype the caller rounds the scales to in the end: a learnable grade's floor is
        at least its smallest positive value, so that the floored scale does not round to 0."""
        dtype = dtype or q.dtype
        q = q.to(at_least_float32(q.dtype))
        s = self._raw_scales(q)
        if self.learnable and self.f not in _UNFLOORED:  # abs_shift: f(q) >= 1
            # max(f(q), floor) forward, exactly, and f'(q) backward (straight-through); the
            # form q + max(floor − q, f(q) − q) would round floor − q, giving the scale 0
            # (inverse ∞) for q = −3 in bfloat16 and for q = −3000 in float32. The floor is
            # never below the least positive value of the final dtype, which softplus (no
            # floor of its own) needs too: softplus(−30) is 0 in float16, −200 in float32
            least = _least_positive(rounded_to or dtype)
            floor = least if self.f in _LEAST_FLOORED else max(self.floor, least)
            s = straight_through_floor(s, floor)
        return s.to(dtype)

    def _batch_signature(self) -> tuple:
        return (*super()._batch_signature(), self.f, self.floor)

    def _batched_scales(self, gradings: Sequence[GradingMap]) -> Tensor:
        return self._scales_from(_stack_grades(gradings))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, f={self.f!r}"
