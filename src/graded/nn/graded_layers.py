"""Graded neural network layers (000 §3, 001 Def 2.6).

- :class:`GradedLinear`: additive graded neurons y_j = Σ_i w_{j,i}^{q_i} x_i + b_j (000 §3), the
  grade of input coordinate i in the exponent of every weight that reads it.
- :class:`MultiplicativeGradedLinear`: β_j(x) = Π_i (w_{j,i} x_i)^{q_i} + b_j (000 §3).
- :class:`InputGradedLinear`: 001 Def 2.6, σ(W diag(λ^q) x + b).
- :class:`OutputGradedLinear`: 001 Def 2.6 "alternatively", diag(λ'^{q'}) σ(W x + b).

The switches ``bias`` and ``learnable_grades`` of every layer take True or False only
(``TypeError`` naming the argument otherwise).

w^q for w < 0 and non-integer q is not a real number and 000 does not say what to do; here it is
the odd extension sgn(w)|w|^q (:func:`graded.nn.activations.signed_power`), which is exact for
q = 1 (so grades 1 give ``nn.Linear``), continuous, monotone, and has a capped, finite slope at
w = 0. It is used for every grade, integer ones included: for an odd integer q it is the real
power w^q, but for w < 0 and an even q it is −|w|^q where w^q = |w|^q (the real power for
integer grades is :class:`MultiplicativeGradedLinear`'s ``sign_mode="power"``;
:class:`GradedLinear` keeps the monotone extension, under which every real matrix is some W_q).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from graded._precision import at_least_float32
from graded.checks import check_bool
from graded.grading import ExponentialGrading, GradesLike
from graded.nn.activations import (
    DEFAULT_MAX_SLOPE,
    evaluated_grades,
    register_grades,
    signed_power,
)

__all__ = [
    "GradedLinear",
    "InputGradedLinear",
    "MultiplicativeGradedLinear",
    "OutputGradedLinear",
]

SIGN_MODES = ("odd", "abs", "power")


def _identity(x: Tensor) -> Tensor:
    """The identity activation (a named function: a lambda would make the layer unpicklable)."""
    return x


# name -> (function, Lipschitz constant of the function)
_ACTIVATIONS: dict[str, tuple[Callable[[Tensor], Tensor], float]] = {
    "relu": (torch.relu, 1.0),
    "tanh": (torch.tanh, 1.0),
    "sigmoid": (torch.sigmoid, 0.25),
    "gelu": (F.gelu, 1.128905),  # rounded up: max of GELU'(x) = Φ(x) + xφ(x), attained at x = √2
    "identity": (_identity, 1.0),
}


def _check_switches(bias: bool, learnable_grades: bool) -> tuple[bool, bool]:
    """The layers' switches, True or False only (``TypeError`` naming the argument
    otherwise): ``bool("no")`` is True, which would make the grades a Parameter."""
    return check_bool("bias", bias), check_bool("learnable_grades", learnable_grades)


class _LinearBase(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, device, dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = _check_sizes(in_features, out_features)
        ref = nn.Linear(self.in_features, self.out_features, bias=bias, device=device,
                        dtype=dtype)
        self.weight = ref.weight
        self.bias = ref.bias

    def _check_x(self, x: Tensor) -> None:
        _check_features(x, self.in_features)


def _check_sizes(in_features: int, out_features: int) -> tuple[int, int]:
    """The layer's sizes as ints, each a positive integer (a NumPy one too, as ``nn.Linear``
    takes); ``ValueError`` naming the argument otherwise."""
    for name, v in (("in_features", in_features), ("out_features", out_features)):
        if not isinstance(v, Integral) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return int(in_features), int(out_features)


def _check_features(x: Tensor, in_features: int) -> None:
    if x.ndim == 0 or x.shape[-1] != in_features:
        raise ValueError(
            f"input has shape {tuple(x.shape)}; its last dimension must be "
            f"in_features={in_features}"
        )


class GradedLinear(_LinearBase):
    """Additive graded layer x ↦ W_q x + b with (W_q)_{j,i} = sgn(w_{j,i})|w_{j,i}|^{q_i} (000 §3).

    ``grades`` (length ``in_features``, q > 0) are the grades of the input coordinates; they are
    a Parameter when ``learnable_grades``. With b = 0 the layer satisfies
    α_q(λ⋆x; w) = α_q(x; λw) for λ > 0 (000 §3, the identity after the neuron's definition).
    Grades are validated (q > 0) at construction; learnable grades that fall below
    ``min_grade`` during training are evaluated at ``min_grade`` with a straight-through
    gradient (as in :mod:`graded.grading`), since |w|^q with q ≤ 0 is infinite at w = 0.
    """

    grades: Tensor

    def __init__(self, in_features: int, out_features: int, grades: GradesLike = 1.0,
                 bias: bool = True, learnable_grades: bool = False, *,
                 max_slope: float = DEFAULT_MAX_SLOPE, min_grade: float = 1e-3,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        bias, learnable_grades = _check_switches(bias, learnable_grades)
        super().__init__(in_features, out_features, bias, device, dtype)
        register_grades(self, grades, in_features, learnable_grades, device,
                        dtype or self.weight.dtype, "GradedLinear")
        for name, v in (("max_slope", max_slope), ("min_grade", min_grade)):
            if not 0 < float(v) < math.inf:
                raise ValueError(f"GradedLinear needs a finite {name} > 0, got {v!r}")
        self.max_slope, self.min_grade = max_slope, float(min_grade)

    def effective_weight(self) -> Tensor:
        """The matrix [w_{j,i}^{q_i}] (odd extension for negative weights)."""
        q = evaluated_grades(self)  # learnable: q >= min_grade (0^q with q <= 0 is not finite)
        return signed_power(self.weight, q, odd=True, max_slope=self.max_slope)

    def forward(self, x: Tensor) -> Tensor:
        self._check_x(x)
        return F.linear(x, self.effective_weight(), self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, learnable_grades={self.learnable_grades}")


class MultiplicativeGradedLinear(_LinearBase):
    """Multiplicative graded neurons β_j(x) = Π_i (w_{j,i} x_i)^{q_i} + b_j (000 §3).

    Computed in log space: |β_j − b_j| = exp(Σ_i q_i ln|w_{j,i} x_i|), which neither overflows
    nor underflows in the intermediate product. Signs, for a factor u = w_{j,i} x_i:

    - ``sign_mode="odd"`` (default): u^q := sgn(u)|u|^q, so the sign is Π sgn(u_i) (the
      convention of :class:`GradedLinear`; exact for odd integer grades);
    - ``"power"``: the real power sgn(u)^{q}|u|^q, which needs integer grades (fixed ones);
    - ``"abs"``: |u|^q (signs dropped).

    A factor that is exactly 0 makes the product 0, also where the other factors' product is
    beyond the dtype's range. Its gradients are the true derivatives where they exist: with one
    zero factor u_k of grade q_k = 1 (``"odd"``, ``"power"``) the slope in u_k is the product
    of the other factors (saturating at the dtype's largest value); for q_k > 1, or with two
    zero factors, it is 0.
    Where the derivative is infinite (q_k < 1) or absent (|u| in ``"abs"``) it is taken as 0,
    so gradients stay finite. With b = 0 and λ > 0,
    β(λ⋆x) = λ^{Σ q_i²} β(x) (000 §3). Learnable grades that fall below ``min_grade`` in
    training are evaluated at ``min_grade`` with a straight-through gradient, as in
    :class:`GradedLinear`: 0^q with q ≤ 0 is not 0 (the product was 0 at a zero factor while
    it grows without bound next to it).
    """

    grades: Tensor

    def __init__(self, in_features: int, out_features: int, grades: GradesLike = 1.0,
                 bias: bool = True, learnable_grades: bool = False, *, sign_mode: str = "odd",
                 min_grade: float = 1e-3,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        bias, learnable_grades = _check_switches(bias, learnable_grades)
        if sign_mode not in SIGN_MODES:
            raise ValueError(f"sign_mode must be one of {SIGN_MODES}, got {sign_mode!r}")
        if sign_mode == "power" and learnable_grades:
            raise ValueError("sign_mode='power' needs integer grades, which learning would move "
                             "off the integers; use learnable_grades=False or sign_mode='odd'")
        super().__init__(in_features, out_features, bias, device, dtype)
        q = register_grades(self, grades, in_features, learnable_grades, device,
                            dtype or self.weight.dtype, "MultiplicativeGradedLinear")
        if sign_mode == "power" and q.device.type != "meta":  # meta grades: no values
            frac = torch.remainder(q, 1) != 0
            if bool(frac.any()):
                i = int(frac.nonzero()[0, 0])
                raise ValueError(
                    f"sign_mode='power' needs integer grades, got {float(q[i])!r} at index {i}"
                )
        if not 0 < float(min_grade) < math.inf:
            raise ValueError(f"MultiplicativeGradedLinear needs a finite min_grade > 0, got "
                             f"{min_grade!r}")
        self.sign_mode, self.min_grade = sign_mode, float(min_grade)

    def forward(self, x: Tensor) -> Tensor:
        self._check_x(x)
        q = evaluated_grades(self)  # learnable: q >= min_grade (0^q with q <= 0 is not 0)
        u = x.unsqueeze(-2) * self.weight  # (..., out, in)
        zero = u == 0
        a = torch.where(zero, torch.ones_like(u), u).abs()
        # the rounding error of Σ q ln|u| is relative to its size and exp makes it a relative
        # error of the product: in bf16 (unit roundoff 2^-8) up to 2^-8·|Σ q ln|u||, several
        # times the error of the factors; float16/bfloat16 sum their logarithms in float32
        work = at_least_float32(a.dtype)
        log_mag = (q.to(work) * torch.log(a.to(work))).sum(-1)
        n_zero = zero.sum(-1)
        # with a zero factor the product is 0 and the other factors' product only carries a
        # slope: where it overflows it is kept below the dtype's largest value, as ∞·0 made
        # the output NaN (float16: x = (0, 300, 300), grades 1) and exp's backward ∞·0 the
        # gradient NaN; an infinite factor (log_mag = ∞) still gives 0·∞ = NaN
        cap = math.log(torch.finfo(a.dtype).max) - 1e-3
        keep = (n_zero == 0) | torch.isinf(log_mag)
        log_mag = torch.where(keep, log_mag, log_mag.clamp(max=cap))
        mag = torch.exp(log_mag).to(a.dtype)
        if self.sign_mode == "odd":
            neg = (u < 0).sum(-1)
        elif self.sign_mode == "power":
            neg = ((u < 0) * self.grades.detach().round().to(torch.int64)).sum(-1)
        else:
            neg = torch.zeros_like(mag, dtype=torch.int64)
        sign = 1.0 - 2.0 * torch.remainder(neg, 2).to(mag.dtype)
        rest = sign * mag  # the product of the non-zero factors
        if self.sign_mode != "abs":
            # one zero factor u_k of grade 1: the product is rest·u_k, smooth at u_k = 0 with
            # slope rest (q_k > 1: slope 0; q_k < 1: infinite, taken as 0). The term below is 0
            # in value and carries that slope; two or more zero factors have slope 0.
            unit = zero & (self.grades.detach() == 1)
            linear = torch.where(unit, u, torch.zeros_like(u)).sum(-1)
            out = torch.where(n_zero == 0, rest,
                              torch.where(n_zero == 1, rest * linear, torch.zeros_like(mag)))
        else:  # |u| has no derivative at 0; its subgradient 0 is used
            out = torch.where(n_zero == 0, rest, torch.zeros_like(mag))
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, sign_mode={self.sign_mode!r}")


def _activation(activation: str | Callable[[Tensor], Tensor]) -> tuple[Callable, float | None]:
    if callable(activation):
        return activation, None
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(_ACTIVATIONS)} or a callable, "
                         f"got {activation!r}")
    return _ACTIVATIONS[activation]


class _ExponentialGradedLinear(nn.Module):
    _graded_side = "in_features"  # the features the grading scales

    def __init__(self, in_features: int, out_features: int,
                 grades: GradesLike | None, base: float, activation, bias: bool,
                 learnable_grades: bool, device, dtype) -> None:
        super().__init__()
        # checked here, under the names the user passed (ExponentialGrading's is learnable)
        bias, learnable_grades = _check_switches(bias, learnable_grades)
        # checked here: nn.Linear takes 0 features, and ExponentialGrading named a bad size "dim"
        in_features, out_features = _check_sizes(in_features, out_features)
        graded_features = in_features if self._graded_side == "in_features" else out_features
        self.linear = nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.grading = ExponentialGrading(graded_features, grades, base, learnable_grades,
                                          device=device, dtype=dtype or self.linear.weight.dtype)
        if self.grading.grades.ndim != 1:
            # ExponentialGrading reads a 2-d tuple as per-head grades, which the layer has no
            # heads for: its forward failed asking for "heads at axis -3" of the input
            raise ValueError(
                f"{type(self).__name__} takes one grade per feature, grades of shape "
                f"({graded_features},) ({self._graded_side}), got shape "
                f"{tuple(self.grading.grades.shape)}"
            )
        self.activation, self.activation_lipschitz = _activation(activation)
        self.in_features, self.out_features = in_features, out_features

    def lipschitz_bound(self) -> float:
        """L_σ ‖W‖₂ λ^{q_max} (001 Lemma 2.8); needs a named activation (known L_σ)."""
        if self.activation_lipschitz is None:
            raise ValueError("lipschitz_bound needs a named activation with a known constant")
        w = torch.linalg.matrix_norm(self.linear.weight.detach(), ord=2)
        return self.activation_lipschitz * float(w) * self.grading.max_scale()


class InputGradedLinear(_ExponentialGradedLinear):
    """001 Def 2.6: x ↦ σ(W diag(λ^q) x + b), the grading φ_{q,λ} on the layer's input.

    ``grades`` has length ``in_features`` (q ≥ 0; None gives q = 0, a plain layer);
    ``base`` is λ > 1. ``activation`` is one of relu, tanh, sigmoid, gelu, identity or a callable.
    Differs from :class:`GradedLinear` (000), which puts grades in the weights' exponents.
    """

    def __init__(self, in_features: int, out_features: int, grades: GradesLike | None = None,
                 base: float = 2.0, activation: str | Callable[[Tensor], Tensor] = "relu",
                 bias: bool = True, learnable_grades: bool = False, *,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, out_features, grades, base, activation, bias,
                         learnable_grades, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        _check_features(x, self.in_features)
        return self.activation(self.linear(self.grading(x)))


class OutputGradedLinear(_ExponentialGradedLinear):
    """001 Def 2.6 (output form): x ↦ diag(λ'^{q'}) σ(W x + b), grades of length
    ``out_features``. Same arguments as :class:`InputGradedLinear`."""

    _graded_side = "out_features"

    def __init__(self, in_features: int, out_features: int, grades: GradesLike | None = None,
                 base: float = 2.0, activation: str | Callable[[Tensor], Tensor] = "relu",
                 bias: bool = True, learnable_grades: bool = False, *,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, out_features, grades, base, activation, bias,
                         learnable_grades, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        _check_features(x, self.in_features)
        return self.grading(self.activation(self.linear(x)))
