"""The GPU kernels of the long-sequence backends, checked on CPU.

FlexAttention (the pattern backends' ``kernel="flex"``) runs eagerly on CPU, inference only:
torch's CPU FlexAttention has no backward, so the pattern backends are compared in the forward
pass (float64), and a CPU call that needs gradients is shown to take the native path. The eager
CPU kernel reads only the ``mask_mod``, not the BlockMask's tile lists, so the tile lists the
GPU kernel skips by are checked on their own: against ``create_block_mask`` and by rebuilding
the mask the way the GPU kernel reads it. ``chunked``'s fused kernel
(``scaled_dot_product_attention``) has a CPU backward: forward and gradients are compared.

Every reference is softmax attention under a mask built here from the pattern's definition.
"""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from graded import TransformerConfig, TransformerLM
from graded.attention.backends import chunked as chunked_module
from graded.attention.backends import flex as flex_module
from graded.attention.backends import get_backend
from graded.attention.backends.flex import pattern_block_mask

T = 150  # two 128-position FlexAttention tiles, the second one partial
LAYOUT = torch.rand(10, 10, generator=torch.Generator().manual_seed(3)) > 0.5
LAYOUT[2] = False  # a query block with no key block: its rows give zeros


def masked_softmax_attention(q, k, v, keep, scale):
    s = (q @ k.transpose(-2, -1)) * scale
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def bigbird_rule(backend, t, causal):
    """BigBird's keep-set (Zaheer et al. 2020, App. D) from its drawn random blocks."""
    b, g = backend.block_size, backend.num_global_blocks
    rand = backend.random_blocks(-(-t // b), causal)

    def rule(i, j):
        bi, bj = i // b, j // b
        chosen = (rand[bi.squeeze(1)][:, :, None] == bj[None]).any(dim=1)
        return (bi < g) | (bj < g) | ((bi - bj).abs() <= backend.window_blocks // 2) | chosen

    return rule


# name -> (options, keep rule on positions i (T, 1), j (1, T) written from the definition)
CASES = {
    "sliding_window": ({"window": 3}, lambda i, j: (i - j).abs() <= 3),
    "dilated-2": ({"dilation": 2}, lambda i, j: (i - j) % 2 == 0),
    "dilated-3-window": ({"dilation": 3, "window": 4},
                         lambda i, j: ((i - j) % 3 == 0) & ((i - j).abs() <= 12)),
    "sparse_fixed": ({"block": 12, "summary": 3},
                     lambda i, j: (i // 12 == j // 12) | (j % 12 >= 9)),
    "block_sparse": ({"layout": LAYOUT, "block_size": 16},
                     lambda i, j: LAYOUT[i // 16, j // 16]),
    "bigbird": ({"block_size": 8, "num_global_blocks": 1, "num_random_blocks": 2, "seed": 4},
                None),
}


def make(case, kernel):
    options, rule = CASES[case]
    backend = get_backend(case.split("-")[0], kernel=kernel, **options)
    return backend, rule


def reference_keep(case, backend, rule, t, causal):
    if rule is None:
        rule = bigbird_rule(backend, t, causal)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    keep = rule(i, j) & torch.ones(t, t, dtype=torch.bool)
    return keep & (j <= i) if causal else keep


def inputs(seed=0, t=T):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, t, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, t, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, t, 6, generator=g, dtype=torch.float64)
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, t - 23:] = True
    pad[1, :5] = True
    return q, k, v, pad


# 0.5 to 1 s a case on 2 cores: causal and padded together in the default run, the other
# three combinations of each pattern with `pytest -m slow`
@pytest.mark.parametrize(("causal", "padded"), [
    pytest.param(c, p, id=f"{c}-{p}", marks=[] if c and p else [pytest.mark.slow])
    for c in (False, True) for p in (False, True)])
@pytest.mark.parametrize("case", list(CASES))
def test_flex_kernel_equals_masked_attention_and_native_kernel(case, causal, padded):
    flex, rule = make(case, "flex")
    native, _ = make(case, "native")
    q, k, v, pad = inputs()
    pad = pad if padded else None
    assert flex.uses_flex(q, k, v, 0.0)
    out = flex(q, k, v, key_padding_mask=pad, is_causal=causal)
    keep = reference_keep(case, flex, rule, T, causal)
    if padded:
        keep = keep & ~pad[:, None, None, :]
    ref = masked_softmax_attention(q, k, v, keep, 8**-0.5)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, native(q, k, v, key_padding_mask=pad, is_causal=causal),
                               rtol=1e-12, atol=1e-12)


def test_flex_kernel_respects_scale_and_float32():
    flex = get_backend("sliding_window", window=5, scale=0.7, kernel="flex")
    q, k, v, pad = (x.float() if x.is_floating_point() else x for x in inputs(1))
    out = flex(q, k, v, key_padding_mask=pad, is_causal=True)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    keep = ((i - j).abs() <= 5) & (j <= i) & ~pad[:, None, None, :]
    ref = masked_softmax_attention(q.double(), k.double(), v.double(), keep, 0.7)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)  # float32 rounding


@pytest.mark.parametrize("block", [16, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_block_mask_equals_create_block_mask(case, causal, block, monkeypatch):
    """The tile lists built row by row equal torch's, built from the dense mask."""
    monkeypatch.setattr(flex_module, "_TILE_ELEMENTS", 1)  # one tile row per step
    backend, _ = make(case, "flex")
    keep = backend.keep_rule(T, causal, torch.device("cpu"))
    ours = pattern_block_mask(keep, T, causal, "cpu", block_size=block)
    theirs = create_block_mask(ours.mask_mod, None, None, T, T, device="cpu", BLOCK_SIZE=block)
    assert ours.seq_lengths == theirs.seq_lengths == (T, T)
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        assert torch.equal(tiles(getattr(ours, num), getattr(ours, idx)),
                           tiles(getattr(theirs, num), getattr(theirs, idx)))


def tiles(num, idx):
    """(nQ, nK) bool: the tiles a BlockMask lists per query tile row."""
    num, idx = num[0, 0], idx[0, 0]
    dense = torch.zeros(idx.shape, dtype=torch.bool)
    for r in range(num.shape[0]):
        dense[r, idx[r, : num[r]].long()] = True
    return dense


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_block_mask_read_as_the_gpu_kernel_reads_it_gives_the_pattern(case, causal):
    """Full tiles taken whole, partial tiles through mask_mod, unlisted tiles skipped: the
    pattern, so skipping tiles loses no kept pair."""
    backend, rule = make(case, "flex")
    block = 16
    mask = pattern_block_mask(backend.keep_rule(T, causal, torch.device("cpu")), T, causal,
                              "cpu", block_size=block)
    partial = tiles(mask.kv_num_blocks, mask.kv_indices)
    full = tiles(mask.full_kv_num_blocks, mask.full_kv_indices)
    assert not (partial & full).any()
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    by_mod = mask.mask_mod(None, None, i, j) & torch.ones(T, T, dtype=torch.bool)
    expand = lambda x: x.repeat_interleave(block, 0).repeat_interleave(block, 1)[:T, :T]  # noqa: E731
    read = (expand(partial) & by_mod) | expand(full)
    assert torch.equal(read, reference_keep(case, backend, rule, T, causal))


def test_block_mask_is_cached_per_length_causal_and_device():
    backend, _ = make("sliding_window", "flex")
    a = backend.block_mask(T, True, "cpu")
    assert backend.block_mask(T, True, torch.device("cpu")) is a
    assert backend.block_mask(T, False, "cpu") is not a
    assert backend.block_mask(T - 1, True, "cpu").seq_lengths == (T - 1, T - 1)


def test_flex_kernel_choice_auto_native_dropout_and_cpu_gradients():
    """auto is native on CPU; flex runs without a backward on CPU and without dropout, and
    falls back to the native kernel otherwise (outputs and gradients equal the reference)."""
    q, k, v, pad = inputs(2)
    assert not make("sliding_window", "auto")[0].uses_flex(q, k, v, 0.0)
    assert not make("sliding_window", "native")[0].uses_flex(q, k, v, 0.0)
    flex, rule = make("dilated-3-window", "flex")
    assert flex.uses_flex(q, k, v, 0.0)
    assert not flex.uses_flex(q, k, v, 0.1)
    q.requires_grad_(True)
    assert not flex.uses_flex(q, k, v, 0.0)
    with torch.no_grad():
        assert flex.uses_flex(q, k, v, 0.0)
        out = flex(q, k, v, key_padding_mask=pad, is_causal=True)  # inputs needing grad
    keep = reference_keep("dilated-3-window", flex, rule, T, True) & ~pad[:, None, None, :]
    ref = masked_softmax_attention(q, k, v, keep, 8**-0.5)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    out = flex(q, k, v, key_padding_mask=pad, is_causal=True)  # native: it has a backward
    grad = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, q, grad)[0],
                               torch.autograd.grad(ref, q, grad)[0])


@pytest.mark.parametrize("name,options,choices", [
    ("sliding_window", {"window": 3}, "'auto', 'flex', 'native'"),
    ("dilated", {}, "'auto', 'flex', 'native'"),
    ("sparse_fixed", {}, "'auto', 'flex', 'native'"),
    ("block_sparse", {"layout": [[True]]}, "'auto', 'flex', 'native'"),
    ("bigbird", {}, "'auto', 'flex', 'native'"),
    ("chunked", {}, "'auto', 'fused', 'native'"),
])
@pytest.mark.parametrize("bad", ["triton", "FLEX", None])
def test_bad_kernel_names_the_value_and_the_choices(name, options, choices, bad):
    with pytest.raises(ValueError, match=f"{name} backend: kernel must be one of {choices}, "
                                         f"got {bad!r}"):
        get_backend(name, kernel=bad, **options)


def test_kernel_option_flows_from_the_config():
    """attn_backend_options carry the kernel; flex and native give the same LM and the same
    cached generation."""
    def lm(kernel):
        cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=2, max_len=64,
                                attn_backend="sliding_window",
                                attn_backend_options={"window": 3, "kernel": kernel})
        torch.manual_seed(0)
        return TransformerLM(cfg).double().eval()

    flex, native = lm("flex"), lm("native")
    assert {m.kernel for m in flex.modules() if hasattr(m, "uses_flex")} == {"flex"}
    ids = torch.randint(0, 11, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(flex(ids), native(ids), rtol=1e-10, atol=1e-10)
        assert torch.equal(flex.generate(ids[:, :20], 5, use_cache=True),
                           native.generate(ids[:, :20], 5, use_cache=True))
    with pytest.raises(ValueError, match="kernel must be one of"):
        lm("cuda")


# ---------------------------------------------------------------- chunked: the fused kernel

CHUNKED_CALLS = {  # name -> (Tq, Tk, causal, padding)
    "plain": (40, 40, False, False),
    "padded": (40, 40, False, True),
    "causal": (40, 40, True, False),
    "causal-cache": (13, 40, True, False),  # bottom-right aligned, Tq < Tk
    "decode-step-padded": (1, 40, True, True),  # one query sees every key: causality is void
    "cross-padded": (17, 40, False, True),
}


@pytest.mark.parametrize("call", list(CHUNKED_CALLS))
def test_chunked_fused_kernel_equals_masked_attention_and_chunk_loop(call, monkeypatch):
    t_q, t_k, causal, padded = CHUNKED_CALLS[call]
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, t_q, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, t_k, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, t_k, 6, generator=g, dtype=torch.float64, requires_grad=True)
    pad = None
    keep = torch.ones(1, 1, t_q, t_k, dtype=torch.bool)
    if padded:
        pad = torch.zeros(2, t_k, dtype=torch.bool)
        pad[0, 30:] = True
        pad[1] = True  # every key padded: that batch row returns zeros
        keep = keep & ~pad[:, None, None, :]
    if causal:
        i, j = torch.arange(t_q)[:, None] + t_k - t_q, torch.arange(t_k)[None, :]
        keep = keep & (j <= i)
    calls, fused = [], chunked_module.fused_attention
    monkeypatch.setattr(chunked_module, "fused_attention",
                        lambda *a, **kw: calls.append(1) or fused(*a, **kw))
    fused_backend = get_backend("chunked", query_chunk=7, key_chunk=9, kernel="fused")
    loop = get_backend("chunked", query_chunk=7, key_chunk=9, kernel="native")
    out = fused_backend(q, k, v, key_padding_mask=pad, is_causal=causal)
    assert calls == [1]
    ref = masked_softmax_attention(q, k, v, keep, 8**-0.5)
    chunks = loop(q, k, v, key_padding_mask=pad, is_causal=causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, chunks, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    for a, b, c in zip(torch.autograd.grad(out, (q, k, v), grad),
                       torch.autograd.grad(ref, (q, k, v), grad),
                       torch.autograd.grad(chunks, (q, k, v), grad)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-10)


def test_chunked_keeps_the_chunk_loop_where_the_fused_kernel_is_not_exact(monkeypatch):
    """A custom score, an additive bias (ALiBi), a keep-mask, causal with padding and causal
    with Tq > Tk run the loop even with kernel='fused'; auto runs the loop on CPU."""
    def refuse(*args, **kwargs):
        raise AssertionError("the fused kernel ran")

    monkeypatch.setattr(chunked_module, "fused_attention", refuse)
    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(1, 2, t, 4, generator=g, dtype=torch.float64) for t in (6, 6))
    pad = torch.zeros(1, 6, dtype=torch.bool)
    pad[0, 4:] = True
    backend = get_backend("chunked", query_chunk=4, key_chunk=4, kernel="fused")
    native = get_backend("chunked", query_chunk=4, key_chunk=4, kernel="native")
    score = lambda a, b: -torch.cdist(a, b)  # noqa: E731
    for kwargs in (
        {"score": score},
        {"attn_mask": torch.randn(6, 6, generator=g, dtype=torch.float64)},
        {"attn_mask": torch.rand(6, 6, generator=g) > 0.3},
        {"key_padding_mask": pad, "is_causal": True},
    ):
        torch.testing.assert_close(backend(q, k, k, **kwargs), native(q, k, k, **kwargs))
    backend(q, k[:, :, :3], k[:, :, :3], is_causal=True)  # Tq > Tk
    get_backend("chunked", kernel="auto")(q, k, k)  # CPU
