"""Sparse-pattern backends equal full attention under the pattern's explicit mask.

Each pattern's mask is built here position by position from the pattern's definition, not from
the backend's block machinery.
"""

import pytest
import torch

from graded.attention.backends import get_backend

T = 45


def masked_softmax_attention(q, k, v, keep, scale):
    s = (q @ k.transpose(-2, -1)) * scale
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def pattern_mask(rule, t, causal):
    keep = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        for j in range(t):
            keep[i, j] = rule(i, j) and (j <= i or not causal)
    return keep


def inputs(graded, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, T, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, T, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, T, 6, generator=g, dtype=torch.float64, requires_grad=True)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, T - 7:] = True
    scales = torch.rand(8, generator=g, dtype=torch.float64) * 2 + 0.1 if graded else None
    return q, k, v, pad, scales


def check_pattern(backend, rule, causal, graded):
    """Backend on (graded) q equals masked dense attention on the same pre-scaled q."""
    q, k, v, pad, scales = inputs(graded)
    q_in = q * scales if graded else q
    out = backend(q_in, k, v, key_padding_mask=pad, is_causal=causal)
    keep = pattern_mask(rule, T, causal) & ~pad[:, None, None, :]
    ref = masked_softmax_attention(q_in, k, v, keep, 8**-0.5)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad, retain_graph=True),
                    torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("graded", [False, True])
@pytest.mark.parametrize("window,block", [(4, None), (5, 7), (50, None)])
def test_sliding_window_equals_full_attention_with_band_mask(causal, graded, window, block):
    backend = get_backend("sliding_window", window=window, block_size=block)
    check_pattern(backend, lambda i, j: abs(i - j) <= window, causal, graded)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dilation,window", [(4, None), (3, 2), (7, 1)])
def test_dilated_equals_full_attention_with_strided_mask(causal, dilation, window):
    backend = get_backend("dilated", dilation=dilation, window=window)

    def rule(i, j):
        near = window is None or abs(i - j) <= window * dilation
        return (i - j) % dilation == 0 and near

    check_pattern(backend, rule, causal, graded=True)


