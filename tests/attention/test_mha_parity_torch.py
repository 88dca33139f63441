"""graded.MultiheadAttention against torch.nn.MultiheadAttention over the arguments torch takes.

Parameters are copied from a torch module; float64 outputs, attention weights, and the
gradients of inputs, float masks and parameters must agree to rounding. In float32 and
bfloat16, ours and torch's module both round, differently (ours takes the fused kernel or a
float32 softmax where torch's module takes ``baddbmm``), so neither equals the other: each is
compared with the float64 computation, and ours may be off by at most twice torch's own error
(plus a few units in the last place). Where the two differ on purpose (a query with no
admissible key, ``is_causal`` without a mask), the test states what ours gives and why.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from torch import nn

from graded.attention import MultiheadAttention

E, H = 8, 2
B, L, S = 2, 3, 4
F64 = torch.float64


def pair(dtype=F64, **kwargs):
    """A torch module and ours with the same parameters."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, dtype=dtype, **kwargs)
    ours = MultiheadAttention(E, H, dtype=dtype, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def run(module, args, kwargs, same=False, weights_loss=True):
    """Output, weights, gradients of the inputs, of the float masks and of the parameters
    (of the loss |out|² + |weights|², or |out|² alone without ``weights_loss``)."""
    inputs = [a.detach().clone().requires_grad_() for a in args]
    if same:
        inputs = [inputs[0]] * 3
    masks = {k: v.detach().clone().requires_grad_() if torch.is_tensor(v)
             and v.is_floating_point() else v for k, v in kwargs.items()}
    module.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on mixed mask types
        out, w = module(*inputs, **masks)
    loss = out.square().sum()
    (loss + w.square().sum() if w is not None and weights_loss else loss).backward()
    mask_grads = {k: v.grad for k, v in masks.items() if torch.is_tensor(v) and v.requires_grad}
    return (out, w, [i.grad for i in inputs], mask_grads,
            {n: p.grad for n, p in module.named_parameters()})


def assert_equal_f64(got, expected, what):
    out, w, gin, gmask, gpar = got
    out_r, w_r, gin_r, gmask_r, gpar_r = expected

    def close(a, b, name):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9, msg=f"{what}: {name}")

    close(out, out_r, "output")
    assert (w is None) == (w_r is None), what
    if w is not None:
        close(w, w_r, "weights")
    for i, (a, b) in enumerate(zip(gin, gin_r, strict=True)):
        close(a, b, f"gradient of input {i}")
    assert gmask.keys() == gmask_r.keys(), what
    for k in gmask:
        close(gmask[k], gmask_r[k], f"gradient of {k}")
    assert list(gpar) == list(gpar_r), what
    for k in gpar:
        close(gpar[k], gpar_r[k], f"gradient of {k}")


def inputs(layout, kdim, t_q=L, t_k=S):
    """query, key, value in the layout: "batch_first", "seq_first", or 2-D for "unbatched"
    (a module built with batch_first=False) and "unbatched, batch_first" (True)."""
    def make(t, d):
        if layout.startswith("unbatched"):
            return torch.randn(t, d, dtype=F64)
        return torch.randn(B, t, d, dtype=F64) if layout == "batch_first" else \
            torch.randn(t, B, d, dtype=F64)

    return make(t_q, E), make(t_k, kdim), make(t_k, kdim)


def mask_cases(batch, t_q=L, t_k=S):
    """Every mask torch's module takes: attn_mask bool/float, 2-D/3-D (B·H, L, S);
    key_padding_mask bool/float; the mixtures. No query loses every key (that case differs
    on purpose, below)."""
    gen = torch.Generator().manual_seed(1)
    keep_first = torch.arange(t_k) == 0
    bool2 = (torch.rand(t_q, t_k, generator=gen) > 0.5) & ~keep_first
    bool3 = (torch.rand(batch * H, t_q, t_k, generator=gen) > 0.5) & ~keep_first
    float2 = torch.randn(t_q, t_k, generator=gen, dtype=F64)
    float3 = torch.randn(batch * H, t_q, t_k, generator=gen, dtype=F64)
    kpm = torch.zeros(batch, t_k, dtype=torch.bool)
    kpm[-1, 2:] = True
    kpm_float = torch.zeros(batch, t_k, dtype=F64).masked_fill(kpm, -3.0)
    causal = torch.triu(torch.ones(t_q, t_k, dtype=torch.bool), 1)
    cases = {
        "none": {}, "bool 2-D": {"attn_mask": bool2}, "bool 3-D": {"attn_mask": bool3},
        "float 2-D": {"attn_mask": float2}, "float 3-D": {"attn_mask": float3},
        "padding bool": {"key_padding_mask": kpm},
        "padding float": {"key_padding_mask": kpm_float},
        "padding bool, float mask": {"key_padding_mask": kpm, "attn_mask": float3},
        "padding float, bool mask": {"key_padding_mask": kpm_float, "attn_mask": bool2},
        "causal mask with is_causal": {"attn_mask": causal, "is_causal": True},
        "causal mask with is_causal and padding": {"attn_mask": causal, "is_causal": True,
                                                   "key_padding_mask": kpm},
    }
    return cases


