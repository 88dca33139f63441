"""Every backend checks an option set after construction as its constructor checks it: the
softmax temperature ``scale`` of each backend that takes one, the ``kernel`` of the pattern
backends and of ``chunked``, and ``chunked``'s block sizes. A bad value is refused with the
constructor's message and the option in force is unchanged."""

import pytest
import torch

from graded.attention.backends import get_backend

SCALED = {
    "full": {}, "explicit": {}, "chunked": {}, "sliding_window": {"window": 4},
    "dilated": {"dilation": 2}, "sparse_fixed": {"block": 4, "summary": 1},
    "block_sparse": {"layout": torch.ones(4, 4, dtype=torch.bool), "block_size": 4},
    "bigbird": {"block_size": 4}, "linformer": {"max_len": 16, "rank": 4},
    "lsh": {"seed": 0}, "performer": {"seed": 0, "num_features": 16},
}
PATTERN = ["sliding_window", "dilated", "sparse_fixed", "block_sparse", "bigbird"]


def constructor_error(name, **options):
    with pytest.raises(ValueError) as err:
        get_backend(name, **{**SCALED[name], **options})
    return str(err.value)


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), "1"])
@pytest.mark.parametrize("name", sorted(SCALED))
def test_a_scale_set_later_is_refused_with_the_constructors_message(name, value):
    message = constructor_error(name, scale=value)
    backend = get_backend(name, **SCALED[name], scale=0.5)
    with pytest.raises(ValueError) as err:
        backend.scale = value
    assert str(err.value) == message and f"{name} backend: scale" in message
    assert backend.scale == 0.5


@pytest.mark.parametrize("name", [*PATTERN, "chunked"])
def test_a_kernel_set_later_is_refused_with_the_constructors_message(name):
    message = constructor_error(name, kernel="fast")
    backend = get_backend(name, **SCALED[name], kernel="native")
    with pytest.raises(ValueError) as err:
        backend.kernel = "fast"
    assert str(err.value) == message and "got 'fast'" in message
    assert backend.kernel == "native"


@pytest.mark.parametrize("option", ["query_chunk", "key_chunk"])
@pytest.mark.parametrize("value", [0, 2.5, True])
def test_chunked_block_sizes_set_later_are_refused_with_the_constructors_message(option, value):
    message = constructor_error("chunked", **{option: value})
    backend = get_backend("chunked", query_chunk=8, key_chunk=8)
    with pytest.raises(ValueError) as err:
        setattr(backend, option, value)
    assert str(err.value) == message
    assert getattr(backend, option) == 8


