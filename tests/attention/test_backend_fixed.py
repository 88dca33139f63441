"""The Sparse Transformer's fixed pattern (``sparse_fixed``; Child et al. 2019 §4.3, seed_002
B.4) against softmax attention written out query by query over the keep-set

    A¹_i ∪ A²_i = {j : ⌊j/l⌋ = ⌊i/l⌋} ∪ {j : j mod l ∈ {l−c, …, l−1}}

built here from that definition (causality and padding on top), in float64."""

import pytest
import torch
from torch import nn

from graded import TransformerConfig, TransformerLM
from graded.attention import MultiheadAttention
from graded.attention.backends import get_backend


def admits(block, summary):
    """The keep-set of the definition: the same block, or a summary column."""
    return lambda i, j: i // block == j // block or j % block >= block - summary


def loop_attention(q, k, v, pad, rule, causal, scale=None):
    """o_i = softmax over the admitted, unpadded keys j (j ≤ i when causal) of q_i·k_j·scale,
    one batch row and query at a time (every head at once); zeros where no key is left."""
    b_, _, t, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    rows = []
    for b in range(b_):
        outs = []
        for i in range(t):
            keys = [j for j in range(t) if rule(i, j) and not pad[b, j] and (j <= i or not causal)]
            if not keys:
                outs.append(torch.zeros_like(v[b, :, 0]))
                continue
            w = torch.softmax(q[b, :, i, None] @ k[b, :, keys].transpose(-2, -1) * scale, -1)
            outs.append((w @ v[b, :, keys])[:, 0])
        rows.append(torch.stack(outs, dim=1))
    return torch.stack(rows)


def qkv(t, seed=0, d=4, dv=3, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 2, t, d, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 2, t, dv, generator=g, dtype=torch.float64)
    return [x.requires_grad_(grad) for x in (q, k, v)]


def padding(t, padded):
    pad = torch.zeros(2, t, dtype=torch.bool)
    if padded:
        pad[1, t - 4:] = True  # trailing padding, summary columns among it
        pad[0, 1] = True
    return pad