LAYOUTS = ["batch_first", "seq_first", "unbatched", "unbatched, batch_first"]
MODULE_OPTIONS = [dict(kdim=kdim, vdim=vdim, bias=bias, add_bias_kv=bkv, add_zero_attn=zero)
                  for (kdim, vdim), bias, bkv, zero in itertools.product(
                      [(None, None), (6, 6), (6, 5)], [True, False], [False, True],
                      [False, True])]
SWITCHES = [dict(need_weights=True, average_attn_weights=True),
            dict(need_weights=True, average_attn_weights=False),
            dict(need_weights=False)]


def _id(options):
    return ",".join(f"{k}={v}" for k, v in options.items() if v not in (None, False)) or "plain"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("options", MODULE_OPTIONS, ids=_id)
def test_every_mask_and_switch_equals_torch_in_float64(layout, options):
    """Outputs, weights and the gradients of inputs, float masks and parameters equal torch's
    (outputs and weights in eval under inference mode too) for every mask torch takes, each
    way of returning weights, every optional parameter, and query length != key length;
    ``is_causal`` with its causal mask in every combination but the one torch's fused path
    serves differently (appended keys, no weights, no padding: below)."""
    ref, ours = pair(batch_first=layout.endswith("batch_first"), **options)
    kdim, vdim = options["kdim"] or E, options["vdim"] or E
    q, k, _ = inputs(layout, kdim)
    v = inputs(layout, vdim)[2]
    batch = 0 if layout.startswith("unbatched") else B
    appended = options["add_bias_kv"] or options["add_zero_attn"]
    for (name, masks), switches in itertools.product(mask_cases(batch or 1).items(), SWITCHES):
        if batch == 0 and "key_padding_mask" in masks:
            masks = dict(masks, key_padding_mask=masks["key_padding_mask"][0])
        if (appended and masks.get("is_causal") and not switches["need_weights"]
                and "key_padding_mask" not in masks):
            continue  # torch's fused path hides the appended key: tested below
        kwargs = {**masks, **switches}
        what = f"{layout}, {options}, {name}, {switches}"
        assert_equal_f64(run(ours, (q, k, v), kwargs), run(ref, (q, k, v), kwargs), what)
        ref.eval()
        ours.eval()
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected, got = ref(q, k, v, **kwargs), ours(q, k, v, **kwargs)
        ref.train()
        ours.train()
        torch.testing.assert_close(got[0], expected[0], atol=1e-11, rtol=1e-9, msg=what)
        if switches["need_weights"]:
            torch.testing.assert_close(got[1], expected[1], atol=1e-11, rtol=1e-9, msg=what)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("options", [dict(), dict(add_bias_kv=True), dict(add_zero_attn=True),
                                     dict(bias=False)], ids=_id)