@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_equals_full_attention_with_layout_mask(causal):
    block = 6
    n = -(-T // block)
    layout = torch.rand(n, n, generator=torch.Generator().manual_seed(3)) > 0.6
    layout[0, 0] = False
    layout[1] = False  # a query block with no key block: its rows give zeros
    backend = get_backend("block_sparse", layout=layout, block_size=block)
    q, k, v, pad, scales = inputs(True)
    q = q * scales
    out = backend(q, k, v, key_padding_mask=pad, is_causal=causal)
    keep = pattern_mask(lambda i, j: bool(layout[i // block, j // block]), T, causal)
    ref = masked_softmax_attention(q, k, v, keep & ~pad[:, None, None, :], 8**-0.5)
    torch.testing.assert_close(out, ref)
    assert torch.equal(out[:, :, block:2 * block], torch.zeros_like(out[:, :, block:2 * block]))


def test_block_sparse_keeps_its_key_blocks_while_the_layout_is_unchanged():
    """The key-block lists are sized by the layout's values: built once per length and device
    (reading a GPU layout in every pass would wait for it), rebuilt when the layout changes in
    place; the outputs are those of the layout in force."""
    block = 6
    n = -(-T // block)
    layout = torch.rand(n, n, generator=torch.Generator().manual_seed(3)) > 0.5
    backend = get_backend("block_sparse", layout=layout, block_size=block, kernel="native")
    q, k, v, pad, _ = inputs(False)
    first = backend(q, k, v, key_padding_mask=pad)
    kept = backend._key_blocks(n, q.device)
    assert backend._key_blocks(n, q.device) is kept
    backend(q, k, v, key_padding_mask=pad)
    assert backend._key_blocks(n, q.device) is kept
    with torch.no_grad():
        backend.layout.fill_(True)  # every block: full attention
    out = backend(q, k, v, key_padding_mask=pad)
    assert backend._key_blocks(n, q.device) is not kept
    ref = masked_softmax_attention(q, k, v, ~pad[:, None, None, :].expand(-1, 1, T, T), 8**-0.5)
    torch.testing.assert_close(out, ref)
    assert not torch.allclose(first, out)


@pytest.mark.parametrize("kernel", ["native", "flex"])
def test_block_sparse_replaced_layout_is_the_layout_in_force(kernel):
    """``backend.layout = new`` (a new tensor, of the same shape and version 0 as the old
    one) is another pattern: the cached key blocks (native) and BlockMask (flex) of the old
    layout gave the old layout's outputs."""
    block = 6
    n = -(-T // block)
    backend = get_backend("block_sparse", layout=torch.eye(n, dtype=torch.bool),
                          block_size=block, kernel=kernel)
    q, k, v, pad, _ = inputs(False)
    q, k, v = (x.detach().float() for x in (q, k, v))  # CPU FlexAttention: no grad
    backend(q, k, v, key_padding_mask=pad)
    backend.layout = torch.ones(n, n, dtype=torch.bool)  # every block: full attention
    out = backend(q, k, v, key_padding_mask=pad)
    ref = masked_softmax_attention(q, k, v, ~pad[:, None, None, :].expand(-1, 1, T, T), 8**-0.5)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("graded", [False, True])
def test_bigbird_equals_full_attention_with_window_global_random_mask(causal, graded):
    block, g, r = 5, 1, 2
    backend = get_backend(
        "bigbird", block_size=block, num_global_blocks=g, num_random_blocks=r, seed=4
    )
    n = -(-T // block)
    rand = backend.random_blocks(n, causal).tolist()

    def rule(i, j):
        bi, bj = i // block, j // block
        return bi < g or bj < g or abs(bi - bj) <= 1 or bj in rand[bi]

    check_pattern(backend, rule, causal, graded)


def test_bigbird_random_blocks_are_seeded_and_outside_window_and_globals():
    backend = get_backend("bigbird", block_size=4, num_random_blocks=3, seed=9)
    a, b = backend.random_blocks(20), backend.random_blocks(20)
    assert torch.equal(a, b)
    other = get_backend("bigbird", block_size=4, num_random_blocks=3, seed=10).random_blocks(20)
    assert not torch.equal(a, other)
    for i, row in enumerate(a.tolist()[1:], start=1):
        picked = [j for j in row if j >= 0]
        assert len(picked) == 3 and len(set(picked)) == 3
        assert all(j >= 1 and abs(j - i) > 1 for j in picked)


BIGBIRD_OPTIONS = {"block_size": 5, "num_global_blocks": 1, "num_random_blocks": 2,
                   "window_blocks": 3, "seed": 4}
BIGBIRD_CHANGES = [("block_size", 7), ("num_global_blocks", 2), ("num_random_blocks", 1),
                   ("window_blocks", 5), ("seed", 5)]


def bigbird_rule(backend, causal):
    """BigBird's keep rule on positions, from the options in force on ``backend`` and its
    drawn random blocks (for ``causal``): global rows and columns, the window, the random."""
    block, g = backend.block_size, backend.num_global_blocks
    half = backend.window_blocks // 2
    rand = backend.random_blocks(-(-T // block), causal).tolist()

    def rule(i, j):
        bi, bj = i // block, j // block
        return bi < g or bj < g or abs(bi - bj) <= half or bj in rand[bi]

    return rule


@pytest.mark.parametrize("kernel", ["native", "flex"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("option,value", BIGBIRD_CHANGES)
def test_bigbird_option_set_after_a_call_is_the_option_in_force(kernel, causal, option, value):
    """The key blocks (native) and BlockMasks (flex) were cached per length and causality
    only: an option set after a first call left the old pattern in force. The output now
    equals a fresh backend's with the new options, and masked dense attention under the
    pattern those options define."""
    backend = get_backend("bigbird", **BIGBIRD_OPTIONS, kernel=kernel)
    q, k, v, pad, _ = inputs(False)
    q, k, v = (x.detach().float() for x in (q, k, v))  # CPU FlexAttention: no grad
    backend(q, k, v, key_padding_mask=pad, is_causal=causal)
    setattr(backend, option, value)
    out = backend(q, k, v, key_padding_mask=pad, is_causal=causal)
    fresh = get_backend("bigbird", **{**BIGBIRD_OPTIONS, option: value}, kernel=kernel)
    torch.testing.assert_close(out, fresh(q, k, v, key_padding_mask=pad, is_causal=causal))
    keep = pattern_mask(bigbird_rule(fresh, causal), T, causal) & ~pad[:, None, None, :]
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v, keep, 8**-0.5))


@pytest.mark.parametrize("option,value", BIGBIRD_CHANGES)
def test_bigbird_decoding_after_an_option_is_set_follows_the_new_pattern(option, value):
    """Incremental decoding reads the causal random blocks through a cache of its own: after
    one decoded sequence and an option set, a second sequence decoded in two calls equals
    causal masked dense attention under the new options' pattern."""
    backend = get_backend("bigbird", **BIGBIRD_OPTIONS, kernel="native")
    q, k, v, _, _ = inputs(False)
    q, k, v = (x.detach() for x in (q, k, v))

    def decode(split):
        first, state = backend.decode(q[:, :, :split], k[:, :, :split], v[:, :, :split], None)
        rest, _ = backend.decode(q[:, :, split:], k[:, :, split:], v[:, :, split:], state)
        return torch.cat([first, rest], dim=2)

    decode(20)
    setattr(backend, option, value)
    out = decode(20)
    fresh = get_backend("bigbird", **{**BIGBIRD_OPTIONS, option: value})
    keep = pattern_mask(bigbird_rule(fresh, True), T, True)
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v, keep, 8**-0.5))


@pytest.mark.parametrize("kernel", ["native", "flex"])
def test_block_sparse_block_size_set_after_a_call_is_the_block_size_in_force(kernel):
    """The BlockMask (flex) was cached per layout only: a block size set after a first call
    kept the old block size's tiles. The output equals masked dense attention under the
    layout read with the new block size."""
    n = -(-T // 5)
    layout = torch.rand(n, n, generator=torch.Generator().manual_seed(3)) > 0.5
    layout.fill_diagonal_(True)
    backend = get_backend("block_sparse", layout=layout, block_size=6, kernel=kernel)
    q, k, v, pad, _ = inputs(False)
    q, k, v = (x.detach().float() for x in (q, k, v))  # CPU FlexAttention: no grad
    backend(q, k, v, key_padding_mask=pad)
    backend.block_size = 5
    out = backend(q, k, v, key_padding_mask=pad)
    keep = pattern_mask(lambda i, j: bool(layout[i // 5, j // 5]), T, False)
    ref = masked_softmax_attention(q, k, v, keep & ~pad[:, None, None, :], 8**-0.5)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("name,opts", [
    ("sliding_window", {"window": 3}), ("dilated", {}), ("bigbird", {"block_size": 4}),
    ("sparse_fixed", {"block": 4, "summary": 1}),
    ("block_sparse", {"layout": torch.ones(4, 4, dtype=torch.bool), "block_size": 4}),
])
def test_sparse_backends_refuse_general_masks_and_cross_attention(name, opts):
    backend = get_backend(name, **opts)
    q = torch.randn(1, 1, 12, 4)
    with pytest.raises(ValueError, match=f"{name} backend cannot honour a general attn_mask"):
        backend(q, q, q, attn_mask=torch.ones(12, 12, dtype=torch.bool))
    with pytest.raises(ValueError, match=rf"{name} backend needs self-attention lengths"):
        backend(q, q[:, :, :8], q[:, :, :8])


BIGBIRD_BAD_OPTIONS = [
    ("block_size", 0, r"block_size must be a positive int, got 0"),
    ("block_size", 2.5, r"block_size must be a positive int, got 2\.5"),
    ("num_global_blocks", -1, r"num_global_blocks must be an int >= 0, got -1"),
    ("num_random_blocks", -1, r"num_random_blocks must be an int >= 0, got -1"),
    ("num_random_blocks", True, r"num_random_blocks must be an int >= 0, got True"),
    ("window_blocks", 4, r"window_blocks must be odd, got 4"),
    ("window_blocks", 0, r"window_blocks must be a positive int, got 0"),
    ("seed", 1.5, r"seed must be an int, got 1\.5"),
]


@pytest.mark.parametrize("option,value,message", BIGBIRD_BAD_OPTIONS)
def test_bigbird_refuses_an_option_set_after_construction_as_its_constructor_does(
        option, value, message):
    """``backend.block_size = 0`` (an even window, a negative random-block count) was taken
    and failed later, or drew a different pattern; it is refused when set, with the
    constructor's error, and the option in force is unchanged."""
    with pytest.raises(ValueError, match=rf"bigbird backend: {message}"):
        get_backend("bigbird", **{**BIGBIRD_OPTIONS, option: value})
    backend = get_backend("bigbird", **BIGBIRD_OPTIONS, kernel="native")
    with pytest.raises(ValueError, match=rf"bigbird backend: {message}"):
        setattr(backend, option, value)
    assert getattr(backend, option) == BIGBIRD_OPTIONS[option]
    q, k, v, pad, _ = inputs(False)
    q, k, v = (x.detach() for x in (q, k, v))
    keep = pattern_mask(bigbird_rule(backend, False), T, False) & ~pad[:, None, None, :]
    torch.testing.assert_close(backend(q, k, v, key_padding_mask=pad),
                               masked_softmax_attention(q, k, v, keep, 8**-0.5))


@pytest.mark.parametrize("value", [0, -3, 2.0])
def test_block_sparse_refuses_a_block_size_set_after_construction(value):
    layout = torch.ones(4, 4, dtype=torch.bool)
    backend = get_backend("block_sparse", layout=layout, block_size=12)
    with pytest.raises(ValueError, match=rf"block_sparse backend: block_size must be a "
                                         rf"positive int, got {value!r}"):
        backend.block_size = value
    assert backend.block_size == 12


BIGBIRD_BAD_SCALE_KERNEL = [
    ("scale", 0, r"scale \(None for 1/√head_dim\) must be > 0, got 0"),
    ("scale", -0.5, r"scale \(None for 1/√head_dim\) must be > 0, got -0\.5"),
    ("scale", float("nan"), r"scale \(None for 1/√head_dim\) must be a finite number, got nan"),
    ("scale", "0.3", r"scale \(None for 1/√head_dim\) must be a number > 0, got '0\.3'"),
    ("kernel", "natve", r"kernel must be one of 'auto', 'flex', 'native', got 'natve'"),
    ("kernel", None, r"kernel must be one of 'auto', 'flex', 'native', got None"),
]


@pytest.mark.parametrize("option,value,message", BIGBIRD_BAD_SCALE_KERNEL)
def test_bigbird_refuses_a_scale_or_kernel_set_after_construction_as_its_constructor_does(
        option, value, message):
    """``backend.scale = 0`` was taken (uniform weights over the pattern, where ``scale=0`` is
    refused) and ``backend.kernel = 'natve'`` ran FlexAttention on the CPU (any kernel but
    'native' and 'auto' did); both are refused when set, with the constructor's error, and the
    option in force is unchanged: the output is still masked softmax attention at 1/√D."""
    with pytest.raises(ValueError, match=rf"bigbird backend: {message}"):
        get_backend("bigbird", **{**BIGBIRD_OPTIONS, option: value})
    backend = get_backend("bigbird", **BIGBIRD_OPTIONS, kernel="native")
    with pytest.raises(ValueError, match=rf"bigbird backend: {message}"):
        setattr(backend, option, value)
    assert (backend.scale, backend.kernel) == (None, "native")
    q, k, v, pad, _ = inputs(False)
    q, k, v = (x.detach() for x in (q, k, v))
    keep = pattern_mask(bigbird_rule(backend, False), T, False) & ~pad[:, None, None, :]
    torch.testing.assert_close(backend(q, k, v, key_padding_mask=pad),
                               masked_softmax_attention(q, k, v, keep, 8**-0.5))


def test_bigbird_scale_set_after_construction_is_the_temperature_in_force():
    """A valid scale set later is taken (as a float) and used at the next call."""
    backend = get_backend("bigbird", **BIGBIRD_OPTIONS, kernel="native")
    backend.scale = 2
    assert backend.scale == 2.0 and isinstance(backend.scale, float)
    q, k, v, pad, _ = inputs(False)
    q, k, v = (x.detach() for x in (q, k, v))
    keep = pattern_mask(bigbird_rule(backend, True), T, True) & ~pad[:, None, None, :]
    torch.testing.assert_close(backend(q, k, v, key_padding_mask=pad, is_causal=True),
                               masked_softmax_attention(q, k, v, keep, 2.0))
