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
- *Fixed grades are computed once.* ``scales()`` of a grading with fixed grades is kept and
  returned again until the grades, the base or the autocast dtype change (seen through the
  tensors' version counters: ``set_grades``, ``set_base``, ``load_state_dict``, any in-place
  operation; writing through ``.data`` is not seen). Learnable grades are computed afresh each
  call, once per forward pass of a model.
- *λ = 1.* The constructor requires λ > 1 (000 Def 6.1). ``set_base`` also accepts λ = 1 because
  the annealing schedule λ_t = 1 + (λ_max − 1)t/T of 000 §7.2 (iii) starts there (M = I).

A diagonal grading next to a linear map is a rescaling of the map: after it,
(W x + b)·m = (diag(m) W) x + m·b (its rows); before it, W (m·x) = (W diag(m)) x (its columns).
:func:`graded_linear` computes the map with the grading folded in this way, so that the graded
models pay O(out·in) once per call instead of O(N·out) for N rows of activations. The modules
that fold have a ``fold_grading`` switch; :func:`activation_grading` turns it off for a while.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "GRADINGS",
    "LINEAR_FUNCTIONS",
    "ExponentialGrading",
    "FoldedLinears",
    "GradesLike",
    "GradingMap",
    "LinearGrading",
    "activation_grading",
    "as_grade_tensor",
    "batched_scales",
    "fold_rows",
    "folds_rows",
    "graded_linear",
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


def _rows(x: Tensor) -> int:
    """The number of rows of activations ``x`` (…, features)."""
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def folds_rows(weight: Tensor, x: Tensor) -> bool:
    """Whether :func:`graded_linear` folds a grading of the outputs into the rows of
    ``weight`` (out × in) for the inputs ``x`` (…, in): when in ≤ the number of rows of x."""
    return weight.shape[1] <= _rows(x)


def graded_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, *, out_scales: Tensor | None = None,
    in_scales: Tensor | None = None,
) -> Tensor:
    """``F.linear`` with a diagonal grading on either side: (W (in_scales·x) + b)·out_scales.

    Each grading is folded into the weight, W ← diag(out_scales) W (and b ← out_scales·b) or
    W ← W diag(in_scales), when that costs no more than scaling the activations: when the
    weight (out × in) has no more entries than the N rows of activations it would scale
    (N × out after the map, N × in before it), i.e. when in ≤ N, resp. out ≤ N. Otherwise (a
    decoding step, a vocabulary wider than the batch) the activations are scaled. Both forms
    are the same map and differentiate the same way, up to rounding. :func:`folds_rows` says
    which form a call takes for out_scales; where it folds, a model may compute the folded
    weights of several layers at once (:class:`FoldedLinears`) and call ``F.linear``.
    """
    w, b = weight, bias
    if in_scales is not None:
        if weight.shape[0] <= _rows(x):
            w = w * in_scales.to(w.dtype)
        else:
            x = x * in_scales.to(x.dtype)
    after = out_scales
    if out_scales is not None and folds_rows(weight, x):
        (w, b), = fold_rows([(w, b)], [out_scales])
        after = None
    y = F.linear(x, w, b)
    return y if after is None else y * after.to(y.dtype)


class FoldedLinears:
    """The folded weights diag(s_i) W_i and biases s_i·b_i of several linear maps
    (:func:`fold_rows`): the values and gradients of :func:`graded_linear`'s fold map by map.
    ``maps`` are the (W_i, b_i or None) pairs, ``scales(which)`` returns the row scales s_i
    (out_i,) of the maps ``which`` (a list of indices). ``fold(i)`` is map i's pair, handed
    out once; a second call for the same map computes it again. A model's layers fold their
    graded projections this way within one forward pass (:mod:`graded.transformer.graded`).

    The first map asked for is folded alone (its scales too) and the others together at the
    next ask: the first layer's product can start on the device before the other layers'
    scales and folds are issued (an eager step on a GPU waits for the host until then), and
    the rest take one call of the folds' autograd function (the products are one kernel per
    map either way).

    ``previous_form = True`` (on the class, for side-by-side timing:
    ``benchmarks/lm_training_step.py --compare-folds``) folds as before 28a0b8f: all maps at
    the first ask, in float32 foreach products with autograd's backward, which ``F.linear``
    casts under autocast. The same values and gradients."""

    previous_form: bool = False

    def __init__(self, maps: Sequence[tuple[Tensor, Tensor | None]],
                 scales: Callable[[list[int]], Sequence[Tensor]]) -> None:
        self.maps = list(maps)
        self._scales = scales
        self._pending: list[int] | None = None  # maps not folded yet (None: nothing asked)
        self._folded: dict[int, tuple[Tensor, Tensor | None]] = {}

    def fold(self, i: int) -> tuple[Tensor, Tensor | None]:
        if self._pending is None:  # the first ask
            if not self.previous_form:
                self._pending = [j for j in range(len(self.maps)) if j != i]
                return self._compute([i])[0]
            self._store(list(range(len(self.maps))))
            self._pending = []
        elif i in self._pending:
            self._store(self._pending)
            self._pending = []
        if i in self._folded:
            return self._folded.pop(i)
        return self._compute([i])[0]  # handed out already: map i is used twice in this pass

    def _compute(self, which: list[int]) -> list[tuple[Tensor, Tensor | None]]:
        return fold_rows([self.maps[j] for j in which], self._scales(which),
                         previous_form=self.previous_form)

    def _store(self, which: list[int]) -> None:
        self._folded.update(zip(which, self._compute(which), strict=True))


