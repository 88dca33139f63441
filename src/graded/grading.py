"""Grading maps: the diagonal feature scalings of the linearly and exponentially graded models.

- :class:`LinearGrading` is the LGT map M_q = diag(f(q)) (000 Def 5.1, Lemma 5.5, Def 5.37 iv).
- :class:`ExponentialGrading` is the EGT map M_{q,λ} = diag(λ^q) (000 Def 6.1, Prop 6.5;
  001 Def 2.3, where it is called φ_{q,λ}), computed as exp(q·ln λ).

Both hold grades of shape ``(dim,)`` (one grade per feature) or ``(num_heads, dim)`` (one grade
tuple per attention head, 000 Def 5.22 (3)), fixed (a buffer) or learnable (a Parameter).

Rules where the papers are silent (documented once here, tested in ``tests/test_grading.py``):

- *Floors for learnable grades.* Fixed grades are validated once: ``f(q) > 0`` for the linear map,
  ``q >= 0`` for the exponential map. Learnable grades can leave that domain during training, so
  ``scales()`` evaluates them at a floor instead: ``max(f(q), floor)`` for ``f`` in
  {"shift", "identity"} (the two ``f`` that can reach zero) and ``max(q, 0)`` for the
  exponential map. The clamp is straight-through: the forward value is clamped but the gradient
  passes as if unclamped, so the loss can pull a grade back into the domain (a plain clamp would
  freeze it there for good).
- *Overflow guard (exponential).* The exponent q·ln λ is clamped at ``max_log_scale`` (default:
  half the log of the dtype's largest finite value, minus 1, so that even the squared grading
  of the "queries_keys" attention variant stays finite). A clamp emits a ``RuntimeWarning``.
  The check that warns needs the exponent's value on the host; it runs at construction, in
  ``set_grades``, ``max_grade``/``max_scale``, and, for tensors on the CPU, in ``set_base``
  (which annealing calls every step) and in ``scales()`` each time it computes them (fixed
  grades: once per change of grades, base or compute dtype).
  On an accelerator ``scales()`` clamps without synchronising, so it never returns inf or NaN.
  ``scales_at`` (the per-token grades s·q, :class:`graded.transformer.graded.TokenGrading`)
  clamps the same way without the check: a clamp there does not warn.
- *Fixed grades are computed once.* ``scales()`` of a grading with fixed grades is kept and
  returned again until the grades, the base or the autocast dtype change (seen through the
  tensors' version counters: ``set_grades``, ``set_base``, ``load_state_dict``, any in-place
  operation; writing through ``.data`` is not seen). Learnable grades are computed afresh each
  call, once per forward pass of a model.
- *λ = 1.* The constructor requires λ > 1 (000 Def 6.1). ``set_base`` also accepts λ = 1 because
  the annealing schedule λ_t = 1 + (λ_max − 1)t/T of 000 §7.2 (iii) starts there (M = I).

A diagonal grading next to a linear map is folded into the map's weights by the graded models
(:mod:`graded.folding`); :func:`is_diagonal` says which gradings can be, and
:func:`graded.folding.activation_grading` (importable from here too) switches folding off for a
while.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from graded.checks import check_float, check_int

# activation_grading is re-exported: user code has it from here (docs/models.md before folding.py)
from graded.folding import _autocast_on, activation_grading

__all__ = [
    "GRADINGS",
    "LINEAR_FUNCTIONS",
    "ExponentialGrading",
    "GradesLike",
    "GradingMap",
    "LinearGrading",
    "activation_grading",
    "as_grade_tensor",
    "batched_scales",
    "is_diagonal",
    "shared_scales",
    "stacked_scales",
    "straight_through_floor",
]

GradesLike = Tensor | Sequence[float] | Sequence[Sequence[float]] | float | int

_G = TypeVar("_G", bound="GradingMap")
# The grading kinds: LinearGrading (LGT, 000 §5) and ExponentialGrading (EGT, 000 §6).
GRADINGS = ("linear", "exponential")
# LinearGrading's f (000 Ex. 5.4/5.38): q + 1, |q| + 1, softplus(q), q.
LINEAR_FUNCTIONS = ("shift", "abs_shift", "softplus", "identity")
# softplus(q) == 1 at q = log(e - 1): the neutral grade of the softplus map.
_SOFTPLUS_NEUTRAL = math.log(math.expm1(1.0))


def _describe_bad(values: Tensor, bad: Tensor) -> str:
    idx = bad.nonzero()[:5].tolist()
    vals = values[bad][:5].tolist()
    shown = ", ".join(
        f"{v!r} at index {tuple(i) if len(i) > 1 else i[0]}" for v, i in zip(vals, idx)
    )
    more = "" if int(bad.sum()) <= 5 else f" (and {int(bad.sum()) - 5} more)"
    return shown + more


def as_grade_tensor(
    grades: GradesLike,
    *,
    dim: int | None = None,
    name: str = "grades",
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    allow_heads: bool = True,
) -> Tensor:
    """Convert ``grades`` to a floating tensor and validate it.

    Checks: floating or numeric input, shape ``(dim,)`` (or ``(num_heads, dim)`` when
    ``allow_heads``), finite values. Errors name the offending value and what was expected.
    The result keeps autograd history when ``grades`` is a tensor.
    """
    if isinstance(grades, Tensor):
        t = grades
        if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"{name} must be a real tensor, got dtype {t.dtype}")
        if not t.is_floating_point():
            t = t.to(dtype or torch.get_default_dtype())
        if dtype is not None or device is not None:
            t = t.to(dtype=dtype or t.dtype, device=device)
    elif isinstance(grades, (int, float)) and not isinstance(grades, bool):
        if dim is None:
            raise ValueError(f"a scalar {name}={grades!r} needs dim to fix its length")
        t = torch.full((dim,), float(grades), dtype=dtype or torch.get_default_dtype(),
                       device=device)
    else:
        try:
            t = torch.tensor(grades, dtype=dtype or torch.get_default_dtype(), device=device)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{name} must be a tensor or a sequence of numbers, got {grades!r}"
            ) from exc
    max_ndim = 2 if allow_heads else 1
    if t.ndim < 1 or t.ndim > max_ndim:
        expected = "(dim,) or (num_heads, dim)" if allow_heads else "(dim,)"
        raise ValueError(f"{name} must have shape {expected}, got shape {tuple(t.shape)}")
    if dim is not None and t.shape[-1] != dim:
        raise ValueError(
            f"{name} has length {t.shape[-1]} in its last dimension but dim={dim}: "
            f"one grade per feature is expected"
        )
    bad = ~torch.isfinite(t.detach())
    if bool(bad.any()):
        raise ValueError(f"{name} must be finite, got {_describe_bad(t.detach(), bad)}")
    return t


def straight_through_floor(x: Tensor, floor: float) -> Tensor:
    """max(x, floor) in the forward pass, the identity in the backward pass:
    x − min(x − floor, 0), the second term a constant (two operators at floor 0, three
    otherwise)."""
    below = x.detach() if floor == 0 else x.detach() - floor
    return x - below.clamp(max=0.0)


def batched_scales(gradings: Sequence[GradingMap]) -> list[Tensor] | None:
    """``[g.scales() for g in gradings]`` computed together: the grades stacked, one chain of
    operators for all (the same values and gradients), views of the result returned; None
    when the gradings are not alike (kind, learnability, settings, the grades' shape, dtype
    and device; EGT's bases may differ). A model's attention layers each hold a grading of
    their own: an eager forward pass computes all their scales this way, a few kernels
    instead of a few per layer (:mod:`graded.transformer.graded`)."""
    stacked = stacked_scales(gradings)
    return None if stacked is None else list(stacked.unbind(0))


def stacked_scales(gradings: Sequence[GradingMap]) -> Tensor | None:
    """:func:`batched_scales` as one tensor, the gradings' scales on its first axis (None
    when they are not alike)."""
    if not gradings:
        return None
    signature = gradings[0]._batch_signature()
    if any(g._batch_signature() != signature for g in gradings):
        return None
    return gradings[0]._batched_scales(gradings)


@contextlib.contextmanager
def shared_scales(grading: GradingMap) -> Iterator[GradingMap]:
    """Inside the block, ``grading.scales()`` is computed once per grad mode and autocast dtype
    and the same tensor is returned to every later call: for a grading used at several stages
    of one forward pass (the feature grading of the input, every feed-forward and the output
    stage, 000 Defs 5.19, 5.23), one computation instead of one per stage, with the gradients
    of all uses summed into it as before. The models hold it for the length of their
    ``forward``. Grades must not change inside the block. Nested blocks use the outer one's
    values; under ``torch.compile`` nothing is kept (the compiler shares the computation)."""
    held = grading._hold_scales()
    try:
        yield grading
    finally:
        if held:
            grading._drop_scales()


def is_diagonal(grading: nn.Module) -> bool:
    """Whether ``grading`` is x ↦ x·scales(), a :class:`GradingMap` with the base class's
    forward: only such a grading can be folded into a neighbouring linear map."""
    return isinstance(grading, GradingMap) and type(grading).forward is GradingMap.forward


def _stamp(sources: Sequence[Tensor]) -> tuple | None:
    """What identifies the values of ``sources`` while their storage is held (address,
    version counter, view shape of each), or None where values derived from them must not be
    kept: under the compiler, when one is a parameter or takes a gradient, or is an inference
    tensor (no version counter), or under ``torch.inference_mode`` (what it computes is an
    inference tensor, which a later pass with autograd could not save for its backward). See
    :meth:`GradingMap._kept_value`."""
    if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
        return None
    for t in sources:
        if t.requires_grad or t.is_inference() or _is_parameter(t):
            return None
    return tuple((t.data_ptr(), t._version, t.shape) for t in sources)


def _is_parameter(t: Tensor) -> bool:
    """``isinstance(t, nn.Parameter)``, without the metaclass's Python check for a plain
    tensor (a buffer) that is not flagged as one."""
    if type(t) is Tensor and not getattr(t, "_is_param", False):
        return False
    return isinstance(t, nn.Parameter)


class GradingMap(nn.Module):
    """Base class of the grading maps: grades storage, validation, forward, initialisers.

    ``role`` says what the grading acts on inside a model: ``"input"`` (raw input features),
    ``"feature"`` (the d_model features, shared by the input, feed-forward and output stages)
    or ``"attention"`` (one layer's head dimension). The graded models and graded attention
    set it (see :class:`graded.transformer.graded.GradingPlan`); a grading used on its own
    keeps None.
    """

    grades: Tensor
    role: str | None = None

    def __init__(
        self,
        dim: int,
        grades: GradesLike | None,
        learnable: bool,
        *,
        num_heads: int | None,
        neutral: float,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            hint = ("; the grades go second: (dim, grades)"
                    if isinstance(dim, (list, tuple, Tensor)) else "")
            raise ValueError(f"dim must be a positive int, got {dim!r}{hint}")
        if num_heads is not None and (not isinstance(num_heads, int)
                                      or isinstance(num_heads, bool) or num_heads < 1):
            raise ValueError(f"num_heads must be a positive int or None, got {num_heads!r}")
        if dtype is None and isinstance(grades, Tensor) and grades.is_floating_point():
            dtype = grades.dtype
        if grades is None:
            grades = float(neutral)
        if isinstance(grades, (int, float)) and not isinstance(grades, bool):
            shape = (dim,) if num_heads is None else (num_heads, dim)
            grades = check_float("grades (one value for every feature)", grades)
            t = torch.full(shape, grades, dtype=dtype or torch.get_default_dtype(),
                           device=device)
        else:
            t = as_grade_tensor(grades, dim=dim, dtype=dtype, device=device).detach().clone()
        if num_heads is not None and (t.ndim != 2 or t.shape[0] != num_heads):
            raise ValueError(
                f"grades of shape {tuple(t.shape)} do not match num_heads={num_heads}: "
                f"expected shape ({num_heads}, {dim})"
            )
        self.dim = dim
        self.learnable = bool(learnable)
        self.neutral = float(neutral)  # the grade whose scale is 1 (M = I)
        self._validate(t)
        if self.learnable:
            self.grades = nn.Parameter(t)
        else:
            self.register_buffer("grades", t)

    # -- scales shared within one forward pass (see shared_scales) -------------------------
    _scales_memo: dict | None = None

    def _memo_key(self, grades: Tensor) -> tuple:
        fast = _autocast_on(grades.device.type)
        return (torch.is_grad_enabled(), fast is not None, fast)

    def _hold_scales(self) -> bool:
        """Start keeping :meth:`scales` (:func:`shared_scales`); False, and nothing done, when
        they are kept already or under the compiler."""
        if self._scales_memo is not None or torch.compiler.is_compiling():
            return False
        self.__dict__["_scales_memo"] = {}  # a plain attribute: not nn.Module's __setattr__
        return True

    def _drop_scales(self) -> None:
        self.__dict__["_scales_memo"] = None

    def _hold_given_scales(self, value: Tensor, index: int | None = None, *,
                           key: tuple | None = None) -> bool:
        """:meth:`_hold_scales` with ``value`` as the scales of the current grad mode and
        autocast dtype (``key``: :meth:`_memo_key`, computed when not given), or with
        ``index``, ``value[index]`` (:func:`stacked_scales`), taken at the first call of
        :meth:`scales` (none where no call comes); False, and nothing done, as there."""
        if not self._hold_scales():
            return False
        self._scales_memo[key or self._memo_key(self.grades)] = (
            value if index is None else (value, index))
        return True

    def _batch_signature(self) -> tuple:
        """What gradings must share for :func:`batched_scales` to compute them together."""
        g = self.grades
        return (type(self), self.learnable, g.shape, g.dtype, g.device)

    def _batched_scales(self, gradings: Sequence[GradingMap]) -> Tensor:
        """The scales of ``gradings`` (alike, this one among them) stacked on a new first
        axis; see :func:`batched_scales`."""
        raise NotImplementedError

    def _memoized(self, compute: Any) -> Tensor:
        """``compute()``, computed once per grad mode and autocast dtype while
        :func:`shared_scales` is active for this grading, and kept across calls while nothing
        it is computed from changes when the grades are fixed (:meth:`_kept_value`)."""
        memo = self._scales_memo
        key = self._memo_key(self.grades)
        if memo is not None and key in memo:
            value = memo[key]
            if type(value) is tuple:  # (stacked, index): a row of stacked_scales, taken now
                value = memo[key] = value[0][value[1]]
            return value
        value = self._kept_value(("scales", *key), self._sources(), compute)
        if memo is not None:
            memo[key] = value
        return value

    # -- values kept while their sources are unchanged ---------------------------------------
    _kept: dict | None = None

    def _sources(self) -> tuple[Tensor, ...]:
        """The tensors the scales are computed from."""
        return (self.grades,)

    def _kept_value(self, key: tuple, sources: tuple[Tensor, ...], compute: Any) -> Tensor:
        """``compute()``, kept under ``key`` and returned again until one of ``sources``
        changes, when no source is a parameter: fixed grades (and EGT's base, a buffer
        too) cost nothing per forward pass. Learnable grades are computed afresh each call:
        a kept tensor must not carry a graph across passes, and parameters are what code
        perturbs through ``.data`` (finite differences), which no version counter sees.
        Nothing is kept under the compiler, when a source takes a gradient (grades passed to
        ``torch.func.functional_call``) or is an inference tensor (made under
        ``torch.inference_mode``: no version counter), nor under ``torch.inference_mode``
        (the value would be an inference tensor, which a later pass with autograd could not
        save for its backward). A change is seen through the sources'
        version counters (every in-place operation: ``set_grades``, ``set_base``,
        ``load_state_dict``) and their storage (``.to``, a new tensor); the kept entry holds
        the storage, so its address is not reused meanwhile. Writing a buffer through
        ``.data`` is not seen: change grades with ``set_grades``, the base with
        ``set_base``."""
        stamp = _stamp(sources)
        if stamp is None:
            return compute()
        kept = self._kept
        entry = None if kept is None else kept.get(key)
        if entry is not None and entry[0] == stamp:
            return entry[2]
        value = compute()
        if kept is None:
            kept = self._kept = {}
        kept[key] = (stamp, tuple(t.detach() for t in sources), value)
        return value

    # -- to be provided by subclasses -------------------------------------------------------
    def _validate(self, grades: Tensor) -> None:
        raise NotImplementedError

    def scales(self) -> Tensor:
        """The diagonal of the grading matrix, shape ``grades.shape``."""
        raise NotImplementedError

    def scale_of(self, q: Tensor) -> Tensor:
        """The scale m(q) this grading gives a grade q, elementwise: f(q) (LGT) or λ^q (EGT);
        the weights of the graded losses (000 Def 5.37, 7.1)."""
        raise NotImplementedError

    def scales_at(self, multiplier: Tensor | None) -> Tensor:
        """The diagonals of the grading matrices of the grades s·q, one per multiplier s:
        (…) -> (…, dim) (per-token grading, :class:`graded.transformer.graded.TokenGrading`);
        None gives :meth:`scales`."""
        raise NotImplementedError

    def inverse_scales(self) -> Tensor:
        """The diagonal of the inverse grading matrix, shape ``grades.shape``."""
        return 1.0 / self.scales()

    # -- shared ------------------------------------------------------------------------------
    @property
    def num_heads(self) -> int | None:
        """Number of per-head grade tuples, or None for one shared tuple."""
        return self.grades.shape[0] if self.grades.ndim == 2 else None

    def set_grades(self, grades: GradesLike) -> None:
        """Overwrite the grades in place (same shape), validating them as the constructor does."""
        t = as_grade_tensor(grades, dim=self.dim).to(self.grades)
        if t.shape != self.grades.shape:
            raise ValueError(
                f"new grades have shape {tuple(t.shape)}, expected {tuple(self.grades.shape)}"
            )
        self._validate(t.detach())
        with torch.no_grad():
            self.grades.copy_(t)

    def max_grade(self) -> float:
        """The largest grade q_max, read from the current grades (a host synchronisation)."""
        return float(self.grades.detach().max())

    def max_scale(self) -> float:
        """The spectral norm of the grading matrix, max_i scale_i: its Lipschitz constant
        (000 Lemma 5.5 / 5.27 for LGT, Prop 6.5 / Lemma 6.19 for EGT; 001 Prop 2.4 (4)-(5))."""
        return float(self.scales().detach().max())

    def forward(self, x: Tensor, *, head_axis: int = -3) -> Tensor:
        """Apply the grading to the last dimension of ``x``: ``x * scales()``.

        Shared grades (``(dim,)``) broadcast over all leading dimensions. Per-head grades
        (``(num_heads, dim)``) expect the heads at ``head_axis`` of ``x``; the default -3 fits the
        ``(batch, heads, tokens, head_dim)`` layout of ``graded.attention``; pass -2 for
        ``(..., heads, head_dim)``.
        """
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"input has {x.shape[-1]} features in its last dimension, expected dim={self.dim}"
            )
        s = self.scales()
        if s.ndim == 1:
            return x * s
        axis = head_axis % x.ndim if x.ndim > 0 else 0
        if x.ndim < 2 or axis == x.ndim - 1 or x.shape[axis] != s.shape[0]:
            raise ValueError(
                f"per-head grades of shape {tuple(s.shape)} need {s.shape[0]} heads at axis "
                f"{head_axis} of the input, got input shape {tuple(x.shape)}"
            )
        view = (s.shape[0],) + (1,) * (x.ndim - axis - 2) + (self.dim,)
        return x * s.reshape(view)

    def extra_repr(self) -> str:
        shape = tuple(self.grades.shape)
        return f"dim={self.dim}, grades_shape={shape}, learnable={self.learnable}"

    # -- initialisers (000 Alg 5.1 "Initialize", §7.2 (ii) warm start) ------------------------
    @classmethod
    def zeros(cls: type[_G], dim: int, *, num_heads: int | None = None, **kwargs: Any) -> _G:
        """All grades 0."""
        return cls(dim, 0.0, num_heads=num_heads, **kwargs)

    @classmethod
    def constant(cls: type[_G], dim: int, c: float, *, num_heads: int | None = None,
                 **kwargs: Any) -> _G:
        """All grades equal to ``c``."""
        return cls(dim, float(c), num_heads=num_heads, **kwargs)

    @classmethod
    def warm_start(cls: type[_G], dim: int, c: float = 1.0, *, offset: int = 0,
                   num_heads: int | None = None, **kwargs: Any) -> _G:
        """Domain-informed warm start q_k = c·(k + offset), k = 0, ..., dim − 1 (000 Alg 5.1,
        §7.2 (ii)). ``offset=0`` gives the degree grading (0, c, 2c, ...) of 000 Ex. 5.11;
        ``offset=1`` the 1-based q_k = c·k of Alg 5.1. Per-head grades repeat the tuple."""
        c = check_float("c (the grade step of the warm start)", c)
        offset = check_int("offset", offset)
        dtype = kwargs.pop("dtype", None) or torch.get_default_dtype()
        q = c * (torch.arange(dim, dtype=dtype) + offset)
        if num_heads is not None:
            q = q.expand(num_heads, dim).clone()
        return cls(dim, q, num_heads=num_heads, dtype=dtype, **kwargs)

    @classmethod
    def from_tensor(cls: type[_G], grades: GradesLike, **kwargs: Any) -> _G:
        """Grades copied from a user tensor of shape ``(dim,)`` or ``(num_heads, dim)``."""
        t = as_grade_tensor(grades)
        return cls(t.shape[-1], t, **kwargs)


class LinearGrading(GradingMap):
    """LGT grading map M_q = diag(f(q)) (000 Def 5.1, Lemma 5.5; Def 5.37 (iv)).

    ``f`` is one of ``"shift"`` (q + 1, 000 Ex. 5.4/5.38), ``"abs_shift"`` (|q| + 1),
    ``"softplus"`` (log(1 + e^q)) or ``"identity"`` (q itself; requires q > 0).
    ``grades=None`` gives the neutral grading, whose scales are 1 (0 for "shift"/"abs_shift",
    1 for "identity", log(e − 1) for "softplus", where the scale is 1 up to rounding), so a
    model built with it equals its ungraded twin. Learnable grades under "shift" and "identity"
    are floored at ``floor`` (straight-through; see the module docstring).
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
        if f not in LINEAR_FUNCTIONS:
            raise ValueError(f"f must be one of {LINEAR_FUNCTIONS}, got {f!r}")
        if (isinstance(floor, bool) or not isinstance(floor, (int, float))
                or not (math.isfinite(floor) and floor > 0)):
            raise ValueError(f"floor must be a positive finite number, got {floor!r}")
        self.f = f
        self.floor = float(floor)
        neutral = {"shift": 0.0, "abs_shift": 0.0, "identity": 1.0,
                   "softplus": _SOFTPLUS_NEUTRAL}[f]
        super().__init__(dim, grades, learnable, num_heads=num_heads, neutral=neutral,
                         device=device, dtype=dtype)

    def _raw_scales(self, q: Tensor) -> Tensor:
        if self.f == "shift":
            return q + 1.0
        if self.f == "abs_shift":
            return q.abs() + 1.0
        if self.f == "softplus":
            return nn.functional.softplus(q)
        return q

    def _validate(self, grades: Tensor) -> None:
        if self.learnable:
            return
        s = self._raw_scales(grades)
        bad = s <= 0
        if bool(bad.any()):
            need = {"identity": "q > 0", "shift": "q > -1"}.get(
                self.f, f"q for which softplus(q) does not underflow to 0 in {grades.dtype}")
            raise ValueError(
                f"f={self.f!r} needs {need} so that every scale f(q) is positive; got grades "
                f"{_describe_bad(grades, bad)}"
            )

    def scales(self) -> Tensor:
        """diag(M_q) = f(q), shape ``grades.shape``."""
        return self._memoized(lambda: self.scales_at(None))

    def scale_of(self, q: Tensor) -> Tensor:
        return self._raw_scales(q)

    def scales_at(self, multiplier: Tensor | None) -> Tensor:
        """diag(M_{s·q}) = f(s·q) for each multiplier s: (…) -> (…, dim); None is s = 1."""
        q = self.grades if multiplier is None else multiplier.unsqueeze(-1) * self.grades
        return self._scales_from(q)

    def _scales_from(self, q: Tensor) -> Tensor:
        if self.learnable and self.f in ("shift", "identity"):
            # max(f(q), floor) forward and f'(q) = 1 backward, straight-through, in three
            # operators: q + max(floor − q, f(q) − q), the second term a constant
            return q + (self.floor - q.detach()).clamp_(min=1.0 if self.f == "shift" else 0.0)
        return self._raw_scales(q)

    def _batch_signature(self) -> tuple:
        return (*super()._batch_signature(), self.f, self.floor)

    def _batched_scales(self, gradings: Sequence[GradingMap]) -> Tensor:
        return self._scales_from(torch.stack([g.grades for g in gradings]))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, f={self.f!r}"


class ExponentialGrading(GradingMap):
    """EGT grading map M_{q,λ} = diag(λ^q), q ≥ 0, λ > 1 (000 Def 6.1, Prop 6.5; 001 Def 2.3).

    Computed as exp(q·ln λ) with the exponent clamped at ``max_log_scale`` (warning on clamp).
    The base λ is a buffer (saved in state dicts) that :meth:`set_base` changes at run time, as
    the λ annealing of 000 §7.2 (iii) does every step. ``grades=None`` gives q = 0, M = I.
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
        if max_log_scale is not None and not (max_log_scale > 0 and math.isfinite(max_log_scale)):
            raise ValueError(
                f"max_log_scale must be a positive finite number, got {max_log_scale!r}"
            )
        self.max_log_scale = max_log_scale
        super().__init__(dim, grades, learnable, num_heads=num_heads, neutral=0.0,
                         device=device, dtype=dtype)
        self.register_buffer("base", torch.tensor(b, dtype=self.grades.dtype,
                                                  device=self.grades.device))
        self._check_overflow()

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

    def _cap(self) -> float:
        """The largest exponent q·ln λ used: ``max_log_scale``, else half the log of the largest
        finite value of the compute dtype (the autocast dtype under autocast, so an fp16 or bf16
        forward pass stays finite), minus 1."""
        if self.max_log_scale is not None:
            return self.max_log_scale
        dtype = self.grades.dtype
        fast = _autocast_on(self.grades.device.type)
        if fast is not None and torch.finfo(fast).max < torch.finfo(dtype).max:
            dtype = fast
        return 0.5 * math.log(torch.finfo(dtype).max) - 1.0

    def _sources(self) -> tuple[Tensor, ...]:
        return (self.grades, self.base)

    def _log_base(self) -> Tensor:
        """ln λ, kept while the base is unchanged."""
        return self._kept_value(("log_base",), (self.base,), lambda: torch.log(self.base))

    def _exponent(self) -> Tensor:
        return self._exponent_of(self.grades, self._log_base())

    def _exponent_of(self, q: Tensor, log_base: Tensor) -> Tensor:
        if self.learnable:
            q = straight_through_floor(q, 0.0)
        return q * log_base

    def _batch_signature(self) -> tuple:
        return (*super()._batch_signature(), self.max_log_scale)

    def _batched_scales(self, gradings: Sequence[GradingMap]) -> Tensor:
        q = torch.stack([g.grades for g in gradings])
        log_base = torch.stack([g._log_base() for g in gradings])  # each its own λ
        e = self._exponent_of(q, log_base.reshape((-1,) + (1,) * (q.dim() - 1)))
        if e.device.type == "cpu":
            tops = e.detach().flatten(1).amax(1).tolist()  # one read for all the gradings
            for g, top in zip(gradings, tops, strict=True):
                g._check_overflow(top)
        return self._capped_exp(e)

    def _check_overflow(self, top: float | None = None) -> None:
        """Warn when the largest exponent q·ln λ (``top``, computed here when not given) is
        above the cap, where the scales are clamped."""
        cap = self._cap()
        if top is None:
            top = float(self._exponent().detach().max())
        if top > cap:
            warnings.warn(
                f"exponential grading: q·ln(λ) reaches {top:.4g} (λ={float(self.base):.4g}), "
                f"above max_log_scale={cap:.4g}; scales are clamped to exp({cap:.4g})",
                RuntimeWarning,
                stacklevel=3,
            )

    def scales(self) -> Tensor:
        """diag(M_{q,λ}) = λ^q = exp(q·ln λ), shape ``grades.shape`` (overflow-guarded)."""
        return self._memoized(self._scales)

    def _scales(self) -> Tensor:
        e = self._exponent()
        if e.device.type == "cpu" and not torch.compiler.is_compiling():
            self._check_overflow(float(e.detach().max()))
        return self._capped_exp(e)

    def _capped_exp(self, e: Tensor) -> Tensor:
        """exp(min(e, cap)): an exponent q·ln λ to a scale, overflow-guarded (:meth:`_cap`)."""
        return torch.exp(e.clamp(max=self._cap()))

    def scale_of(self, q: Tensor) -> Tensor:
        return self._capped_exp(q * torch.log(self.base.to(q.dtype)))

    def scales_at(self, multiplier: Tensor | None) -> Tensor:
        """diag(M_{s·q,λ}) = λ^{s·q} for each multiplier s ≥ 0: (…) -> (…, dim), clamped as
        :meth:`scales` is but without a warning (module docstring); None is s = 1."""
        if multiplier is None:
            return self.scales()
        return self._capped_exp(multiplier.unsqueeze(-1) * self._exponent())

    def inverse_scales(self) -> Tensor:
        """diag(M_{q,λ}^{-1}) = λ^{-q} (001 Prop 2.4 (1)), consistent with the clamp of scales()."""
        return torch.exp(-self._exponent().clamp(max=self._cap()))

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
