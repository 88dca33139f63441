"""The base class of the grading maps, :class:`GradingMap` (grades storage, validation,
forward, initialisers, scales kept while their sources are unchanged); the functions that
compute or share the scales of several gradings at once are :mod:`graded.grading.batching`
(see :mod:`graded.grading`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.autograd.forward_ad as forward_ad
from torch import Tensor, nn

from graded.checks import check_bool, check_float, check_int
from graded.folding import _autocast_on
from graded.grading.grades import GradesLike, as_grade_tensor, has_values

__all__ = ["GradingMap", "is_diagonal"]

_G = TypeVar("_G", bound="GradingMap")


def is_diagonal(grading: nn.Module) -> bool:
    """Whether ``grading`` is x ↦ x·scales(), a :class:`GradingMap` with the base class's
    forward: only such a grading can be folded into a neighbouring linear map."""
    return isinstance(grading, GradingMap) and type(grading).forward is GradingMap.forward


def _stamp(sources: Sequence[Tensor]) -> tuple | None:
    """What identifies the values of ``sources`` while their storage is held (address,
    version counter, view shape of each), or None where values derived from them must not be
    kept: under the compiler, when one is a parameter or takes a gradient, or is an inference
    tensor (no version counter), under ``torch.inference_mode`` (what it computes is an
    inference tensor, which a later pass with autograd could not save for its backward), or
    inside a forward-mode AD level (a dual tensor's tangent changes nothing the stamp sees).
    See :meth:`GradingMap._kept_value`."""
    if (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()
            or torch._C._are_functorch_transforms_active()  # wrappers: no data pointer
            or forward_ad._current_level >= 0):
        return None
    for t in sources:
        if t.requires_grad or t.is_inference() or _is_parameter(t):
            return None
    return tuple((t.data_ptr(), t._version, t.shape) for t in sources)


def _version(value: object) -> int | None:
    """The version counter of a kept tensor (None for a value that is not one)."""
    return value._version if isinstance(value, Tensor) else None


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
    set it (see :class:`graded.transformer.grading_plan.GradingPlan`); a grading used on its own
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
        learnable = check_bool("learnable", learnable)  # bool("no") is True: a Parameter
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
        self.learnable = learnable
        self.neutral = float(neutral)  # the grade whose scale is 1 (M = I)
        if has_values(t):  # built on "meta": no values to check (they come with a state dict)
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
        if memo is None and self.grades.requires_grad:  # learnable: nothing kept (_stamp)
            return compute()
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

    def __getstate__(self) -> dict[str, Any]:
        """``nn.Module``'s state without the kept values: a copy (``copy.deepcopy``, pickling)
        holds copies of their sources, whose storage would not pin the addresses its stamps
        name, so a later tensor at one of them could pass for the original. Nor the scales
        held by :func:`shared_scales`: a copy made inside the block is outside it, and
        returned the held scales for good (after ``set_grades`` too); with learnable grades
        they are no graph leaves, which ``copy.deepcopy`` refused."""
        state = super().__getstate__()
        state.pop("_kept", None)
        state.pop("_scales_memo", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, also a grading pickled when its options (:attr:`_options`) were plain
        attributes: each moves to its slot (``f`` to ``_f``), where its property reads it."""
        for name in self._options:
            if name in state and f"_{name}" not in state:
                state = {**state, f"_{name}": state[name]}
                del state[name]
        super().__setstate__(state)

    #: the options the scales are computed from besides the grades (``f``, ``floor``,
    #: ``max_log_scale``): properties that :meth:`_set_option` sets
    _options: tuple[str, ...] = ()

    def _set_option(self, name: str, value: object) -> None:
        """Set option ``name`` (checked by the caller) as the constructor does and, on a built
        grading, check its fixed grades under it (refused: the option in force stays) and
        drop the kept scales, which were computed with the option in force."""
        slot, missing = f"_{name}", object()
        old = self.__dict__.get(slot, missing)
        self.__dict__[slot] = value
        grades = self.__dict__.get("_buffers", {}).get("grades")
        if grades is None:
            grades = self.__dict__.get("_parameters", {}).get("grades")
        if grades is None:  # in the constructor, before the grades: they are checked then
            return
        try:
            if has_values(grades):
                self._validate(grades.detach())
        except ValueError:
            if old is missing:
                del self.__dict__[slot]
            else:
                self.__dict__[slot] = old
            raise
        self.__dict__["_kept"] = None

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
        ``set_base``. A kept value changed in place by its receiver is not returned again
        (its version counter is checked too): it is computed afresh."""
        stamp = _stamp(sources)
        if stamp is None:
            return compute()
        kept = self._kept
        entry = None if kept is None else kept.get(key)
        # the value's own version too: a caller that changes the returned tensor in place
        # (``s = g.scales(); s /= s.max()``) must not change what the grading computes next
        if entry is not None and entry[0] == stamp and _version(entry[2]) == entry[3]:
            return entry[2]
        value = compute()
        if kept is None:
            kept = self._kept = {}
        kept[key] = (stamp, tuple(t.detach() for t in sources), value, _version(value))
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
        (…) -> (…, dim) (per-token grading,
        :class:`graded.transformer.graded_stages.TokenGrading`); None gives :meth:`scales`."""
        raise NotImplementedError

    def _check_multiplier(self, multiplier: Tensor) -> None:
        """The checks of :meth:`scales_at`: a tensor of multipliers, and grades shared by all
        features (per-head grades (H, dim) broadcast against the multipliers' last axis: s of
        shape (T,) with T = H paired token t with head t, silently)."""
        if not isinstance(multiplier, Tensor):
            raise TypeError(f"scales_at takes a tensor of multipliers s (or None), got "
                            f"{type(multiplier).__name__}")
        if self.grades.ndim != 1:
            raise ValueError(f"scales_at needs shared grades of shape ({self.dim},), one "
                             f"grade per feature; this grading has per-head grades of shape "
                             f"{tuple(self.grades.shape)}")

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

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              *args: Any, **kwargs: Any) -> None:
        """``nn.Module``'s, with the loaded grades validated as :meth:`set_grades` does, before
        they replace the current ones (fixed grades of a damaged or hand-edited checkpoint
        would otherwise give non-finite or non-positive scales silently)."""
        loaded = state_dict.get(prefix + "grades")
        if isinstance(loaded, Tensor) and has_values(loaded) and (
                loaded.shape == self.grades.shape):  # another shape: torch's own error
            t = as_grade_tensor(loaded.detach(), dim=self.dim, name=f"loaded {prefix}grades",
                                dtype=self.grades.dtype)
            self._validate(t)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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
        if x.ndim == 0 or x.shape[-1] != self.dim:
            raise ValueError(
                f"input has shape {tuple(x.shape)}: its last dimension must hold the dim="
                f"{self.dim} features"
            )
        s = self.scales()
        if s.ndim == 1:
            return x * s
        if not -x.ndim <= head_axis < x.ndim:  # taken modulo ndim, 4 read axis 0 of a 4-d x
            raise ValueError(f"per-head grades of shape {tuple(s.shape)} need {s.shape[0]} "
                             f"heads at axis head_axis={head_axis!r}, which is out of range "
                             f"for an input of {x.ndim} dimensions (shape {tuple(x.shape)})")
        axis = head_axis % x.ndim
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
        ``offset=1`` the 1-based q_k = c·k of Alg 5.1. Per-head grades repeat the tuple.
        Each grade is computed in float64 and rounded once to ``dtype`` (the value nearest to
        c·(k + offset), not the product of a rounded c)."""
        c = check_float("c (the grade step of the warm start)", c)
        offset = check_int("offset", offset)
        dtype = kwargs.pop("dtype", None) or torch.get_default_dtype()
        q = (c * (torch.arange(dim, dtype=torch.float64) + offset)).to(dtype)
        if num_heads is not None:
            q = q.expand(num_heads, dim).clone()
        return cls(dim, q, num_heads=num_heads, dtype=dtype, **kwargs)

    @classmethod
    def from_tensor(cls: type[_G], grades: GradesLike, **kwargs: Any) -> _G:
        """Grades copied from a user tensor of shape ``(dim,)`` or ``(num_heads, dim)``."""
        t = as_grade_tensor(grades)
        return cls(t.shape[-1], t, **kwargs)