def fold_rows(maps: Sequence[tuple[Tensor, Tensor | None]], scales: Sequence[Tensor], *,
              previous_form: bool = False) -> list[tuple[Tensor, Tensor | None]]:
    """The folds (diag(s_i) W_i, s_i·b_i) of the linear maps ``maps`` (W_i, b_i or None) with
    their row scales ``scales`` (s_i, converted to W_i's dtype). Under autocast, where
    ``F.linear`` would cast a float32 weight to the autocast dtype, the folds are made in that
    dtype in the same kernel (s_i·W_i rounded once, as the cast of the float32 product would
    be: the same values), and their gradients come back in it: the cast and its backward
    are two kernels and a float32 copy of each weight fewer. The backward is written out
    (:class:`_FoldRows`); ``previous_form=True`` (the code before 28a0b8f) and ``torch.func``
    transforms take autograd's backward of float32 products instead, ``torch.compile`` the products
    written out."""
    weights = [w for w, _ in maps]
    scales = [s if s.dtype == w.dtype else s.to(w.dtype)
              for s, w in zip(scales, weights, strict=True)]
    if torch.compiler.is_compiling():  # the formula; the compiler fuses it with the cast
        return [(s[:, None] * w, None if b is None else s * b)
                for (w, b), s in zip(maps, scales, strict=True)]
    with_bias = [i for i, (_, b) in enumerate(maps) if b is not None]
    biases = [maps[i][1] for i in with_bias]
    if previous_form or torch._C._are_functorch_transforms_active():
        folded_w = list(torch._foreach_mul(weights, [s[:, None] for s in scales]))
        out_b = torch._foreach_mul(biases, [scales[i] for i in with_bias]) if biases else []
    else:
        distinct: dict[int, int] = {}  # one gradient per scale tensor shared by maps
        firsts: list[Tensor] = []
        for s in scales:
            if id(s) not in distinct:
                distinct[id(s)] = len(firsts)
                firsts.append(s)
        scale_of = tuple(distinct[id(s)] for s in scales)
        out = _FoldRows.apply(tuple(with_bias), scale_of, _autocast_dtype(weights), *weights,
                              *biases, *firsts)
        folded_w, out_b = list(out[:len(weights)]), out[len(weights):]
    folded_b: list[Tensor | None] = [None] * len(maps)
    for i, b in zip(with_bias, out_b, strict=True):
        folded_b[i] = b
    return list(zip(folded_w, folded_b, strict=True))