# (T, block l, summary c): T a multiple of l and not, one summary column and several, c = l
# (A² is every key: full attention), l = 1, and l > T (one partial block)
SHAPES = [(12, 4, 1), (13, 4, 2), (11, 3, 3), (7, 1, 1), (6, 8, 3)]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("t,block,summary", SHAPES)
def test_sparse_fixed_equals_the_loop_over_its_keep_set_forward_and_gradients(
        t, block, summary, causal, padded):
    q, k, v = qkv(t, grad=True)
    pad = padding(t, padded)
    backend = get_backend("sparse_fixed", block=block, summary=summary)
    out = backend(q, k, v, key_padding_mask=pad if padded else None, is_causal=causal)
    ref = loop_attention(q, k, v, pad, admits(block, summary), causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad),
                    torch.autograd.grad(ref, (q, k, v), grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_keep_set_worked_example_block_4_summary_1():
    """l = 4, c = 1: the summary positions are 3, 7, 11. Causal position 9 sees its block's
    past {8, 9} and the earlier summaries {3, 7}; non-causal position 1 sees its block {0..3}
    and every summary {3, 7, 11}."""
    backend = get_backend("sparse_fixed", block=4, summary=1)
    causal = backend.pattern_keep(12, True)
    assert causal[9].nonzero().flatten().tolist() == [3, 7, 8, 9]
    assert causal[3].nonzero().flatten().tolist() == [0, 1, 2, 3]
    bidirectional = backend.pattern_keep(12, False)
    assert bidirectional[1].nonzero().flatten().tolist() == [0, 1, 2, 3, 7, 11]
    rule = admits(4, 1)
    want = torch.tensor([[rule(i, j) for j in range(12)] for i in range(12)])
    assert torch.equal(bidirectional, want)
    assert torch.equal(causal, want & torch.ones(12, 12, dtype=torch.bool).tril())


def test_zero_scores_give_the_mean_of_the_admitted_values():
    """With QKᵀ = 0 the weights are uniform over the keep-set (003 §2 Exercise 2)."""
    _, k, v = qkv(10, seed=1)
    q = torch.zeros_like(k)
    out = get_backend("sparse_fixed", block=3, summary=1)(q, k, v, is_causal=True)
    assert torch.allclose(out[:, :, 7], v[:, :, [2, 5, 6, 7]].mean(dim=2))
    assert torch.allclose(out[:, :, 2], v[:, :, [0, 1, 2]].mean(dim=2))


def test_scale_is_the_softmax_temperature():
    q, k, v = qkv(9, seed=2)
    pad = padding(9, True)
    out = get_backend("sparse_fixed", block=3, summary=2, scale=0.3)(
        q, k, v, key_padding_mask=pad, is_causal=True)
    torch.testing.assert_close(out, loop_attention(q, k, v, pad, admits(3, 2), True, 0.3))


def test_the_forward_pass_saves_no_t_by_t_tensor():
    """Cost O(T·(l + T·c/l)): at T = 64, l = 8, c = 1 each query scores 8 + 8 keys, and no
    tensor autograd keeps has T·T entries per head."""
    t, block, summary = 64, 8, 1
    q, k, v = qkv(t, grad=True)
    sizes = []

    def pack(x):
        sizes.append(x.numel() // (x.shape[0] * x.shape[1]) if x.dim() >= 2 else x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        get_backend("sparse_fixed", block=block, summary=summary)(q, k, v, is_causal=True)
    assert max(sizes) <= t * (block + t // block * summary) < t * t


@pytest.mark.parametrize("steps", [(1,) * 11, (4, 1, 3, 2, 1)])
def test_decoding_step_by_step_equals_the_causal_pass(steps):
    t = sum(steps)
    q, k, v = qkv(t, seed=3)
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, :2] = True  # a left-padded row
    pad[0, 5] = True  # a padded summary position
    backend = get_backend("sparse_fixed", block=3, summary=1)
    want = backend(q, k, v, key_padding_mask=pad, is_causal=True)
    state, start, outs = None, 0, []
    for n in steps:
        part = slice(start, start + n)
        out, state = backend.decode(q[:, :, part], k[:, :, part], v[:, :, part], state,
                                    key_padding_mask=pad[:, part])
        outs.append(out)
        start += n
    assert state.length == t
    torch.testing.assert_close(torch.cat(outs, dim=2), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(want, loop_attention(q, k, v, pad, admits(3, 1), True))


class PatternReference(nn.Module):
    """Softmax attention under the keep-set written out per position (no backend machinery)."""

    def __init__(self, block, summary):
        super().__init__()
        self.rule = admits(block, summary)

    def forward(self, q, k, v, *, key_padding_mask=None, attn_mask=None, is_causal=False,
                dropout_p=0.0):
        pad = (torch.zeros(q.shape[0], k.shape[2], dtype=torch.bool)
               if key_padding_mask is None else key_padding_mask)
        return loop_attention(q, k, v, pad, self.rule, is_causal)


def test_config_option_builds_a_graded_lm_that_equals_the_written_out_pattern():
    """TransformerConfig(attn_backend="sparse_fixed", attn_backend_options=...) reaches every
    layer; with EGT grading per head (C5, applied before the backend) the logits equal the same
    model with the pattern written out, and cached generation equals uncached."""
    options = {"block": 3, "summary": 1}
    cfg = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=2, max_len=16,
                            attn_backend="sparse_fixed", attn_backend_options=options,
                            grading="exponential", grade_init="warm_start",
                            grade_init_value=0.3, grades_per_head=True)
    torch.manual_seed(0)
    lm = TransformerLM(cfg).double().eval()
    attns = [m for m in lm.modules() if isinstance(m, MultiheadAttention)]
    assert [(m.backend.block, m.backend.summary) for m in attns] == [(3, 1)] * 2
    ids = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = lm(ids)
        for m in attns:
            m.backend = PatternReference(**options)
        want = lm(ids)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("options,message", [
    ({"block": 0}, "block must be a positive int, got 0"),
    ({"block": True}, "block must be a positive int, got True"),
    ({"block": 4, "summary": 0}, r"summary must be an int in \[1, block=4\], got 0"),
    ({"block": 4, "summary": 5}, r"summary must be an int in \[1, block=4\], got 5"),
    ({"block": 4, "summary": 1.0}, r"summary must be an int in \[1, block=4\], got 1.0"),
])
def test_bad_block_or_summary_is_refused_naming_the_value(options, message):
    with pytest.raises(ValueError, match="sparse_fixed backend: " + message):
        get_backend("sparse_fixed", **options)
