"""Graded activations (000 §3.1–3.2) and the safe signed power they and the graded layers share.

- graded ReLU ReLU_i(x_i) = max{0, |x_i|^{1/q_i}} = |x_i|^{1/q_i} (000 §3.1), with
  ReLU(λ⋆x) = |λ|·ReLU(x);
- its thresholding variant max{0, sgn(x_i)|x_i|^{1/q_i}} (000 Remark 3.2), which restores the
  zero output for negative inputs, and the odd variant sgn(x_i)|x_i|^{1/q_i} that keeps the sign;
- the exponential graded activation exp(x_i/q_i) − 1 (000 Eq. 1), computed with ``expm1``.

|x|^p has an infinite slope at x = 0 when p < 1 (that is, q > 1 for the graded ReLU). The powers
here are exact in the forward pass, and for p < 1 their derivative p|x|^{p−1} is capped in
magnitude at ``max_slope`` (default 1e4), so gradients are finite at and near 0; for p ≥ 1 the
slope is bounded near 0 and is left exact (a large slope at a large |x| is the true derivative).
The derivative with respect to the exponent, y·ln|x|, is taken as its limit 0 at x = 0.
float16 and bfloat16 inputs are computed in float32 (the grades and exponents too) and rounded
once to the input's dtype. The switches (``odd``, ``validate``, ``learnable``) take True or False
only (a NumPy bool too), ``TypeError`` otherwise: read truthily, ``validate=0`` would skip the
checks of the grades and ``learnable="no"`` make them learnable.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from graded._precision import at_least_float32
from graded.checks import check_bool
from graded.grading import GradesLike, as_grade_tensor, straight_through_floor
from graded.grading.grades import has_values

__all__ = [
    "DEFAULT_MAX_SLOPE",
    "GradedExp",
    "GradedReLU",
    "graded_exp",
    "graded_relu",
    "signed_power",
]

DEFAULT_MAX_SLOPE = 1e4
RELU_MODES = ("abs", "threshold", "odd")


class _Power(torch.autograd.Function):
    """y = |x|^p (``odd=False``) or sgn(x)|x|^p (``odd=True``), with a capped slope.

    Written with a separate ``setup_context`` and torch operations only, so that the
    ``torch.func`` transforms (grad, vmap, jacrev: per-sample gradients, Jacobians) apply."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, p: Tensor, odd: bool, max_slope: float) -> Tensor:
        # in p's dtype (float32 at least, see signed_power), rounded once to x's
        y = torch.pow(x.abs().to(p.dtype), p)
        return (torch.sign(x) * y if odd else y).to(x.dtype)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: Tensor) -> None:
        x, p, odd, max_slope = inputs
        ctx.save_for_backward(x, p, output)
        ctx.odd, ctx.max_slope = odd, max_slope

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, p, y = ctx.saved_tensors
        grad_x = grad_p = None
        a = x.abs().to(p.dtype)
        if ctx.needs_input_grad[0]:
            slope = p * torch.pow(a, p - 1)
            slope = torch.where(p == 0, torch.zeros_like(slope), slope)
            # only p < 1 has an unbounded slope (at x = 0); for p >= 1 a large slope at a large
            # |x| is the true derivative and stands
            capped = slope.clamp(-ctx.max_slope, ctx.max_slope)
            slope = torch.where(p < 1, capped, slope)
            if not ctx.odd:
                slope = slope * torch.sign(x)
            grad_x = (grad * slope).sum_to_size(x.shape).to(x.dtype)
        if ctx.needs_input_grad[1]:
            pos = a > 0
            log_a = torch.log(torch.where(pos, a, torch.ones_like(a)))
            gy = grad.to(p.dtype) * y.to(p.dtype)
            grad_p = torch.where(pos, gy * log_a, torch.zeros_like(gy)).sum_to_size(p.shape)
        return grad_x, grad_p, None, None


def signed_power(x: Tensor, p: Tensor | float, *, odd: bool = True,
                 max_slope: float = DEFAULT_MAX_SLOPE) -> Tensor:
    """sgn(x)|x|^p (``odd=True``) or |x|^p (``odd=False``), elementwise with broadcasting.

    The forward value is exact (``torch.pow``; p = 1 returns x itself). The derivative in x is
    p|x|^{p−1}, capped at ``max_slope`` in magnitude where p < 1, so it stays finite at 0 (for
    p ≥ 1 it is exact: finite at 0, and not cut off at a large |x|); the derivative in p
    is y·ln|x| (0 at x = 0). This is how the graded layers define w^q for negative w and
    non-integer q (000 §3 leaves it undefined): the odd extension sgn(w)|w|^q.
    ``odd``: True or False only.
    """
    if type(odd) is not bool:  # the bool itself passes on one comparison
        odd = check_bool("signed_power: odd", odd)
    if not float(max_slope) > 0:
        raise ValueError(f"max_slope must be a positive number, got {max_slope!r}")
    if not x.is_floating_point():  # p would be cast to x's integer dtype: 0.5 -> 0
        raise TypeError(f"signed_power needs a floating-point x, got {x.dtype}")
    # p, and the power, in float32 at least: in bfloat16 p = 1/3 is 0.334, which put errors of
    # several eps (5%) in the graded ReLU of ordinary inputs
    p_t = torch.as_tensor(p, dtype=at_least_float32(x.dtype), device=x.device)
    return _Power.apply(x, p_t, odd, float(max_slope))


