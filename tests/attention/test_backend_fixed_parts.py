"""The two halves of the Sparse Transformer's fixed pattern, ``sparse_fixed(part=...)``:
A¹ alone ("local") and A² alone ("summary"), for the interleaved arrangement of Child et al.
(2019, §4.3, approach 1). Each is compared with a per-query loop over the keep-set written out
from the paper's definition, with FlexAttention under that set as a dense mask, and with
step-by-step decoding; part="both" stays the merged head."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from graded.attention.backends import get_backend
from graded.attention.backends.flex import pattern_block_mask
from pattern_reference import (
    assert_same_values_and_gradients,
    decode_in_steps,
    dense_reference,
    loop_attention,
    padding,
    qkv,
    tiles,
)


def local_rule(block, summary):
    """A¹_i = {j : ⌊j/l⌋ = ⌊i/l⌋}, every head."""
    return lambda h, i, j: i // block == j // block


def summary_rule(block, summary, split=False):
    """A²_i = {j : j mod l ∈ summary offsets}: the last c of the block, or with split heads
    head h's sub-block h mod (l // c) counted back from the block's end."""
    def rule(h, i, j):
        sub = h % (block // summary) if split else 0
        return block - summary * (sub + 1) <= j % block < block - summary * sub
    return rule








# (part, summary_heads, rule): "local" ignores summary_heads
PARTS = [
    ("local", "shared", lambda l, c: local_rule(l, c)),
    ("local", "split", lambda l, c: local_rule(l, c)),
    ("summary", "shared", lambda l, c: summary_rule(l, c)),
    ("summary", "split", lambda l, c: summary_rule(l, c, split=True)),
]
# (T, block l, summary c, heads): T a multiple of l and not (13 = 3·4 + 1), heads cycling
# through the sub-blocks (3 heads, 2 sub-blocks), c = 1, l > T
SHAPES = [(12, 4, 2, 3), (13, 4, 2, 3), (11, 3, 1, 2), (6, 8, 4, 2)]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("t,block,summary,heads", SHAPES)
@pytest.mark.parametrize("part,summary_heads,rule", PARTS,
                         ids=[f"{p}-{s}" for p, s, _ in PARTS])
def test_each_part_equals_the_loop_over_its_keep_set_forward_and_gradients(
        part, summary_heads, rule, t, block, summary, heads, causal, padded):
    q, k, v = qkv(t, grad=True, heads=heads)
    pad = padding(t) if padded else torch.zeros(2, t, dtype=torch.bool)
    backend = get_backend("sparse_fixed", block=block, summary=summary,
                          summary_heads=summary_heads, part=part, kernel="native")
    out = backend(q, k, v, key_padding_mask=pad if padded else None, is_causal=causal)
    ref = loop_attention(q, k, v, pad, rule(block, summary), causal)
    assert_same_values_and_gradients(out, ref, (q, k, v))


def test_causal_summary_queries_before_the_first_summary_position_return_zeros():
    """l = 4, c = 1: the first summary position is 3, so queries 0, 1, 2 have no key."""
    q, k, v = qkv(9)
    out = get_backend("sparse_fixed", block=4, summary=1, part="summary")(q, k, v,
                                                                          is_causal=True)
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))
    assert (out[:, :, 3:].abs().sum(-1) > 0).all()
    # query 3..6 see only key 3, so they return v_3
    torch.testing.assert_close(out[:, :, 3:7], v[:, :, 3:4].expand(-1, -1, 4, -1))


def test_part_both_is_the_default_bit_for_bit():
    q, k, v = qkv(13, seed=7, heads=3)
    pad = padding(13)
    for heads_mode in ("shared", "split"):
        for causal in (False, True):
            default = get_backend("sparse_fixed", block=4, summary=2, summary_heads=heads_mode)
            both = get_backend("sparse_fixed", block=4, summary=2, summary_heads=heads_mode,
                               part="both")
            assert torch.equal(both(q, k, v, key_padding_mask=pad, is_causal=causal),
                               default(q, k, v, key_padding_mask=pad, is_causal=causal))


def test_pattern_keep_of_each_part_is_the_written_out_set():
    """keep() (FlexAttention's and decoding's rule): local is shared by the heads whatever
    summary_heads says; summary per head when split; both is their union."""
    t, block, summary, heads = 10, 4, 2, 3
    sets = {p: torch.tensor([[[r(block, summary)(h, i, j) for j in range(t)] for i in range(t)]
                             for h in range(heads)])
            for p, r in (("local", local_rule),
                         ("summary", lambda b, c: summary_rule(b, c, split=True)))}
    local = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split",
                        part="local")
    assert not local.per_head_keep
    assert torch.equal(local.pattern_keep(t, False), sets["local"][0])
    summ = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split",
                       part="summary")
    assert summ.per_head_keep
    assert torch.equal(summ.pattern_keep(t, True, heads=heads), sets["summary"] & torch.ones(
        t, t, dtype=torch.bool).tril())
    both = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split")
    assert torch.equal(both.pattern_keep(t, False, heads=heads),
                       sets["local"] | sets["summary"])


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("part,summary_heads,rule", PARTS,
                         ids=[f"{p}-{s}" for p, s, _ in PARTS])
def test_flex_kernel_on_cpu_equals_the_dense_masked_softmax(part, summary_heads, rule, causal,
                                                            padded):
    """FlexAttention (eager on CPU, forward only) with each part's mask_mod equals softmax
    attention under the written-out keep-set as a dense mask."""
    t, block, summary, heads = 40, 8, 2, 5
    q, k, v = qkv(t, seed=5, d=8, heads=heads)
    pad = padding(t) if padded else torch.zeros(2, t, dtype=torch.bool)
    backend = get_backend("sparse_fixed", block=block, summary=summary,
                          summary_heads=summary_heads, part=part, kernel="flex")
    assert backend.uses_flex(q, k, v, 0.0)
    with torch.no_grad():
        out = backend(q, k, v, key_padding_mask=pad if padded else None, is_causal=causal)
    r = rule(block, summary)
    ref = dense_reference(q, k, v, pad, r, causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)




@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("part,summary_heads", [("local", "split"), ("summary", "shared"),
                                                ("summary", "split")])
def test_block_mask_of_each_part_is_torchs_and_read_as_the_gpu_reads_it_gives_the_pattern(
        part, summary_heads, causal):
    """The eager CPU kernel reads only the mask_mod, so the tile lists the GPU kernel skips by
    are checked apart: equal to ``create_block_mask``'s, and full tiles taken whole with
    partial tiles through mask_mod give the pattern (l = 32, c = 8 on 16-wide tiles)."""
    t, block, summary, heads, size = 100, 32, 8, 4, 16
    backend = get_backend("sparse_fixed", block=block, summary=summary,
                          summary_heads=summary_heads, part=part, kernel="flex")
    per_head = heads if backend.per_head_keep else None
    ours = pattern_block_mask(backend.keep_rule(t, causal, torch.device("cpu")), t, causal,
                              "cpu", block_size=size, heads=per_head)
    theirs = create_block_mask(ours.mask_mod, None, per_head, t, t, device="cpu",
                               BLOCK_SIZE=size)
    partial = tiles(ours.kv_num_blocks, ours.kv_indices)
    full = tiles(ours.full_kv_num_blocks, ours.full_kv_indices)
    assert torch.equal(partial, tiles(theirs.kv_num_blocks, theirs.kv_indices))
    assert torch.equal(full, tiles(theirs.full_kv_num_blocks, theirs.full_kv_indices))
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    expand = lambda x: x.repeat_interleave(size, -2).repeat_interleave(size, -1)[..., :t, :t]  # noqa: E731
    by_mod = torch.stack([ours.mask_mod(None, torch.tensor(h), i, j)
                          for h in range(partial.shape[0])])
    read = (expand(partial) & by_mod) | expand(full)
    assert torch.equal(read, backend.pattern_keep(t, causal, heads=heads).expand_as(read))


@pytest.mark.parametrize("steps", [(1,) * 11, (4, 1, 3, 2, 1)])
@pytest.mark.parametrize("part,summary_heads,rule", PARTS,
                         ids=[f"{p}-{s}" for p, s, _ in PARTS])
def test_decoding_step_by_step_equals_the_causal_pass(part, summary_heads, rule, steps):
    t = sum(steps)
    q, k, v = qkv(t, seed=3, heads=4)
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, :2] = True  # a left-padded row
    pad[0, 5] = True  # a padded summary position
    backend = get_backend("sparse_fixed", block=3, summary=1, summary_heads=summary_heads,
                          part=part)
    want = backend(q, k, v, key_padding_mask=pad, is_causal=True)
    torch.testing.assert_close(want, loop_attention(q, k, v, pad, rule(3, 1), True))
    got, state = decode_in_steps(backend, q, k, v, pad, steps)
    assert state.length == t
    if part == "local":  # A¹ keeps the last block of keys only
        assert state.tensors["k"].shape[2] == 3
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("part", ["local", "summary"])
def test_neither_part_saves_a_t_by_t_tensor(part):
    t, block, summary = 64, 8, 1
    q, k, v = qkv(t, grad=True, heads=4)
    sizes = []

    def pack(x):
        if x.numel():  # "local" gathers no summary column: its empty tensors hold nothing
            sizes.append(x.numel() // (x.shape[0] * x.shape[1]) if x.dim() >= 2 else x.numel())
        return x

    backend = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split",
                          part=part, kernel="native")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        backend(q, k, v, key_padding_mask=padding(t), is_causal=True)
    assert max(sizes) <= t * (block + t // block * summary) < t * t


@pytest.mark.parametrize("part", ["A1", None, 1])
def test_bad_part_is_refused_naming_the_value_and_the_choices(part):
    with pytest.raises(ValueError, match=r"sparse_fixed backend: part must be one of 'both', "
                                         rf"'local', 'summary', got {part!r}"):
        get_backend("sparse_fixed", part=part)
