"""Properties of folding a diagonal grading into a linear map (``graded.folding``).

Every fold is checked against the unfolded formula (W (in·x) + b)·out computed directly:
``fold_rows`` and ``_FoldRows`` (forward, backward, double backward, forward mode) against
diag(s) W and s·b, under ``gradcheck``/``gradgradcheck`` in float64 and against autograd on
the formula elsewhere; ``graded_linear`` against ``F.linear`` of the scaled input times the
output scales; ``FoldedLinears`` against ``fold_rows`` of each map, in any order of asks.
Shapes include one-row and zero-row inputs and maps with one input or one output; scale
tensors may be shared by several maps (one gradient summed over their uses), tensors may
need no gradient, outputs may get no gradient (None in the backward).

Tolerances. float64: the folded and unfolded forms differ by a few roundings of 2^-53, far
below gradcheck's 1e-6. Lower precision: a value y = Σ_k s_o W_k s_i x_k + s_o b computed in
two orders differs by at most (in + 4) roundings of each term's magnitude (the fold or the
scaling of the activations, the products, the sum, the bias, the output scale), so the bound
is (in + 4)·eps·(Σ_k |s_o W_k s_i x_k| + |s_o b|), eps the dtype's unit roundoff (2^-8 in
bfloat16, 2^-11 in float16, 2^-24 in float32).
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

from graded.folding import FoldedLinears, fold_rows, folds_rows, graded_linear

F64 = torch.float64
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)
FEW = settings(max_examples=20, deadline=None, derandomize=True)
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8,
                 torch.float16: 2.0**-11}


@st.composite
def fold_problems(draw, max_maps: int = 3):
    """Maps (out × in, bias or not), the scale tensor each uses (shared ones drawn), and which
    tensors need a gradient (at least one)."""
    n = draw(st.integers(1, max_maps))
    outs = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    ins = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    biases = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    # map i uses scale tensor owner[i], an earlier map's when their out sizes agree
    owner = []
    for i in range(n):
        same = [j for j in range(i) if owner[j] == j and outs[j] == outs[i]]
        owner.append(draw(st.sampled_from([*same, i])))
    count = 2 * n + n  # weights, biases, scales
    needs = draw(st.lists(st.booleans(), min_size=count, max_size=count).filter(any))
    seed = draw(st.integers(0, 2**16))
    return outs, ins, biases, owner, needs, seed


def _build(problem, dtype=F64):
    outs, ins, biases, owner, needs, seed = problem
    gen = torch.Generator().manual_seed(seed)
    n = len(outs)
    weights = [torch.randn(o, i, generator=gen, dtype=F64).to(dtype) for o, i in zip(outs, ins)]
    biases_t = [torch.randn(o, generator=gen, dtype=F64).to(dtype) if b else None
                for o, b in zip(outs, biases)]
    scales = {j: (torch.rand(outs[j], generator=gen, dtype=F64) + 0.5).to(dtype)
              for j in sorted(set(owner))}
    for t, need in zip(weights + biases_t + [scales.get(j) for j in range(n)], needs):
        if t is not None and need:
            t.requires_grad_()
    if not any(t.requires_grad for t in weights + biases_t + list(scales.values())
               if t is not None):
        weights[0].requires_grad_()
    return weights, biases_t, scales


def _leaves(weights, biases, scales):
    return [t for t in weights + biases + list(scales.values())
            if t is not None and t.requires_grad]


def _outputs(pairs):
    return [t for pair in pairs for t in pair if t is not None]


def _formula(weights, biases, scales, owner):
    """diag(s_i) W_i and s_i·b_i written out."""
    return [(scales[j][:, None] * w, None if b is None else scales[j] * b)
            for w, b, j in zip(weights, biases, owner)]


@SETTINGS
@given(problem=fold_problems())
def test_fold_rows_equals_the_row_scaling_and_passes_gradcheck_twice_and_forward(problem):
    owner = problem[3]
    weights, biases, scales = _build(problem)
    got = _outputs(fold_rows(list(zip(weights, biases)), [scales[j] for j in owner]))
    want = _outputs(_formula(weights, biases, scales, owner))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)  # the same product in float64, bit for bit

    leaves = _leaves(weights, biases, scales)

    def fold(*values):
        swap = dict(zip(map(id, leaves), values))
        ws = [swap.get(id(w), w) for w in weights]
        bs = [None if b is None else swap.get(id(b), b) for b in biases]
        ss = {j: swap.get(id(s), s) for j, s in scales.items()}
        return tuple(_outputs(fold_rows(list(zip(ws, bs)), [ss[j] for j in owner])))

    # backward (with outputs that get no gradient: check_undefined_grad) and forward mode
    assert gradcheck(fold, leaves, check_forward_ad=True)
    assert gradgradcheck(fold, leaves)


@st.composite
def narrow_problems(draw):
    problem = draw(fold_problems())
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    used = draw(st.lists(st.booleans(), min_size=6, max_size=6))  # outputs in the loss
    return problem, dtype, used


@FEW
@given(case=narrow_problems())
def test_fold_rows_under_autocast_is_the_cast_of_the_float32_fold_and_its_gradient(case):
    """Under CPU autocast the folds of float32 maps are made in the autocast dtype: s·W rounded
    once, the value of ``(s·W).to(dtype)`` exactly, and the gradients are autograd's of that
    cast (float32 products of the narrow gradients: equal up to float32 rounding)."""
    problem, dtype, used = case
    owner = problem[3]
    weights, biases, scales = _build(problem, torch.float32)
    with torch.autocast("cpu", dtype=dtype):
        got = _outputs(fold_rows(list(zip(weights, biases)), [scales[j] for j in owner]))
    want = [t.to(dtype) for t in _outputs(_formula(weights, biases, scales, owner))]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        assert torch.equal(g, w)
    gen = torch.Generator().manual_seed(problem[-1])
    cotangents = [torch.randn(t.shape, generator=gen).to(dtype) for t in got]
    chosen = [k for k in range(len(got)) if used[k % len(used)]] or [0]
    leaves = _leaves(weights, biases, scales)
    if not any(want[k].requires_grad for k in chosen):
        return  # no chosen output depends on a tensor that needs a gradient
    loss = sum((got[k].float() * cotangents[k].float()).sum() for k in chosen)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    loss = sum((want[k].float() * cotangents[k].float()).sum() for k in chosen)
    expected = torch.autograd.grad(loss, leaves, allow_unused=True)
    for g, e in zip(grads, expected, strict=True):
        if e is None:
            assert g is None or not g.any()
            continue
        assert g is not None and g.dtype == e.dtype == torch.float32
        torch.testing.assert_close(g, e, rtol=4 * UNIT_ROUNDOFF[torch.float32], atol=1e-6)


@FEW
@given(case=narrow_problems(), with_tangent=st.lists(st.booleans(), min_size=3, max_size=3))
@example(case=(([2, 2], [3, 3], [False, True], [0, 0], [True] * 6, 0), torch.bfloat16,
               [True] * 6), with_tangent=[True, True, True])
def test_forward_mode_fold_equals_the_derivative_of_the_row_scaling(case, with_tangent):
    """(s W)˙ = ṡ W + s Ẇ (a missing tangent is zero), in float64 and, under autocast, rounded
    to the autocast dtype. The example is two maps of one shape under autocast, whose folds
    were views of one block: forward AD failed there on an internal assertion of torch."""
    problem, dtype, _ = case
    owner = problem[3]
    for autocast_dtype in (None, dtype):
        compute = F64 if autocast_dtype is None else torch.float32
        weights, biases, scales = _build(problem, compute)
        gen = torch.Generator().manual_seed(problem[-1] + 1)

        def tangent(t, on, gen=gen, compute=compute):
            return torch.randn(t.shape, generator=gen, dtype=compute) if on else None

        dots_w = [tangent(w, with_tangent[0]) for w in weights]
        dots_b = [None if b is None else tangent(b, with_tangent[1]) for b in biases]
        dots_s = {j: tangent(s, with_tangent[2]) for j, s in scales.items()}
        with forward_ad.dual_level():
            def dual(t, dot):
                return t if dot is None else forward_ad.make_dual(t.detach(), dot)

            ws = [dual(w, d) for w, d in zip(weights, dots_w)]
            bs = [None if b is None else dual(b, d) for b, d in zip(biases, dots_b)]
            ss = {j: dual(s, dots_s[j]) for j, s in scales.items()}
            with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                                enabled=autocast_dtype is not None):
                folds = fold_rows(list(zip(ws, bs)), [ss[j] for j in owner])
            got = [(forward_ad.unpack_dual(w).tangent,
                    None if b is None else forward_ad.unpack_dual(b).tangent) for w, b in folds]

        def zero(dot, t):
            return torch.zeros_like(t) if dot is None else dot

        for (gw, gb), w, b, dw, db, j in zip(got, weights, biases, dots_w, dots_b, owner):
            s, ds = scales[j].detach(), zero(dots_s[j], scales[j])
            want_w = ds[:, None] * w.detach() + s[:, None] * zero(dw, w)
            pairs = [(gw, want_w)]
            if b is not None:
                pairs.append((gb, ds * b.detach() + s * zero(db, b)))
            for g, want in pairs:
                if g is None:  # no tangent reached this fold: its derivative is zero
                    assert not want.any()
                    continue
                if autocast_dtype is None:
                    torch.testing.assert_close(g, want, rtol=0, atol=1e-15)
                else:  # float32 products rounded once to the narrow dtype
                    assert g.dtype == autocast_dtype
                    torch.testing.assert_close(g.float(), want.to(autocast_dtype).float(),
                                               rtol=UNIT_ROUNDOFF[autocast_dtype], atol=1e-6)


@st.composite
def linear_problems(draw):
    lead = draw(st.sampled_from([(), (0,), (1,), (2,), (1, 3), (2, 0), (4,)]))
    n_in = draw(st.integers(1, 4))
    n_out = draw(st.integers(1, 4))
    bias, use_out, use_in = (draw(st.booleans()) for _ in range(3))
    seed = draw(st.integers(0, 2**16))
    return lead, n_in, n_out, bias, use_out, use_in, seed


def _linear_inputs(problem, dtype):
    lead, n_in, n_out, bias, use_out, use_in, seed = problem
    gen = torch.Generator().manual_seed(seed)

    def make(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).to(dtype).requires_grad_()

    x = make(*lead, n_in) if lead != () else make(n_in)
    w = make(n_out, n_in)
    b = make(n_out) if bias else None
    out_s = (torch.rand(n_out, generator=gen, dtype=F64) + 0.5).to(dtype).requires_grad_()
    in_s = (torch.rand(n_in, generator=gen, dtype=F64) + 0.5).to(dtype).requires_grad_()
    return x, w, b, (out_s if use_out else None), (in_s if use_in else None)


def _linear_formula(x, w, b, out_s, in_s):
    y = F.linear(x if in_s is None else x * in_s, w, b)
    return y if out_s is None else y * out_s


@SETTINGS
@given(problem=linear_problems())
@example(problem=((0,), 1, 1, True, True, True, 0))  # no rows: nothing folded
@example(problem=((1,), 1, 3, True, True, True, 1))  # one row, one input: out folds
def test_graded_linear_equals_the_formula_in_float64_with_gradients(problem):
    x, w, b, out_s, in_s = _linear_inputs(problem, F64)
    rows = x.numel() // x.shape[-1]
    assert folds_rows(w, x) == (w.shape[1] <= rows)
    got = graded_linear(x, w, b, out_scales=out_s, in_scales=in_s)
    want = _linear_formula(x, w, b, out_s, in_s)
    assert got.shape == want.shape and got.dtype == F64
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
    leaves = [t for t in (x, w, b, out_s, in_s) if t is not None]
    if got.numel() == 0:  # no rows: every gradient is zero (of the right shape)
        grads = torch.autograd.grad(got.sum(), leaves, allow_unused=True, materialize_grads=True)
        assert all(g.shape == t.shape and not g.any() for g, t in zip(grads, leaves))
        return
    cot = torch.randn_like(got)
    grads = torch.autograd.grad((got * cot).sum(), leaves, create_graph=True)
    expected = torch.autograd.grad((want * cot).sum(), leaves, create_graph=True)
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-13, atol=1e-13)
    second = torch.autograd.grad(sum(g.sum() for g in grads), leaves, allow_unused=True,
                                 materialize_grads=True)
    second_want = torch.autograd.grad(sum(e.sum() for e in expected), leaves,
                                      allow_unused=True, materialize_grads=True)
    for g, e in zip(second, second_want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-13, atol=1e-13)


def _bound(x, w, b, out_s, in_s, eps: float) -> torch.Tensor:
    """(in + 4)·eps·(Σ_k |s_o W_k s_i x_k| + |s_o b|), in float64 (see the module docstring)."""
    x, w = x.detach().double(), w.detach().double()
    if in_s is not None:
        x = x * in_s.detach().double()
    mag = x.abs() @ w.abs().T + (0 if b is None else b.detach().double().abs())
    if out_s is not None:
        mag = mag * out_s.detach().double()
    return (w.shape[1] + 4) * eps * mag


@FEW
@given(problem=linear_problems(),
       mode=st.sampled_from(["float32", "bfloat16", "autocast-bfloat16", "autocast-float16"]))
def test_graded_linear_in_lower_precision_is_the_formula_within_its_rounding(problem, mode):
    """float32 and bfloat16 tensors, and float32 tensors under CPU autocast: graded_linear's
    value is the formula's within the rounding bound; under autocast its dtype is the
    autocast dtype (F.linear's), whichever form it takes."""
    autocast = mode.startswith("autocast")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(mode, torch.float32)
    narrow = torch.bfloat16 if mode.endswith("bfloat16") else torch.float16
    x, w, b, out_s, in_s = _linear_inputs(problem, dtype)
    with torch.autocast("cpu", dtype=narrow, enabled=autocast):
        got = graded_linear(x, w, b, out_scales=out_s, in_scales=in_s)
    exact = _linear_formula(*(None if t is None else t.detach().double()
                              for t in (x, w, b, out_s, in_s)))
    assert got.dtype == (narrow if autocast else dtype)
    eps = UNIT_ROUNDOFF[narrow if autocast else dtype]
    # the exact value within the rounding bound; the formula computed in the same dtype
    # is within it too, so the two forms differ by at most twice that
    assert bool(((got.double() - exact).abs() <= _bound(x, w, b, out_s, in_s, eps)).all())
    if got.numel():
        got.float().sum().backward()
        for t in (x, w, b, out_s, in_s):
            assert t is None or (t.grad is not None and torch.isfinite(t.grad).all())


@FEW
@given(problem=fold_problems(max_maps=4),
       asks=st.lists(st.integers(0, 3), min_size=1, max_size=6),
       previous=st.booleans())
def test_folded_linears_hand_out_each_maps_fold_in_any_order_of_asks(problem, asks, previous):
    """``fold(i)``, asked in any order and any number of times, is map i's fold diag(s_i) W_i,
    s_i·b_i, with the gradients of the formula summed over every use (float64)."""
    owner = problem[3]
    weights, biases, scales = _build(problem)
    n = len(weights)
    asks = [a % n for a in asks]
    saved = FoldedLinears.previous_form
    try:
        FoldedLinears.previous_form = previous
        batch = FoldedLinears(list(zip(weights, biases)),
                              lambda which: [scales[owner[j]] for j in which])
        got = [(i, batch.fold(i)) for i in asks]
    finally:
        FoldedLinears.previous_form = saved
    want = _formula(weights, biases, scales, owner)
    for i, (fw, fb) in got:
        assert torch.equal(fw, want[i][0])
        assert (fb is None) == (want[i][1] is None)
        assert fb is None or torch.equal(fb, want[i][1])
    leaves = _leaves(weights, biases, scales)
    pieces = [t for _, pair in got for t in pair if t is not None]
    plain = [t for i, _ in got for t in want[i] if t is not None]
    if not any(t.requires_grad for t in plain):
        return
    loss = sum((t * (k + 1)).sum() for k, t in enumerate(pieces))
    grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
    loss = sum((t * (k + 1)).sum() for k, t in enumerate(plain))
    expected = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-14, atol=1e-14)