def _positive_grades(grades: GradesLike, n: int, what: str, like: Tensor,
                     validate: bool) -> Tensor:
    """The grades in the dtype the activations compute in: float32 at least (a bfloat16 or
    float16 x is computed in float32 and rounded once)."""
    work = at_least_float32(like.dtype)
    if not validate and isinstance(grades, Tensor):
        return grades.to(work)
    q = as_grade_tensor(grades, dim=n, dtype=work, device=like.device, allow_heads=False)
    if not torch.compiler.is_compiling():
        _refuse_non_positive(q.detach(), what)
    return q


def _refuse_non_positive(q: Tensor, what: str) -> Tensor:
    """``q`` when every grade is > 0, else a ValueError naming the first that is not."""
    bad = q <= 0
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{what} needs grades q > 0, got {float(q[i])!r} at index {i}")
    return q


def _check_input(x: Tensor) -> None:
    if not isinstance(x, Tensor) or x.ndim == 0:
        raise ValueError("graded activations need a tensor with a feature (last) dimension")
    if not x.is_floating_point():  # the grades are cast to x's dtype: an integer one truncates
        raise TypeError(f"graded activations need a floating-point x, got {x.dtype} "
                        f"(convert it with x.float())")


def graded_relu(x: Tensor, grades: GradesLike, *, mode: str = "abs",
                max_slope: float = DEFAULT_MAX_SLOPE, validate: bool = True) -> Tensor:
    """Graded ReLU over the last dimension (000 §3.1, Remark 3.2); needs grades q > 0.

    ``mode="abs"``: max{0, |x_i|^{1/q_i}} = |x_i|^{1/q_i} (the paper's definition; it is never
    zero for x_i ≠ 0). ``mode="threshold"``: max{0, sgn(x_i)|x_i|^{1/q_i}} (Remark 3.2).
    ``mode="odd"``: sgn(x_i)|x_i|^{1/q_i}. ``abs`` satisfies ReLU(λ⋆x) = |λ|·ReLU(x) for every
    λ ≠ 0, the other two for λ > 0. ``validate=False`` skips the checks on ``grades`` (which
    read their values on the host); the modules use it for grades validated once. ``validate``:
    True or False only.
    """
    if type(validate) is not bool:
        validate = check_bool("graded_relu: validate", validate)
    if mode not in RELU_MODES:
        raise ValueError(f"mode must be one of {RELU_MODES}, got {mode!r}")
    _check_input(x)
    q = _positive_grades(grades, x.shape[-1], "the graded ReLU", x, validate)
    if mode == "abs":
        return signed_power(x, 1.0 / q, odd=False, max_slope=max_slope)
    y = signed_power(x, 1.0 / q, odd=True, max_slope=max_slope)
    return torch.relu(y) if mode == "threshold" else y


def graded_exp(x: Tensor, grades: GradesLike, *, validate: bool = True) -> Tensor:
    """Exponential graded activation exp(x_i/q_i) − 1 (000 §3.2 Eq. 1); needs q > 0.

    ``expm1`` keeps full precision near 0. Large x_i/q_i overflows to inf as exp does.
    ``validate`` as in :func:`graded_relu` (True or False only).
    """
    if type(validate) is not bool:
        validate = check_bool("graded_exp: validate", validate)
    _check_input(x)
    q = _positive_grades(grades, x.shape[-1], "the exponential graded activation", x, validate)
    return torch.expm1(x.to(q.dtype) / q).to(x.dtype)