def _autocast_on(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes in on ``device_type`` now, None where it is off (or the
    device type has no autocast, as "meta")."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # "unknown device type for autocast"
        return None
    return torch.get_autocast_dtype(device_type) if enabled else None


def _autocast_dtype(weights: Sequence[Tensor]) -> torch.dtype | None:
    """The dtype ``F.linear`` casts these float32 weights to under the autocast now in force
    (None: no autocast on their device, or weights that are not all float32 on one device)."""
    first = weights[0]
    if (first.dtype != torch.float32
            or any(w.dtype != first.dtype or w.device != first.device for w in weights)):
        return None
    dtype = _autocast_on(first.device.type)
    return None if dtype == first.dtype else dtype


# Entries of the products ∂W'_i ⊙ W_i that _FoldRows's backward holds at once (64 MiB in
# float32): the transient memory of a few layers' weights rather than of all.
_FOLD_GROUP = 1 << 24


def _groups_of_size(items: list[int], sizes: list[int], budget: int) -> Iterator[list[int]]:
    """``items`` in order, in consecutive groups of total size at most ``budget`` (an item
    larger than the budget alone)."""
    group: list[int] = []
    total = 0
    for item, size in zip(items, sizes, strict=True):
        if group and total + size > budget:
            yield group
            group, total = [], 0
        group.append(item)
        total += size
    if group:
        yield group


def _products_in(xs: Sequence[Tensor], ys: Sequence[Tensor], dtype: torch.dtype) -> list[Tensor]:
    """The products x_i·y_i, each rounded to ``dtype`` as it is stored (one kernel per product
    on a GPU); the outputs of the x_i that share a shape are the slices of one allocation (one
    dispatch instead of one per product)."""
    alike: dict[tuple, list[int]] = {}
    for i, x in enumerate(xs):
        alike.setdefault((x.shape, x.device), []).append(i)
    outs: list[Tensor] = [None] * len(xs)  # type: ignore[list-item]
    for (shape, device), group in alike.items():
        if len(group) == 1:
            outs[group[0]] = torch.empty_like(xs[group[0]], dtype=dtype)
            continue
        block = torch.empty((len(group), *shape), dtype=dtype, device=device)
        for i, out in zip(group, block.unbind(0), strict=True):
            outs[i] = out
    return [torch.mul(x, y, out=o) for x, y, o in zip(xs, ys, outs, strict=True)]


class _FoldRows(torch.autograd.Function):
    """The folds (diag(s_i) W_i, s_i·b_i) of n linear maps, with a backward written out in
    products over the lists of maps: ∂W_i = s_i·∂W'_i, ∂b_i = s_i·∂b'_i and
    ∂s_i = Σ_j ∂W'_ij W_ij + ∂b'_i b_i (one row sum per map), summed over the maps that share
    a scale tensor (``scale_of[i]`` is map i's among the distinct ``scales``). Autograd's own
    backward of the products took per map the two products, a reduction for the broadcast
    scale, the bias terms and an accumulation per use of a scale, and under autocast the casts
    back of the folds' gradients (the kernel counts: ``benchmarks/host_overhead.py``). With
    ``dtype`` (:func:`fold_rows` under
    autocast) the folds are made in that dtype and their gradients arrive in it; the products
    with the float32 weights and scales promote to float32, as the gradient of autocast's cast
    would. Differentiable twice (the backward is made of differentiable operators)."""

    @staticmethod
    def forward(ctx: Any, with_bias: tuple[int, ...], scale_of: tuple[int, ...],
                dtype: torch.dtype | None, *tensors: Tensor) -> tuple[Tensor, ...]:
        n, nb = len(scale_of), len(with_bias)
        weights, biases, scales = tensors[:n], tensors[n:n + nb], tensors[n + nb:]
        ctx.with_bias, ctx.scale_of = with_bias, scale_of
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*tensors)
        columns = [s[:, None] for s in scales]  # one view per distinct scale tensor
        cols = [columns[j] for j in scale_of]
        rows = [scales[scale_of[i]] for i in with_bias]
        if dtype is None:
            folded_w = torch._foreach_mul(weights, cols)
            folded_b = torch._foreach_mul(biases, rows) if biases else []
        else:  # the product rounded to dtype as it is stored: one kernel (on a GPU) per map
            folded_w = _products_in(weights, cols, dtype)
            folded_b = _products_in(biases, rows, dtype)
        return (*folded_w, *folded_b)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        with_bias, scale_of = ctx.with_bias, ctx.scale_of
        n, nb = len(scale_of), len(with_bias)
        saved = ctx.saved_tensors
        weights, biases, scales = saved[:n], saved[n:n + nb], saved[n + nb:]
        grad_w_out, grad_b_out = grads[:n], grads[n:]
        needs = ctx.needs_input_grad[3:]
        needs_w, needs_b, needs_s = needs[:n], needs[n:n + nb], needs[n + nb:]

        def products(pairs: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
            return list(torch._foreach_mul([a for a, _ in pairs], [b for _, b in pairs]))

        grad_w: list[Tensor | None] = [None] * n
        used = [i for i in range(n) if grad_w_out[i] is not None and needs_w[i]]
        if used:
            out = products([(grad_w_out[i], scales[scale_of[i]][:, None]) for i in used])
            for i, g in zip(used, out, strict=True):
                grad_w[i] = g
        grad_b: list[Tensor | None] = [None] * nb
        used = [k for k in range(nb) if grad_b_out[k] is not None and needs_b[k]]
        if used:
            out = products([(grad_b_out[k], scales[scale_of[with_bias[k]]]) for k in used])
            for k, g in zip(used, out, strict=True):
                grad_b[k] = g
        # ∂s per map: the row sums of ∂W'_i ⊙ W_i (a group of maps at a time), plus ∂b'_i b_i
        part: list[Tensor | None] = [None] * n
        used = [i for i in range(n) if grad_w_out[i] is not None and needs_s[scale_of[i]]]
        for group in _groups_of_size(used, [weights[i].numel() for i in used], _FOLD_GROUP):
            rows = products([(grad_w_out[i], weights[i]) for i in group])
            for i, r in zip(group, rows, strict=True):
                part[i] = r.sum(1)
            del rows
        terms = [(k, i) for k, i in enumerate(with_bias)
                 if grad_b_out[k] is not None and needs_s[scale_of[i]]]
        onto = [(k, i) for k, i in terms if part[i] is not None]
        if onto:
            torch._foreach_addcmul_([part[i] for _, i in onto], [grad_b_out[k] for k, _ in onto],
                                    [biases[k] for k, _ in onto])
        alone = [(k, i) for k, i in terms if part[i] is None]
        if alone:
            for (_, i), g in zip(alone, products([(grad_b_out[k], biases[k]) for k, _ in alone]),
                                 strict=True):
                part[i] = g
        shares: list[list[Tensor]] = [[] for _ in scales]  # the parts of each scale
        for i, p in enumerate(part):
            if p is not None:
                shares[scale_of[i]].append(p)
        grad_s = [None if not ps else ps[0] if len(ps) == 1 else torch.stack(ps).sum(0)
                  for ps in shares]
        return (None, None, None, *grad_w, *grad_b, *grad_s)


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


@contextlib.contextmanager
def activation_grading(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block, every module of ``model`` that folds a grading into a linear map (those
    with a ``fold_grading`` switch: graded attention, the graded transformer's feed-forward and
    output stages) applies it to the activations instead, as the formulas are written; the
    switches are restored after. For code that must see the tensors between the stages
    ungraded, as ``attend``'s documented inputs (graded attention folds its grading into
    ``project``). Not across a generation with a key-value cache: the cached keys and values
    keep the form they were made in."""
    saved = [(m, m.fold_grading) for m in model.modules() if hasattr(m, "fold_grading")]
    try:
        for m, _ in saved:
            m.fold_grading = False
        yield model
    finally:
        for m, fold in saved:
            m.fold_grading = fold


def is_diagonal(grading: nn.Module) -> bool:
    """Whether ``grading`` is x ↦ x·scales(), a :class:`GradingMap` with the base class's
    forward: only such a grading can be folded into a neighbouring linear map."""
    return isinstance(grading, GradingMap) and type(grading).forward is GradingMap.forward


def _stamp(sources: Sequence[Tensor]) -> tuple | None:
    """What identifies the values of ``sources`` while their storage is held (address,
    version counter, view shape of each), or None where values derived from them must not be
    kept: under the compiler, when one is a parameter or takes a gradient, or is an inference
    tensor (no version counter). See :meth:`GradingMap._kept_value`."""
    if torch.compiler.is_compiling():
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
        if num_heads is not None and (not isinstance(num_heads, int) or num_heads < 1):
            raise ValueError(f"num_heads must be a positive int or None, got {num_heads!r}")
        if dtype is None and isinstance(grades, Tensor) and grades.is_floating_point():
            dtype = grades.dtype
        if grades is None:
            grades = float(neutral)
        if isinstance(grades, (int, float)) and not isinstance(grades, bool):
            shape = (dim,) if num_heads is None else (num_heads, dim)
            t = torch.full(shape, float(grades), dtype=dtype or torch.get_default_dtype(),
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
        ``torch.inference_mode``: no version counter). A change is seen through the sources'
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
        dtype = kwargs.pop("dtype", None) or torch.get_default_dtype()
        q = float(c) * (torch.arange(dim, dtype=dtype) + offset)
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
        if not (isinstance(floor, (int, float)) and floor > 0):
            raise ValueError(f"floor must be a positive number, got {floor!r}")
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
            need = "q > 0" if self.f == "identity" else "q > -1"
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
        :meth:`scales` is; None is s = 1."""
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
