"""Folding a diagonal grading into the linear map next to it: the folded form of the graded models.

A diagonal grading M = diag(m) next to a linear map is a rescaling of the map: after it,
(W x + b)·m = (diag(m) W) x + m·b (its rows); before it, W (m·x) = (W diag(m)) x (its columns).
Graded attention grades queries, keys or values (000 Def 5.22), which come out of the Q/K/V
projections, so its grading is folded into the projections' rows (:mod:`graded.attention.graded`);
the graded transformer folds its feature grading into the feed-forward output layer's rows and
the output head's columns (:mod:`graded.transformer.graded`). The same map, up to rounding, at
O(out·in) once per call instead of O(N·out) for N rows of activations.

- :func:`graded_linear` is ``F.linear`` with a grading on either side, folded where that costs
  no more than scaling the activations (:func:`folds_rows` says when, for the rows).
- :func:`fold_rows` makes the folds (diag(s_i) W_i, s_i·b_i) of several maps at once, under
  autocast in the autocast dtype, with a backward written out (:class:`_FoldRows`);
  :class:`FoldedLinears` hands them out map by map within one forward pass of a model.
- The modules that fold have a ``fold_grading`` switch; :func:`activation_grading` turns it off
  for a while (the grading then acts on the activations, as the formulas are written).

The grading maps whose scales are folded are those of :mod:`graded.grading`
(:func:`graded.grading.is_diagonal` says which can be).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "FoldedLinears",
    "activation_grading",
    "fold_rows",
    "folds_rows",
    "graded_linear",
]


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
    are the same map and differentiate the same way, up to rounding. A fold of one map takes
    autograd's products (two operators, the least host work per call), except under autocast,
    where :func:`fold_rows` makes it in the autocast dtype in the same kernel.
    :func:`folds_rows` says which form a call takes for out_scales; where it folds, a model
    may compute the folded weights of several layers at once (:class:`FoldedLinears`) and call
    ``F.linear``.
    """
    w, b = weight, bias
    if in_scales is not None:
        if weight.shape[0] <= _rows(x):
            w = w * in_scales.to(w.dtype)
        else:
            x = x * in_scales.to(x.dtype)
    after = out_scales
    if out_scales is not None and folds_rows(weight, x):
        if _autocast_dtype([w]) is None:  # the product is the weight F.linear takes
            s = out_scales.to(w.dtype)
            w, b = w * s[:, None], (None if b is None else b * s)
        else:  # under autocast: the fold made in the autocast dtype (fold_rows)
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


def _products_in(xs: Sequence[Tensor], ys: Sequence[Tensor], dtype: torch.dtype, *,
                 shared: bool = True) -> list[Tensor]:
    """The products x_i·y_i, each rounded to ``dtype`` as it is stored (one kernel per product
    on a GPU); with ``shared``, the outputs of the x_i that share a shape are the slices of one
    allocation (one dispatch instead of one per product). Not inside a forward-mode AD level:
    there an output of :class:`_FoldRows` that is a view needs a tangent that is a view of
    the same layout, and forward AD failed on an internal assertion for two maps of one shape."""
    alike: dict[tuple, list[int]] = {}
    for i, x in enumerate(xs):
        key = (x.shape, x.device) if shared else (i,)
        alike.setdefault(key, []).append(i)
    outs: list[Tensor] = [None] * len(xs)  # type: ignore[list-item]
    for group in alike.values():
        if len(group) == 1:
            outs[group[0]] = torch.empty_like(xs[group[0]], dtype=dtype)
            continue
        first = xs[group[0]]
        block = torch.empty((len(group), *first.shape), dtype=dtype, device=first.device)
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
    would. Differentiable twice (the backward is made of differentiable operators), and in
    forward mode (:meth:`jvp`, ``torch.autograd.forward_ad``)."""

    @staticmethod
    def forward(ctx: Any, with_bias: tuple[int, ...], scale_of: tuple[int, ...],
                dtype: torch.dtype | None, *tensors: Tensor) -> tuple[Tensor, ...]:
        n, nb = len(scale_of), len(with_bias)
        weights, biases, scales = tensors[:n], tensors[n:n + nb], tensors[n + nb:]
        ctx.with_bias, ctx.scale_of = with_bias, scale_of
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*tensors)
        ctx.save_for_forward(*tensors)
        ctx.dtype = dtype
        columns = [s[:, None] for s in scales]  # one view per distinct scale tensor
        cols = [columns[j] for j in scale_of]
        rows = [scales[scale_of[i]] for i in with_bias]
        if dtype is None:
            folded_w = torch._foreach_mul(weights, cols)
            folded_b = torch._foreach_mul(biases, rows) if biases else []
        else:  # the product rounded to dtype as it is stored: one kernel (on a GPU) per map
            shared = forward_ad._current_level < 0  # views of one block: no forward AD
            folded_w = _products_in(weights, cols, dtype, shared=shared)
            folded_b = _products_in(biases, rows, dtype, shared=shared)
        return (*folded_w, *folded_b)

    @staticmethod
    def jvp(ctx: Any, *tangents: Tensor | None) -> tuple[Tensor, ...]:
        """Forward-mode derivative: (s_i W_i)˙ = ṡ_i W_i + s_i Ẇ_i, likewise for the biases
        (a missing tangent is zero), in the folds' dtype."""
        with_bias, scale_of = ctx.with_bias, ctx.scale_of
        n, nb = len(scale_of), len(with_bias)
        tensors = ctx.saved_tensors
        weights, biases, scales = tensors[:n], tensors[n:n + nb], tensors[n + nb:]
        dots = tangents[3:]
        dot_w, dot_b, dot_s = dots[:n], dots[n:n + nb], dots[n + nb:]

        def tangent(x: Tensor, dot_x: Tensor | None, j: int, column: bool) -> Tensor:
            s, dot = scales[j], dot_s[j]
            if column:
                s, dot = s[:, None], (None if dot is None else dot[:, None])
            out = torch.zeros_like(x) if dot_x is None else s * dot_x
            if dot is not None:
                out = out + dot * x
            return out if ctx.dtype is None else out.to(ctx.dtype)

        return (*(tangent(weights[i], dot_w[i], scale_of[i], True) for i in range(n)),
                *(tangent(biases[k], dot_b[k], scale_of[i], False)
                  for k, i in enumerate(with_bias)))

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