@pytest.mark.parametrize("switches", SWITCHES, ids=["weights", "per-head", "no weights"])
def test_self_attention_on_one_tensor_equals_torch_in_training_and_in_eval(layout, options,
                                                                          switches):
    """query is key is value (torch's packed projection, and in eval under no_grad its
    native fast path when batch first): outputs and weights equal torch's, with and without a
    padding mask; gradients equal in training."""
    ref, ours = pair(batch_first=layout.endswith("batch_first"), **options)
    x = inputs(layout, E)[0]
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[0, 1:] = True
    kpm = kpm[0] if layout.startswith("unbatched") else kpm
    for masks in ({}, {"key_padding_mask": kpm}):
        kwargs = {**masks, **switches}
        assert_equal_f64(run(ours, (x, x, x), kwargs, same=True),
                         run(ref, (x, x, x), kwargs, same=True), f"{layout} {masks}")
        for module in (ref, ours):
            module.eval()
        with torch.inference_mode():
            expected, got = ref(x, x, x, **kwargs), ours(x, x, x, **kwargs)
        for module in (ref, ours):
            module.train()
        torch.testing.assert_close(got[0], expected[0], atol=1e-11, rtol=1e-9)
        assert (got[1] is None) == (expected[1] is None)
        if got[1] is not None:
            torch.testing.assert_close(got[1], expected[1], atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("t_q,t_k", [(4, 3), (3, 5), (4, 4)])
def test_is_causal_with_its_mask_follows_the_mask_as_torch_does(t_q, t_k, need_weights):
    """``is_causal=True`` beside a causal ``attn_mask`` is a hint: the result is the mask's,
    as torch's module gives it on both of its paths (the weights path applies the mask; the
    fused path the kernel's top-left causal mask, the same one). With more queries than keys
    the mask was intersected with the bottom-right causal mask, which hid every key from the
    first t_q - t_k queries: their output was the output projection's bias, silently."""
    ref, ours = pair(batch_first=True)
    q = torch.randn(B, t_q, E, dtype=F64)
    kv = torch.randn(B, t_k, E, dtype=F64)
    causal = torch.triu(torch.ones(t_q, t_k, dtype=torch.bool), 1)
    kwargs = dict(attn_mask=causal, is_causal=True, need_weights=need_weights)
    assert_equal_f64(run(ours, (q, kv, kv), kwargs), run(ref, (q, kv, kv), kwargs),
                     f"t_q={t_q}, t_k={t_k}")
    # and the same as the mask alone
    alone = ours(q, kv, kv, attn_mask=causal, need_weights=need_weights)[0]
    torch.testing.assert_close(ours(q, kv, kv, **kwargs)[0], alone, atol=0.0, rtol=0.0)


@pytest.mark.parametrize("need_weights", [True, False])
def test_is_causal_with_a_mask_that_is_not_causal_follows_the_mask(need_weights):
    """Deliberate, where torch disagrees with itself: a mask that lets a query see a later key,
    with ``is_causal=True``. torch applies the mask where it applies one (weights requested,
    or padding: its default path) and drops it for the kernel's causal mask otherwise; ours
    applies the mask on every path, so its result does not depend on ``need_weights``."""
    ref, ours = pair(batch_first=True)
    x = torch.randn(B, 4, E, dtype=F64)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[:, 0] = True  # no query sees key 0; every query sees its future
    expected = run(ref, (x, x, x), dict(attn_mask=mask, need_weights=True), same=True)
    got = run(ours, (x, x, x), dict(attn_mask=mask, is_causal=True, need_weights=True),
              same=True)
    assert_equal_f64(got, expected, "weights")
    out = ours(x, x, x, attn_mask=mask, is_causal=True, need_weights=need_weights)[0]
    torch.testing.assert_close(out, expected[0], atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("options", [dict(add_bias_kv=True), dict(add_zero_attn=True)], ids=_id)
def test_is_causal_with_appended_keys_shows_them_to_every_query_as_torchs_weights_path(options):
    """Deliberate: with ``add_bias_kv`` or ``add_zero_attn``, ``is_causal`` and its mask, ours
    pads the mask with a visible column for the appended key on every path, as torch's module
    does when it applies the mask (weights requested, or padding). torch's fused path (no
    weights, no padding) drops the mask for its kernel's causal mask, which hides the appended
    key (the last column) from every query: a result that depends on need_weights."""
    ref, ours = pair(batch_first=True, **options)
    x = torch.randn(B, L, E, dtype=F64)
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    with_weights = ref(x, x, x, attn_mask=causal, is_causal=True, need_weights=True)[0]
    fused = ref(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
    assert not torch.allclose(with_weights, fused)  # torch disagrees with itself here
    for need_weights in (True, False):
        got = ours(x, x, x, attn_mask=causal, is_causal=True, need_weights=need_weights)[0]
        torch.testing.assert_close(got, with_weights, atol=1e-11, rtol=1e-9)


def test_is_causal_without_a_mask_is_aligned_bottom_right():
    """Deliberate: torch's module refuses ``is_causal`` without a mask; ours builds the mask,
    bottom-right aligned (query i sees keys up to t_k - t_q + i, as after cached keys), so
    it equals torch with that mask, and with torch's top-left mask when t_q = t_k."""
    ref, ours = pair(batch_first=True)
    q = torch.randn(B, 2, E, dtype=F64)
    kv = torch.randn(B, 5, E, dtype=F64)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        ref(q, kv, kv, is_causal=True)
    bottom_right = torch.triu(torch.ones(2, 5, dtype=torch.bool), 5 - 2 + 1)
    for need_weights in (True, False):
        expected = ref(q, kv, kv, attn_mask=bottom_right, need_weights=need_weights)
        got = ours(q, kv, kv, is_causal=True, need_weights=need_weights)
        torch.testing.assert_close(got[0], expected[0], atol=1e-11, rtol=1e-9)
        if need_weights:
            torch.testing.assert_close(got[1], expected[1], atol=1e-11, rtol=1e-9)


def _every_key_masked():
    """Mask cases in which query 1 of every sequence, and every query of the last sequence,
    has no admissible key."""
    row = torch.zeros(L, L, dtype=torch.bool)
    row[1] = True
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[-1] = True
    neg = float("-inf")
    return {
        "attn bool": {"attn_mask": row},
        "attn float": {"attn_mask": torch.zeros(L, L, dtype=F64).masked_fill(row, neg)},
        "padding bool": {"key_padding_mask": kpm},
        "padding float": {"key_padding_mask": torch.zeros(B, L, dtype=F64)
                          .masked_fill(kpm, neg)},
    }


@pytest.mark.parametrize("case", list(_every_key_masked()))
def test_a_query_with_every_key_masked_gets_zero_heads_on_every_path(case):
    """Deliberate: a query that may attend to no key gets zero attention weights and zero heads
    (its output is the output projection's bias), with finite gradients, whether weights are
    requested or not, in training and in eval. That is torch's own result on the path of
    ``scaled_dot_product_attention`` (``need_weights=False`` with autograd on), compared here
    outputs and gradients alike. torch's softmax path (weights requested) gives NaN for the
    row, and its backward spreads the NaN to every parameter; its native fast path in eval
    under inference mode gives NaN for a boolean mask and zeros for a float one."""
    masks = _every_key_masked()[case]
    ref, ours = pair(batch_first=True)
    x = torch.randn(B, L, E, dtype=F64)
    sdpa = run(ref, (x, x, x), dict(masks, need_weights=False), same=True)
    nan_out, nan_w = ref(x, x, x, need_weights=True, **masks)
    assert nan_out.isnan().any() and nan_w.isnan().any()  # torch's softmax path
    for need_weights in (True, False):
        got = run(ours, (x, x, x), dict(masks, need_weights=need_weights), same=True,
                  weights_loss=False)
        # what torch's fused path gives (it returns no weights: ours are checked below)
        assert_equal_f64((*got[:1], None, *got[2:]), (*sdpa[:1], None, *sdpa[2:]), case)
        bias = ours.out_proj.bias.detach()
        dead_out = got[0][-1] if "padding" in case else got[0][:, 1]
        torch.testing.assert_close(dead_out, bias.expand_as(dead_out))
        if need_weights:
            dead = got[1][-1] if "padding" in case else got[1][:, 1]
            assert torch.equal(dead, torch.zeros_like(dead))
            live = got[1][0] if "padding" in case else got[1][:, 0]
            torch.testing.assert_close(live.sum(-1), torch.ones(live.shape[:-1], dtype=F64))
        assert all(torch.isfinite(g).all() for g in got[4].values())
    ref.eval()
    ours.eval()
    with torch.inference_mode():
        fast = ref(x, x, x, need_weights=False, **masks)[0]  # torch's native fast path
        assert fast.isnan().any() if "bool" in case else torch.allclose(fast, sdpa[0])
        torch.testing.assert_close(ours(x, x, x, need_weights=False, **masks)[0], sdpa[0])


@pytest.mark.parametrize("t_q,t_k", [(0, 3), (3, 0), (0, 0)])
@pytest.mark.parametrize("options", [dict(), dict(add_bias_kv=True), dict(add_zero_attn=True)],
                         ids=_id)
@pytest.mark.parametrize("need_weights", [True, False])
def test_empty_sequences_equal_torch(t_q, t_k, options, need_weights):
    """An empty query gives an empty output; an empty key sequence zero heads (no key at all),
    or attention to the appended key alone: as torch, gradients included."""
    ref, ours = pair(batch_first=True, **options)
    q = torch.randn(B, t_q, E, dtype=F64)
    kv = torch.randn(B, t_k, E, dtype=F64)
    kwargs = dict(need_weights=need_weights)
    assert_equal_f64(run(ours, (q, kv, kv), kwargs), run(ref, (q, kv, kv), kwargs),
                     f"t_q={t_q}, t_k={t_k}")


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("masks", ["none", "causal", "padding"])
def test_dropout_in_training_equals_torch_for_the_same_seed(need_weights, average, masks):
    """Dropout draws as torch's module: on the weights after the softmax when they are
    returned (the returned weights are the dropped ones, as torch's), inside the fused kernel
    otherwise; with one seed, outputs, weights and gradients are torch's."""
    ref, ours = pair(batch_first=True, dropout=0.4)
    x = torch.randn(B, 5, E, dtype=F64)
    kwargs = dict(need_weights=need_weights, average_attn_weights=average)
    if masks == "causal":
        kwargs.update(attn_mask=torch.triu(torch.ones(5, 5, dtype=torch.bool), 1),
                      is_causal=True)
    elif masks == "padding":
        kwargs.update(key_padding_mask=torch.tensor([[False] * 5, [False] * 3 + [True] * 2]))
    results = []
    for module in (ref, ours):
        torch.manual_seed(7)
        results.append(run(module, (x, x, x), kwargs, same=True))
    assert_equal_f64(results[1], results[0], str(kwargs))
    if need_weights:  # dropout did act
        assert (results[1][1] == 0).any()


def test_dropout_is_off_in_eval():
    ref, ours = pair(batch_first=True, dropout=0.4)
    ref.eval()
    ours.eval()
    x = torch.randn(B, 5, E, dtype=F64)
    for need_weights in (True, False):
        torch.testing.assert_close(ours(x, x, x, need_weights=need_weights)[0],
                                   ref(x, x, x, need_weights=need_weights)[0],
                                   atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("masks", ["none", "bool", "float", "padding"])
@pytest.mark.parametrize("add_bias_kv", [False, True])
def test_low_precision_error_is_within_twice_torchs_own(dtype, need_weights, masks,
                                                        add_bias_kv):
    """In float32 and bfloat16, the error of ours against the float64 computation (output,
    input gradient, in_proj_weight gradient) is at most twice torch's module's own error
    against it plus 4 units in the last place of the largest value: the tolerance is torch's
    rounding, not a constant. (Measured: 0.64-1.43 times torch's error; exactly torch's
    output without weights, where both take the same fused kernel.)"""
    e = 32
    torch.manual_seed(0)
    exact = nn.MultiheadAttention(e, H, dtype=F64, batch_first=True, add_bias_kv=add_bias_kv)
    ref = nn.MultiheadAttention(e, H, dtype=dtype, batch_first=True, add_bias_kv=add_bias_kv)
    ours = MultiheadAttention(e, H, dtype=dtype, batch_first=True, add_bias_kv=add_bias_kv)
    ref.load_state_dict(exact.state_dict())
    ours.load_state_dict(exact.state_dict())
    x = torch.randn(3, 17, e, dtype=F64)
    kwargs = dict(need_weights=need_weights)
    gen = torch.Generator().manual_seed(2)
    if masks == "bool":
        kwargs["attn_mask"] = (torch.rand(17, 17, generator=gen) > 0.5).fill_diagonal_(False)
    elif masks == "float":
        kwargs["attn_mask"] = torch.randn(17, 17, generator=gen, dtype=F64)
    elif masks == "padding":
        kwargs["key_padding_mask"] = torch.zeros(3, 17, dtype=torch.bool)
        kwargs["key_padding_mask"][0, 9:] = True

    def measure(module):
        d = module.in_proj_weight.dtype
        kw = {k: v.to(d) if torch.is_tensor(v) and v.is_floating_point() else v
              for k, v in kwargs.items()}
        xi = x.to(d).detach().requires_grad_()
        out, _ = module(xi, xi, xi, **kw)
        out.float().square().sum().backward()
        return [t.double() for t in (out, xi.grad, module.in_proj_weight.grad)]

    truth, theirs, mine = measure(exact), measure(ref), measure(ours)
    ulp = torch.finfo(dtype).eps
    for name, t, a, b in zip(("output", "input gradient", "in_proj_weight gradient"),
                             truth, theirs, mine, strict=True):
        torch_error = (a - t).abs().max().item()
        our_error = (b - t).abs().max().item()
        bound = 2 * torch_error + 4 * ulp * t.abs().max().item()
        assert our_error <= bound, (name, our_error, torch_error)


@pytest.mark.parametrize("options", [dict(), dict(kdim=6, vdim=5), dict(bias=False),
                                     dict(add_bias_kv=True), dict(kdim=E, vdim=5, bias=False,
                                                                  add_bias_kv=True)], ids=_id)
def test_state_dicts_load_strictly_both_ways_with_torchs_keys_in_torchs_order(options):
    """The docs claim state dicts move both ways: the keys and their order (the optimizer's
    parameter order) are torch's for every layout of the projections, and a torch state dict
    loaded into ours and back gives torch's outputs."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, batch_first=True, dtype=F64, **options)
    ours = MultiheadAttention(E, H, batch_first=True, dtype=F64, **options)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    ours.load_state_dict(ref.state_dict(), strict=True)
    back = nn.MultiheadAttention(E, H, batch_first=True, dtype=F64, **options)
    back.load_state_dict(ours.state_dict(), strict=True)
    q = torch.randn(B, L, E, dtype=F64)
    k = torch.randn(B, S, options.get("kdim") or E, dtype=F64)
    v = torch.randn(B, S, options.get("vdim") or E, dtype=F64)
    for a, b in ((ours, ref), (back, ref)):
        torch.testing.assert_close(a(q, k, v)[0], b(q, k, v)[0], atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("options", [dict(), dict(kdim=6, vdim=5, bias=False, add_bias_kv=True),
                                     dict(add_bias_kv=True, add_zero_attn=True)], ids=_id)
def test_a_seed_gives_torchs_initial_parameters_and_leaves_the_generator_as_torch(options):
    """The same draws in the same order: a model seeded for torch's module starts the same with
    ours, and what it draws next is the same too."""
    torch.manual_seed(3)
    ref = nn.MultiheadAttention(E, H, **options)
    after_ref = torch.rand(4)
    torch.manual_seed(3)
    ours = MultiheadAttention(E, H, **options)
    after_ours = torch.rand(4)
    for (name, a), (_, b) in zip(ref.state_dict().items(), ours.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(after_ref, after_ours)


@pytest.mark.parametrize("need_weights", [True, False])
def test_a_float_mask_of_another_dtype_is_cast_to_the_scores(need_weights):
    """Deliberate: a float32 attn_mask or key_padding_mask beside float64 parameters is cast
    (torch's softmax path refuses it, its fused path takes it): the result is the float64
    mask's."""
    ref, ours = pair(batch_first=True)
    x = torch.randn(B, L, E, dtype=F64)
    mask = torch.randn(L, L, dtype=F64)
    kpm = torch.tensor([[0.0, -1.0, 0.0], [0.0, 0.0, -2.0]], dtype=F64)
    expected = ref(x, x, x, attn_mask=mask, key_padding_mask=kpm, need_weights=need_weights)
    got = ours(x, x, x, attn_mask=mask.float(), key_padding_mask=kpm.float(),
               need_weights=need_weights)
    torch.testing.assert_close(got[0], expected[0], atol=1e-6, rtol=1e-6)


class TestBadInputNamesTheValue:
    """Bad input raises an error that names the value and what was expected."""

    @pytest.mark.parametrize("which", ["query", "key", "value"])
    def test_an_input_in_another_dtype_than_the_parameters(self, which):
        _, ours = pair(batch_first=True)
        args = {n: torch.randn(B, L, E, dtype=F64) for n in ("query", "key", "value")}
        args[which] = args[which].float()
        with pytest.raises(TypeError, match=rf"{which} has dtype torch.float32, but the "
                                            r"attention's parameters are torch.float64"):
            ours(args["query"], args["key"], args["value"])

    def test_an_integer_input(self):
        _, ours = pair(batch_first=True)
        x = torch.ones(B, L, E, dtype=torch.long)
        with pytest.raises(TypeError, match=r"query has dtype torch.int64"):
            ours(x, x, x)

    def test_inputs_in_another_dtype_are_taken_under_autocast(self):
        """autocast casts inputs and weights to its own dtype: no refusal there, as torch."""
        ref, ours = pair(dtype=torch.float32, batch_first=True)
        x = torch.randn(B, L, E, dtype=torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected, got = ref(x, x, x)[0], ours(x, x, x)[0]
        assert got.dtype == expected.dtype == torch.bfloat16
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)

    def test_a_3d_mask_of_the_wrong_batch_times_heads(self):
        _, ours = pair(batch_first=True)
        x = torch.randn(B, L, E, dtype=F64)
        with pytest.raises(ValueError, match=r"attn_mask has shape \(3, 3, 3\); expected "
                                             r"\(3, 3\) or \(4, 3, 3\)"):
            ours(x, x, x, attn_mask=torch.zeros(3, L, L, dtype=torch.bool))

    def test_a_4d_mask(self):
        _, ours = pair(batch_first=True)
        x = torch.randn(B, L, E, dtype=F64)
        with pytest.raises(ValueError, match=r"attn_mask has shape \(2, 2, 3, 3\)"):
            ours(x, x, x, attn_mask=torch.zeros(B, H, L, L, dtype=torch.bool))

    def test_an_unbatched_query_with_a_batched_3d_mask(self):
        """The 3-D mask of an unbatched query is (num_heads, L, S): the error says so, not
        batch*num_heads with a batch the caller never gave."""
        _, ours = pair()
        x = torch.randn(L, E, dtype=F64)
        with pytest.raises(ValueError, match=r"attn_mask has shape \(4, 3, 3\); expected "
                                             r"\(3, 3\) or \(2, 3, 3\) \(num_heads, target, "
                                             r"source, for an unbatched \(2-D\) query\)"):
            ours(x, x, x, attn_mask=torch.zeros(B * H, L, L, dtype=torch.bool))

    def test_an_unbatched_query_with_a_padding_mask_of_another_length(self):
        """Named with the shape given, (4,), not the (1, 4) made of it inside."""
        _, ours = pair()
        x = torch.randn(L, E, dtype=F64)
        with pytest.raises(ValueError, match=r"key_padding_mask has shape \(4,\); expected "
                                             r"\(source length,\) = \(3,\) for an unbatched"):
            ours(x, x, x, key_padding_mask=torch.zeros(L + 1, dtype=torch.bool))

    def test_a_1d_padding_mask_for_a_batched_query(self):
        _, ours = pair(batch_first=True)
        x = torch.randn(B, L, E, dtype=F64)
        with pytest.raises(ValueError, match=r"key_padding_mask has shape \(3,\); expected "
                                             r"\(batch, source length\) = \(2, 3\)"):
            ours(x, x, x, key_padding_mask=torch.zeros(L, dtype=torch.bool))

    @pytest.mark.parametrize("name", ["attn_mask", "key_padding_mask"])
    def test_an_integer_mask(self, name):
        _, ours = pair(batch_first=True)
        x = torch.randn(B, L, E, dtype=F64)
        shape = (L, L) if name == "attn_mask" else (B, L)
        with pytest.raises(TypeError, match=rf"{name} must be a bool or floating tensor, got "
                                            r"dtype torch.uint8"):
            ours(x, x, x, **{name: torch.zeros(shape, dtype=torch.uint8)})

    def test_keys_and_values_of_different_lengths(self):
        _, ours = pair(batch_first=True)
        with pytest.raises(ValueError, match=r"key and value must have the same length; got "
                                             r"shapes \(2, 3, 8\) and \(2, 4, 8\)"):
            ours(torch.randn(B, L, E, dtype=F64), torch.randn(B, L, E, dtype=F64),
                 torch.randn(B, S, E, dtype=F64))

    @pytest.mark.parametrize("dropout", [1.0, -0.1, float("nan")])
    def test_a_dropout_outside_zero_to_one(self, dropout):
        """Deliberate: torch's module takes dropout=1.0 (every weight dropped, the output is the
        output bias); ours refuses it with the other values outside [0, 1)."""
        with pytest.raises(ValueError, match=rf"dropout must be .*got {dropout}"):
            MultiheadAttention(E, H, dropout=dropout)
