"""The Sparse Transformer's fixed pattern (``sparse_fixed``; Child et al. 2019 §4.3, seed_002
B.4) against softmax attention written out query by query over the keep-set

    A¹_i ∪ A²_i = {j : ⌊j/l⌋ = ⌊i/l⌋} ∪ {j : j mod l ∈ {l−c, …, l−1}}

and, with ``summary_heads="split"``, head h's keep-set A¹_i ∪ A²_{i,h} with
A²_{i,h} = {j : j mod l ∈ {l − c·(h′+1), …, l − c·h′ − 1}}, h′ = h mod (l // c), built here
from those definitions (causality and padding on top), in float64."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from graded import TransformerConfig, TransformerLM
from graded.attention import MultiheadAttention
from graded.attention.backends import get_backend
from graded.attention.backends.fixed import summary_offsets
from graded.attention.backends.flex import pattern_block_mask
from pattern_reference import (
    LoopBackend,
    assert_same_values_and_gradients,
    decode_in_steps,
    dense_reference,
    loop_attention,
    padding,
    qkv,
    tiles,
)


def admits(block, summary):
    """The keep-set of the definition, in every head h: the same block, or a summary column."""
    return lambda h, i, j: i // block == j // block or j % block >= block - summary


def admits_split(block, summary):
    """Head h's keep-set: the same block, or a column of sub-block h mod (l // c) counted from
    the block's end."""
    def rule(h, i, j):
        sub = h % (block // summary)
        return (i // block == j // block
                or block - summary * (sub + 1) <= j % block < block - summary * sub)
    return rule








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
    assert_same_values_and_gradients(out, ref, (q, k, v))


# (T, block l, summary c, heads H): heads cycling through l // c = 2 sub-blocks (H = 3), as
# many sub-blocks as heads, c = 1, c = l (one sub-block: the shared pattern), l > T, l = 1
SPLIT_SHAPES = [(13, 4, 2, 3), (12, 6, 2, 3), (11, 4, 1, 4), (7, 4, 4, 2), (5, 8, 2, 2),
                (6, 1, 1, 2)]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("t,block,summary,heads", SPLIT_SHAPES)
def test_split_summary_heads_equal_the_loop_over_each_heads_keep_set_forward_and_gradients(
        t, block, summary, heads, causal, padded):
    q, k, v = qkv(t, grad=True, heads=heads)
    pad = padding(t, padded)
    backend = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split")
    out = backend(q, k, v, key_padding_mask=pad if padded else None, is_causal=causal)
    ref = loop_attention(q, k, v, pad, admits_split(block, summary), causal)
    assert_same_values_and_gradients(out, ref, (q, k, v))


def test_split_head_zero_is_the_shared_pattern_and_the_other_heads_differ():
    """Head 0 takes the last c positions, as every head does when shared; head 1 does not."""
    q, k, v = qkv(16, seed=4)
    shared = get_backend("sparse_fixed", block=4, summary=2)(q, k, v, is_causal=True)
    split = get_backend("sparse_fixed", block=4, summary=2, summary_heads="split")(
        q, k, v, is_causal=True)
    torch.testing.assert_close(split[:, 0], shared[:, 0], rtol=0, atol=0)
    assert (split[:, 1] - shared[:, 1]).abs().max() > 0.1


def test_summary_offsets_worked_example_block_8_summary_2():
    """l = 8, c = 2: four sub-blocks, from the block's end: {6, 7}, {4, 5}, {2, 3}, {0, 1};
    a fifth head starts over."""
    assert summary_offsets(8, 2).tolist() == [[6, 7]]
    assert summary_offsets(8, 2, heads=5).tolist() == [[6, 7], [4, 5], [2, 3], [0, 1], [6, 7]]


def test_split_keep_set_worked_example_block_4_summary_1():
    """l = 4, c = 1, four heads on the offsets 3, 2, 1, 0. Causal position 9 of head 1 sees
    its block's past {8, 9} and the earlier positions with offset 2, {2, 6}; non-causal
    position 1 of head 2 sees its block {0..3} and the offset-1 positions {5, 9}."""
    backend = get_backend("sparse_fixed", block=4, summary=1, summary_heads="split")
    causal = backend.pattern_keep(12, True, heads=4)
    assert causal[1, 9].nonzero().flatten().tolist() == [2, 6, 8, 9]
    assert causal[3, 11].nonzero().flatten().tolist() == [0, 4, 8, 9, 10, 11]
    bidirectional = backend.pattern_keep(12, False, heads=4)
    assert bidirectional[2, 1].nonzero().flatten().tolist() == [0, 1, 2, 3, 5, 9]
    rule = admits_split(4, 1)
    want = torch.tensor([[[rule(h, i, j) for j in range(12)] for i in range(12)]
                         for h in range(4)])
    assert torch.equal(bidirectional, want)
    assert torch.equal(causal, want & torch.ones(12, 12, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="sparse_fixed backend: each head has its own keep-set"):
        backend.pattern_keep(12, True)


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
    want = torch.tensor([[rule(0, i, j) for j in range(12)] for i in range(12)])
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


@pytest.mark.parametrize("summary_heads", ["shared", "split"])
def test_the_forward_pass_saves_no_t_by_t_tensor(summary_heads):
    """Cost O(T·(l + T·c/l)): at T = 64, l = 8, c = 1 each query scores 8 + 8 keys, and no
    tensor autograd keeps has T·T entries per head (split: per-head summary keys, 4 heads)."""
    t, block, summary = 64, 8, 1
    q, k, v = qkv(t, grad=True, heads=4)
    sizes = []

    def pack(x):
        sizes.append(x.numel() // (x.shape[0] * x.shape[1]) if x.dim() >= 2 else x.numel())
        return x

    backend = get_backend("sparse_fixed", block=block, summary=summary,
                          summary_heads=summary_heads)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        backend(q, k, v, key_padding_mask=padding(t, True), is_causal=True)
    assert max(sizes) <= t * (block + t // block * summary) < t * t


@pytest.mark.parametrize("summary_heads", ["shared", "split"])
@pytest.mark.parametrize("steps", [(1,) * 11, (4, 1, 3, 2, 1)])
def test_decoding_step_by_step_equals_the_causal_pass(steps, summary_heads):
    t = sum(steps)
    q, k, v = qkv(t, seed=3, heads=4)  # split: heads on the offsets 2, 1, 0, 2
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, :2] = True  # a left-padded row
    pad[0, 5] = True  # a padded summary position
    backend = get_backend("sparse_fixed", block=3, summary=1, summary_heads=summary_heads)
    want = backend(q, k, v, key_padding_mask=pad, is_causal=True)
    got, state = decode_in_steps(backend, q, k, v, pad, steps)
    assert state.length == t
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    rule = admits(3, 1) if summary_heads == "shared" else admits_split(3, 1)
    torch.testing.assert_close(want, loop_attention(q, k, v, pad, rule, True))


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_split_flex_kernel_on_cpu_equals_the_masked_softmax_per_head(causal, padded):
    """FlexAttention (eager on CPU, forward only) with the per-head mask_mod equals softmax
    attention under each head's keep-set written out as a dense mask."""
    t, block, summary, heads = 40, 8, 2, 5  # four sub-blocks, the fifth head on the first
    q, k, v = qkv(t, seed=5, d=8, heads=heads)
    pad = padding(t, padded)
    backend = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split",
                          kernel="flex")
    assert backend.uses_flex(q, k, v, 0.0)
    with torch.no_grad():
        out = backend(q, k, v, key_padding_mask=pad if padded else None, is_causal=causal)
    rule = admits_split(block, summary)
    ref = dense_reference(q, k, v, pad, rule, causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    native = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split",
                         kernel="native")
    torch.testing.assert_close(
        native(q, k, v, key_padding_mask=pad if padded else None, is_causal=causal), ref,
        rtol=1e-12, atol=1e-12)




@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_split_block_mask_per_head_is_torchs_and_read_as_the_gpu_reads_it_gives_the_pattern(
        causal):
    """The eager CPU kernel reads only the mask_mod, so the per-head tile lists the GPU kernel
    skips by are checked apart: equal to ``create_block_mask`` evaluated per head, and full
    tiles taken whole with partial tiles through mask_mod give each head's pattern. l = 32,
    c = 8 on 16-wide tiles: head 0's summary columns fill the second tile of a block, head 2's
    the first, so the heads' tile lists differ."""
    t, block, summary, heads, size = 100, 32, 8, 4, 16
    backend = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split",
                          kernel="flex")
    ours = pattern_block_mask(backend.keep_rule(t, causal, torch.device("cpu")), t, causal,
                              "cpu", block_size=size, heads=heads)
    theirs = create_block_mask(ours.mask_mod, None, heads, t, t, device="cpu", BLOCK_SIZE=size)
    partial = tiles(ours.kv_num_blocks, ours.kv_indices)
    full = tiles(ours.full_kv_num_blocks, ours.full_kv_indices)
    assert torch.equal(partial, tiles(theirs.kv_num_blocks, theirs.kv_indices))
    assert torch.equal(full, tiles(theirs.full_kv_num_blocks, theirs.full_kv_indices))
    assert not torch.equal(partial[0] | full[0], partial[2] | full[2])
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    expand = lambda x: x.repeat_interleave(size, -2).repeat_interleave(size, -1)[..., :t, :t]  # noqa: E731
    by_mod = torch.stack([ours.mask_mod(None, torch.tensor(h), i, j) for h in range(heads)])
    read = (expand(partial) & by_mod) | expand(full)
    assert torch.equal(read, backend.pattern_keep(t, causal, heads=heads))
    assert backend.block_mask(t, causal, "cpu", heads).kv_num_blocks.shape == (1, heads, 1)


@pytest.mark.parametrize("summary_heads", ["shared", "split"])
def test_config_option_builds_a_graded_lm_that_equals_the_written_out_pattern(summary_heads):
    """TransformerConfig(attn_backend="sparse_fixed", attn_backend_options=...) reaches every
    layer; with EGT grading per head (C5, applied before the backend) the logits equal the same
    model with the pattern written out, and each cached step's logits equal the full pass."""
    options = {"block": 3, "summary": 1, "summary_heads": summary_heads}
    cfg = TransformerConfig(vocab_size=11, d_model=12, n_heads=3, n_layers=2, max_len=16,
                            attn_backend="sparse_fixed", attn_backend_options=options,
                            grading="exponential", grade_init="warm_start",
                            grade_init_value=0.3, grades_per_head=True)
    torch.manual_seed(0)
    lm = TransformerLM(cfg).double().eval()
    attns = [m for m in lm.modules() if isinstance(m, MultiheadAttention)]
    assert [(m.backend.block, m.backend.summary, m.backend.summary_heads)
            for m in attns] == [(3, 1, summary_heads)] * 2
    ids = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = lm(ids)
        cache = lm.new_cache()
        steps = [lm(ids[:, :4], cache=cache)] + [lm(ids[:, s:s + 1], cache=cache)
                                                 for s in range(4, 10)]
        torch.testing.assert_close(torch.cat(steps, dim=1), got, rtol=1e-10, atol=1e-10)
        rule = (admits if summary_heads == "shared" else admits_split)(3, 1)
        for m in attns:
            m.backend = LoopBackend(rule)
        want = lm(ids)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("options,message", [
    ({"block": 0}, "block must be a positive int, got 0"),
    ({"block": True}, "block must be a positive int, got True"),
    ({"block": 4, "summary": 0}, r"summary must be an int in \[1, block=4\], got 0"),
    ({"block": 4, "summary": 5}, r"summary must be an int in \[1, block=4\], got 5"),
    ({"block": 4, "summary": 1.0}, r"summary must be an int in \[1, block=4\], got 1.0"),
    ({"summary_heads": "per_head"},
     "summary_heads must be one of 'shared', 'split', got 'per_head'"),
    ({"summary_heads": None}, "summary_heads must be one of 'shared', 'split', got None"),
    ({"block": 6, "summary": 4, "summary_heads": "split"},
     r"summary_heads='split' needs summary to divide block \(the heads take the block's "
     r"block // summary sub-blocks\), got block=6, summary=4"),
])
def test_bad_block_or_summary_is_refused_naming_the_value(options, message):
    with pytest.raises(ValueError, match="sparse_fixed backend: " + message):
        get_backend("sparse_fixed", **options)


@pytest.mark.parametrize("summary_heads", ["shared", "split"])
def test_captured_weights_of_a_split_lm_keep_each_heads_pattern_and_give_its_output(
        summary_heads):
    """capture_attention records the weights a pattern backend computes from its keep-set,
    per head when the heads differ: zero outside head h's pattern, and weights · V is the
    head's output."""
    from graded.analysis import capture_attention

    block, summary = 3, 1
    cfg = TransformerConfig(vocab_size=11, d_model=12, n_heads=3, n_layers=1, max_len=16,
                            attn_backend="sparse_fixed",
                            attn_backend_options={"block": block, "summary": summary,
                                                  "summary_heads": summary_heads})
    torch.manual_seed(0)
    lm = TransformerLM(cfg).double().eval()
    ids = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), capture_attention(lm) as calls:
        lm(ids)
    (call,) = calls
    rule = (admits if summary_heads == "shared" else admits_split)(block, summary)
    t = ids.shape[1]
    want = torch.tensor([[[rule(h, i, j) and j <= i for j in range(t)] for i in range(t)]
                         for h in range(3)])
    assert torch.equal(call.pattern.expand(3, t, t), want)
    assert torch.equal(call.weights != 0, want.expand_as(call.weights))
    torch.testing.assert_close(call.weights @ call.v, call.heads, rtol=1e-10, atol=1e-10)