@pytest.mark.parametrize("name", sorted(SCALED))
def test_a_scale_set_later_is_the_temperature_of_the_next_call(name):
    """Equal to the same backend built with that scale and, for those whose pattern keeps
    every pair at this length, to softmax(q kᵀ · scale) v written out."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    backend = get_backend(name, **SCALED[name])
    backend.scale = 0.3
    built = get_backend(name, **SCALED[name], scale=0.3)
    if name == "linformer":  # its projections are drawn at construction
        built.load_state_dict(backend.state_dict())
    torch.testing.assert_close(backend(q, k, v), built(q, k, v))
    if name in ("full", "explicit", "chunked", "sliding_window", "bigbird", "block_sparse"):
        exact = torch.softmax(q @ k.transpose(-2, -1) * 0.3, -1) @ v  # every key kept
        torch.testing.assert_close(backend(q, k, v), exact)


BAD_LATER = [
    ("sliding_window", {"window": 4, "block_size": 8}, "window", 9,
     r"block_size \(8\) must be >= window \(9\)"),
    ("sliding_window", {"window": 4}, "window", 0, r"window must be a positive int, got 0"),
    ("sliding_window", {"window": 4, "block_size": 8}, "block_size", 3,
     r"block_size \(3\) must be >= window \(4\)"),
    ("dilated", {"dilation": 2}, "dilation", 0, r"dilation must be a positive int, got 0"),
    ("dilated", {"dilation": 2, "window": 3}, "window", -1,
     r"window must be a positive int or None, got -1"),
    ("sparse_fixed", {"block": 4, "summary": 2}, "block", 0,
     r"block must be a positive int, got 0"),
    ("sparse_fixed", {"block": 4, "summary": 2}, "block", 1,
     r"summary must be an int in \[1, block=1\], got 2"),
    ("sparse_fixed", {"block": 4, "summary": 2}, "summary", 5,
     r"summary must be an int in \[1, block=4\], got 5"),
    ("sparse_fixed", {"block": 6, "summary": 4}, "summary_heads", "split",
     r"summary_heads='split' needs summary to divide block"),
    ("sparse_fixed", {"block": 4, "summary": 2}, "part", "all",
     r"part must be one of 'both', 'local', 'summary', 'heads', got 'all'"),
    ("explicit", {}, "max_elements", 0, r"max_elements must be a positive int, got 0"),
    ("lsh", {}, "n_rounds", 0, r"n_rounds must be a positive int, got 0"),
    ("lsh", {}, "chunk_size", 2.5, r"chunk_size must be a positive int, got 2\.5"),
    ("lsh", {}, "n_buckets", 3, r"n_buckets must be 1 or a positive even int, got 3"),
    ("lsh", {}, "seed", 1.5, r"seed must be an int or None, got 1\.5"),
    ("performer", {}, "num_features", 0, r"num_features must be a positive int or None, got 0"),
    ("performer", {}, "feature_type", "gaussian",
     r"feature_type must be 'orthogonal' or 'iid', got 'gaussian'"),
    ("performer", {}, "redraw_interval", 0,
     r"redraw_interval must be a positive int or None, got 0"),
    ("performer", {}, "chunk_size", True, r"chunk_size must be a positive int, got True"),
    ("performer", {}, "eps", 0.0, r"eps must be > 0"),
]


@pytest.mark.parametrize("name,options,option,value,message", BAD_LATER)
def test_an_option_set_later_is_refused_as_the_constructor_refuses_it(name, options, option,
                                                                     value, message):
    """Each was taken when set after construction: a zero dilation or block then failed
    inside the call (integer modulo by zero), a block smaller than the window dropped keys,
    an unknown part computed 'both'."""
    with pytest.raises(ValueError, match=rf"{name} backend: {message}"):
        get_backend(name, **{**options, option: value})
    backend = get_backend(name, **options)
    before = getattr(backend, option)
    with pytest.raises(ValueError, match=rf"{name} backend: {message}"):
        setattr(backend, option, value)
    assert getattr(backend, option) == before


def masked_attention(q, k, v, keep):
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0) @ v


def decode_one_by_one(backend, q, k, v):
    state, outs = None, []
    for i in range(q.shape[2]):
        out, state = backend.decode(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], state)
        outs.append(out)
    return torch.cat(outs, dim=2)


LATER_PATTERNS = [  # (name, options at construction, options set later, keep rule (h, i, j))
    ("sliding_window", {"window": 3}, {"window": 40}, lambda h, i, j: abs(i - j) <= 40),
    ("dilated", {"dilation": 2, "window": 2}, {"window": 9},
     lambda h, i, j: (i - j) % 2 == 0 and abs(i - j) <= 18),
    ("dilated", {"dilation": 2, "window": 2}, {"dilation": 3, "window": None},
     lambda h, i, j: (i - j) % 3 == 0),
    ("sparse_fixed", {"block": 8, "summary": 2, "part": "local"}, {"part": "both"},
     lambda h, i, j: i // 8 == j // 8 or j % 8 >= 6),
    ("sparse_fixed", {"block": 8, "summary": 2}, {"summary_heads": "split"},
     lambda h, i, j: i // 8 == j // 8 or 8 - 2 * (h % 4 + 1) <= j % 8 < 8 - 2 * (h % 4)),
]


@pytest.mark.parametrize("kernel", ["native", "flex"])
@pytest.mark.parametrize("name,options,later,rule", LATER_PATTERNS)
def test_pattern_options_set_later_are_the_pattern_of_the_next_call_and_of_decoding(
        name, options, later, rule, kernel):
    """The window, dilation, part or summary heads set after construction: the forward pass
    (a new BlockMask for FlexAttention, whose tiles span 128 positions) and decoding (which
    keeps the keys of the new horizon) are masked softmax attention over the new pattern,
    written out position by position. Decoding kept the constructor's horizon (3 keys for a
    window set to 40), the blocked kernel the constructor's block (32 < 40: keys dropped),
    and sparse_fixed's heads the constructor's split."""
    t, heads = 150, 2
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, t, 4, generator=g) for _ in range(3))
    backend = get_backend(name, **options, kernel=kernel)
    with torch.no_grad():
        backend(q, k, v)  # a call with the constructor's pattern: its BlockMask is cached
        for option, value in later.items():
            setattr(backend, option, value)
        keep = torch.tensor([[[rule(h, i, j) for j in range(t)] for i in range(t)]
                             for h in range(heads)])
        torch.testing.assert_close(backend(q, k, v), masked_attention(q, k, v, keep))
        causal = masked_attention(q, k, v, keep & torch.ones(t, t, dtype=torch.bool).tril())
        torch.testing.assert_close(backend(q, k, v, is_causal=True), causal)
        torch.testing.assert_close(decode_one_by_one(backend, q, k, v), causal)
