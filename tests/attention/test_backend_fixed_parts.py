"""The two halves of the Sparse Transformer's fixed pattern, ``sparse_fixed(part=...)``:
A¹ alone ("local") and A² alone ("summary"), for the interleaved arrangement of Child et al.
(2019, §5.1, Eq. 6), and the two in separate heads of one layer ("heads": A¹ in the even
heads, A² in the odd ones; §5.1, Eq. 8). Each is compared with a per-query loop over the
keep-set written out from the paper's definition, with FlexAttention under that set as a dense
mask, and with step-by-step decoding; "heads" also with "local" and "summary" on its heads;
part="both" stays the merged head."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from graded import TransformerConfig, TransformerLM
from graded.attention import MultiheadAttention
from graded.attention.backends import get_backend
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


def heads_rule(block, summary, split=False):
    """A¹ in the even heads, A² in the odd ones: odd head h is summary head m = h // 2, on the
    last c of the block, or with split heads on sub-block m mod (l // c) counted back from the
    block's end."""
    def rule(h, i, j):
        if h % 2 == 0:
            return i // block == j // block
        sub = h // 2 % (block // summary) if split else 0
        return block - summary * (sub + 1) <= j % block < block - summary * sub
    return rule


# (part, summary_heads, rule): "local" ignores summary_heads
PARTS = [
    ("local", "shared", lambda l, c: local_rule(l, c)),
    ("local", "split", lambda l, c: local_rule(l, c)),
    ("summary", "shared", lambda l, c: summary_rule(l, c)),
    ("summary", "split", lambda l, c: summary_rule(l, c, split=True)),
    ("heads", "shared", lambda l, c: heads_rule(l, c)),
    ("heads", "split", lambda l, c: heads_rule(l, c, split=True)),
]
# (T, block l, summary c, heads): T a multiple of l and not (13 = 3·4 + 1), heads cycling
# through the sub-blocks (3 heads, 2 sub-blocks; with "heads" 6 heads: summary heads 1, 3, 5
# on sub-blocks 0, 1, 0), c = 1, l > T
SHAPES = [(12, 4, 2, 3), (13, 4, 2, 6), (11, 3, 1, 2), (6, 8, 4, 2)]


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
    summary_heads says; summary per head when split; both is their union; heads is local in
    the even heads and summary in the odd ones, per head whether split or not."""
    t, block, summary, heads = 10, 4, 2, 5
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
    for split in (False, True):
        rule = heads_rule(block, summary, split)
        want = torch.tensor([[[rule(h, i, j) for j in range(t)] for i in range(t)]
                             for h in range(heads)])
        split_heads = get_backend("sparse_fixed", block=block, summary=summary, part="heads",
                                  summary_heads="split" if split else "shared")
        assert split_heads.per_head_keep
        assert torch.equal(split_heads.pattern_keep(t, False, heads=heads), want)


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
                                                ("summary", "split"), ("heads", "shared"),
                                                ("heads", "split")])
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


@pytest.mark.parametrize("part", ["local", "summary", "heads"])
def test_no_part_saves_a_t_by_t_tensor(part):
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
                                         rf"'local', 'summary', 'heads', got {part!r}"):
        get_backend("sparse_fixed", part=part)


# part="heads": A¹ in the even heads, A² in the odd ones


def test_heads_part_keep_set_worked_example_block_4_summary_1():
    """l = 4, c = 1, split, four heads: heads 0 and 2 see their block, head 1 (summary head 0)
    offset 3, head 3 (summary head 1) offset 2. Causal position 9: heads 0 and 2 see {8, 9},
    head 1 {3, 7}, head 3 {2, 6}."""
    backend = get_backend("sparse_fixed", block=4, summary=1, summary_heads="split",
                          part="heads")
    keep = backend.pattern_keep(12, True, heads=4)
    assert [keep[h, 9].nonzero().flatten().tolist() for h in range(4)] == [
        [8, 9], [3, 7], [8, 9], [2, 6]]


@pytest.mark.parametrize("kernel", ["native", "flex"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("summary_heads", ["shared", "split"])
def test_heads_part_gives_local_in_the_even_heads_and_summary_in_the_odd_heads(
        summary_heads, causal, padded, kernel):
    """Head 2m of part="heads" equals head m of part="local" run on the even heads, head 2m + 1
    head m of part="summary" run on the odd heads (the summary heads counted among themselves
    when split), both on the native kernel; shared, the odd heads also equal those heads of
    part="summary" run on every head. l = 8, c = 2 (four sub-blocks), seven heads."""
    t, block, summary, heads = 37, 8, 2, 7
    q, k, v = qkv(t, seed=11, d=8, heads=heads)
    pad = padding(t) if padded else None
    options = {"block": block, "summary": summary, "summary_heads": summary_heads}

    def run(part, q, k, v, kernel="native"):
        backend = get_backend("sparse_fixed", part=part, kernel=kernel, **options)
        with torch.no_grad():
            return backend(q, k, v, key_padding_mask=pad, is_causal=causal)

    out = run("heads", q, k, v, kernel)
    even, odd = slice(0, None, 2), slice(1, None, 2)
    local = run("local", q[:, even], k[:, even], v[:, even])
    summ = run("summary", q[:, odd], k[:, odd], v[:, odd])
    torch.testing.assert_close(out[:, even], local, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[:, odd], summ, rtol=1e-12, atol=1e-12)
    if summary_heads == "shared":
        torch.testing.assert_close(out[:, odd], run("summary", q, k, v)[:, odd],
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_heads_part_dropout_drops_pattern_weights_and_rescales_the_rest(causal):
    """With v the identity the output rows are the attention weights after dropout: each entry
    is 0 or the loop's weight / (1 − p), zero outside the head's pattern, some dropped."""
    t, block, summary, heads, p = 12, 4, 1, 4, 0.5
    q, k, _ = qkv(t, seed=2, heads=heads)
    eye = torch.eye(t, dtype=q.dtype).expand(2, heads, t, t)
    pad = padding(t)
    backend = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split",
                          part="heads")
    torch.manual_seed(0)
    got = backend(q, k, eye, key_padding_mask=pad, is_causal=causal, dropout_p=p)
    weights = loop_attention(q, k, eye, pad, heads_rule(block, summary, split=True), causal)
    kept = got != 0
    torch.testing.assert_close(got[kept], weights[kept] / (1 - p), rtol=1e-12, atol=1e-12)
    assert not (kept & (weights == 0)).any()
    dropped = ~kept & (weights > 0)
    assert dropped.any() and (kept & (weights > 0)).any()


@pytest.mark.parametrize(("dtype", "kernel", "tol"), [
    (torch.float32, "native", 1e-5), (torch.bfloat16, "native", 3e-2),
    (torch.float32, "flex", 1e-5),
])
def test_heads_part_computes_in_the_input_dtype(dtype, kernel, tol):
    """float32 and bfloat16 inputs give outputs of their dtype, close to the float64 loop."""
    t, block, summary, heads = 21, 4, 2, 4
    q, k, v = qkv(t, seed=9, heads=heads)
    pad = padding(t)
    backend = get_backend("sparse_fixed", block=block, summary=summary, summary_heads="split",
                          part="heads", kernel=kernel)
    with torch.no_grad():
        out = backend(*(x.to(dtype) for x in (q, k, v)), key_padding_mask=pad, is_causal=True)
    assert out.dtype == dtype
    ref = loop_attention(q, k, v, pad, heads_rule(block, summary, split=True), True)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("kernel", ["native", "flex"])
def test_heads_part_refuses_a_single_head_naming_the_count(kernel):
    q, k, v = qkv(8, heads=1)
    backend = get_backend("sparse_fixed", block=4, summary=1, part="heads", kernel=kernel)
    with torch.no_grad(), pytest.raises(
            ValueError, match=r"sparse_fixed backend: part='heads' needs at least 2 heads "
                              r"\(even heads attend the block, odd heads the summary "
                              r"positions\), got 1"):
        backend(q, k, v, is_causal=True)
    with pytest.raises(ValueError, match=r"sparse_fixed backend: each head has its own "
                                         r"keep-set; pass the number of heads"):
        backend.pattern_keep(8, True)
    with pytest.raises(ValueError, match="sparse_fixed backend: with part='heads' each head "
                                         "has its own keep-set; pass the head index"):
        backend.keep(torch.arange(8)[:, None], torch.arange(8)[None, :])


@pytest.mark.parametrize("n_heads,summary_heads", [(4, "split"), (3, "shared")])
def test_lm_on_heads_part_equals_the_written_out_pattern_decoding_and_capture_included(
        n_heads, summary_heads):
    """TransformerConfig(attn_backend_options={"part": "heads", ...}): the logits equal the
    same model with each layer's backend replaced by the per-query loop over the written-out
    keep-set; cached step-by-step logits equal the full pass; the captured weights are zero
    outside each head's pattern and give the heads' outputs."""
    from graded.analysis import capture_attention

    block, summary = 4, 1
    options = {"block": block, "summary": summary, "summary_heads": summary_heads,
               "part": "heads"}
    cfg = TransformerConfig(vocab_size=11, d_model=4 * n_heads, n_heads=n_heads, n_layers=2,
                            max_len=16, attn_backend="sparse_fixed",
                            attn_backend_options=options)
    torch.manual_seed(0)
    lm = TransformerLM(cfg).double().eval()
    ids = torch.randint(0, 11, (2, 11), generator=torch.Generator().manual_seed(1))
    rule = heads_rule(block, summary, split=summary_heads == "split")
    t = ids.shape[1]
    want_keep = torch.tensor([[[rule(h, i, j) and j <= i for j in range(t)] for i in range(t)]
                              for h in range(n_heads)])
    with torch.no_grad():
        with capture_attention(lm) as calls:
            got = lm(ids)
        cache = lm.new_cache()
        steps = [lm(ids[:, :5], cache=cache)] + [lm(ids[:, s:s + 1], cache=cache)
                                                 for s in range(5, t)]
        torch.testing.assert_close(torch.cat(steps, dim=1), got, rtol=1e-10, atol=1e-10)
        for m in lm.modules():
            if isinstance(m, MultiheadAttention):
                m.backend = LoopBackend(rule)
        want = lm(ids)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert len(calls) == 2
    for call in calls:
        assert torch.equal(call.pattern, want_keep)
        assert torch.equal(call.weights != 0, want_keep.expand_as(call.weights))
        torch.testing.assert_close(call.weights @ call.v, call.heads, rtol=1e-10, atol=1e-10)