def register_grades(module: nn.Module, grades: GradesLike, n: int | None, learnable: bool,
                    device: torch.device | str | None, dtype: torch.dtype | None,
                    what: str) -> Tensor:
    """Store ``grades`` (q > 0, one per feature) on ``module`` as the Parameter (``learnable``)
    or buffer ``grades``, on ``device`` and in ``dtype``, and ``learnable`` as
    ``module.learnable_grades``; return the validated values.

    Numbers are validated on the host before the move, so that a module can be built on the
    ``"meta"`` device (whose tensors have no values to check) and materialised later: with
    ``device="meta"`` and inside ``with torch.device("meta")``, where the grades are made on
    that device (validating them there raised "Tensor.item() cannot be called on meta
    tensors"). Grades given as a meta tensor are not checked (they have no values); the
    values returned are those checked (on the host), or the meta tensor.
    ``learnable`` takes True or False only (``TypeError`` naming it otherwise).
    """
    learnable = check_bool("learnable", learnable)
    if n is None and isinstance(grades, (int, float)) and not isinstance(grades, bool):
        raise ValueError(f"{what} got the single grade {grades!r} and no features= to say how "
                         f"many features carry it (or pass one grade per feature)")
    q = as_grade_tensor(grades, dim=n, dtype=dtype, allow_heads=False).detach().clone()
    checked = q
    if not has_values(q) and not isinstance(grades, Tensor):  # made on "meta" by a context
        checked = as_grade_tensor(grades, dim=n, dtype=dtype, device="cpu", allow_heads=False)
    if has_values(checked):
        _refuse_non_positive(checked, what)
    stored = q.to(device) if device is not None else q
    if learnable:
        module.grades = nn.Parameter(stored)
    else:
        module.register_buffer("grades", stored)
    module.learnable_grades = learnable
    module.register_load_state_dict_pre_hook(_check_loaded_grades)
    return checked


def _check_loaded_grades(module: nn.Module, state_dict: dict, prefix: str, *_: object) -> None:
    """Load pre-hook of :func:`register_grades`: loaded grades are checked as the constructor
    checks them (finite, > 0), before they replace the module's (a damaged checkpoint's would
    give non-finite outputs silently)."""
    loaded = state_dict.get(prefix + "grades")
    if isinstance(loaded, Tensor) and loaded.device.type != "meta" and (
            loaded.shape == module.grades.shape):  # another shape: torch's own error
        what = f"{type(module).__name__} (loaded {prefix}grades)"
        _refuse_non_positive(as_grade_tensor(loaded.detach(), dim=loaded.shape[-1],
                                             name=f"loaded {prefix}grades", allow_heads=False),
                             what)


def evaluated_grades(module: nn.Module) -> Tensor:
    """``module.grades`` as the module evaluates them: learnable grades at max(q, min_grade)
    with a straight-through gradient (:func:`graded.grading.straight_through_floor`), fixed
    ones as they are. Learnable means built so (:func:`register_grades`), not ``requires_grad``:
    a trained module frozen with ``requires_grad_(False)`` must compute what it computed.
    """
    q = module.grades
    return straight_through_floor(q, module.min_grade) if module.learnable_grades else q


class _GradedActivation(nn.Module):
    """Grades validated once (q > 0); learnable grades that fall below ``min_grade`` in
    training are evaluated at ``min_grade`` with a straight-through gradient (see
    :mod:`graded.grading`), as 1/q is not finite at q = 0."""

    grades: Tensor
    min_grade = 1e-3

    def __init__(self, grades: GradesLike, learnable: bool, features: int | None, device,
                 dtype) -> None:
        super().__init__()
        register_grades(self, grades, features, learnable, device, dtype, type(self).__name__)


class GradedReLU(_GradedActivation):
    """Module form of :func:`graded_relu` with fixed or learnable grades (a number needs
    ``features``)."""

    def __init__(self, grades: GradesLike, mode: str = "abs", learnable: bool = False, *,
                 features: int | None = None, max_slope: float = DEFAULT_MAX_SLOPE,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        if mode not in RELU_MODES:
            raise ValueError(f"mode must be one of {RELU_MODES}, got {mode!r}")
        if not 0 < float(max_slope) < math.inf:
            raise ValueError(f"GradedReLU needs a finite max_slope > 0, got {max_slope!r}")
        super().__init__(grades, learnable, features, device, dtype)
        self.mode, self.max_slope = mode, max_slope

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 0 or x.shape[-1] != self.grades.shape[0]:
            raise ValueError(f"input has shape {tuple(x.shape)}, expected "
                             f"{self.grades.shape[0]} features in the last dimension")
        return graded_relu(x, evaluated_grades(self), mode=self.mode, max_slope=self.max_slope,
                           validate=False)

    def extra_repr(self) -> str:
        return f"features={self.grades.shape[0]}, mode={self.mode!r}"


class GradedExp(_GradedActivation):
    """Module form of :func:`graded_exp` with fixed or learnable grades (a number needs
    ``features``)."""

    def __init__(self, grades: GradesLike, learnable: bool = False, *,
                 features: int | None = None,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(grades, learnable, features, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 0 or x.shape[-1] != self.grades.shape[0]:
            raise ValueError(f"input has shape {tuple(x.shape)}, expected "
                             f"{self.grades.shape[0]} features in the last dimension")
        return graded_exp(x, evaluated_grades(self), validate=False)

    def extra_repr(self) -> str:
        return f"features={self.grades.shape[0]}"
