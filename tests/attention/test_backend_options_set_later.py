"""Every backend checks an option set after construction as its constructor checks it: the
softmax temperature ``scale`` of each backend that takes one, the ``kernel`` of the pattern
backends and of ``chunked``, and ``chunked``'s block sizes. A bad value is refused with the
constructor's message and the option in force is unchanged. A bool option takes a bool only.
An option that shapes what the constructor built (linformer's projections, the projections of
the attention module around an lsh backend with shared QK) is fixed: set to another value, it
is refused. The performer's feature options restart the features: the next call is that of a
backend built with them."""

import inspect
import math

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
    ("performer", {}, "seed", 1.5, r"seed must be an int or None, got 1\.5"),
    ("performer", {}, "head_dim", 0, r"head_dim must be a positive int or None, got 0"),
    ("linear", {}, "chunk_size", 0, r"chunk_size must be a positive int, got 0"),
    ("linear", {}, "eps", -1.0, r"eps must be > 0"),
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


# FlexAttention on the CPU: 2 to 3 s a case on 2 cores, behind `pytest -m slow`
@pytest.mark.parametrize("kernel", ["native", pytest.param("flex", marks=pytest.mark.slow)])
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


BOOL_OPTIONS = [  # (backend, options at construction, bool option)
    ("lsh", {}, "shared_qk"), ("chunked", {}, "checkpointing"),
    ("explicit", {}, "store_weights"), ("linear", {}, "ignore_dropout"),
    ("performer", {}, "ignore_dropout"), ("linformer", {"max_len": 16, "rank": 4}, "share_kv"),
]


@pytest.mark.parametrize("value", ["false", 0, 1, None])
@pytest.mark.parametrize("name,options,option", BOOL_OPTIONS)
def test_a_bool_option_that_is_not_a_bool_is_refused_at_construction_and_later(
        name, options, option, value):
    """The string "false" is truthy: it was taken as True, when built or set later."""
    message = (rf"{name} backend: {option} must be True or False, got {value!r} "
               rf"\({type(value).__name__}\)")
    with pytest.raises(ValueError, match=message):
        get_backend(name, **options, **{option: value})
    backend = get_backend(name, **options)
    before = getattr(backend, option)
    with pytest.raises(ValueError, match=message):
        setattr(backend, option, value)
    assert getattr(backend, option) is before


def test_store_weights_set_to_false_later_keeps_no_weights_as_when_built_so():
    """The weights of the call before were kept (a (B, H, T, T) tensor) after the option was
    set to False; a backend built with False keeps none."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    backend = get_backend("explicit")
    backend(q, k, v)
    exact = torch.softmax(q @ k.transpose(-2, -1) * 0.5, -1)  # scale 1/√4
    torch.testing.assert_close(backend.last_weights, exact)
    backend.store_weights = False
    assert backend.last_weights is None
    backend(q, k, v)
    assert backend.last_weights is None
    backend.store_weights = True
    backend(q, k, v)
    torch.testing.assert_close(backend.last_weights, exact)


def test_linear_options_set_later_act_at_the_next_call():
    """chunk_size, eps and ignore_dropout: the causal output is the prefix-sum formula of
    Katharopoulos et al. (Eqs. 8–11) written out position by position."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    backend = get_backend("linear", chunk_size=64)
    backend.chunk_size, backend.eps, backend.ignore_dropout = 3, 0.5, True
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    rows = []
    for i in range(7):
        sims = phi_q[:, :, i:i + 1] @ phi_k[:, :, :i + 1].transpose(-2, -1)  # (B, H, 1, i+1)
        rows.append((sims @ v[:, :, :i + 1]) / (sims.sum(-1, keepdim=True) + 0.5))
    torch.testing.assert_close(backend(q, k, v, is_causal=True, dropout_p=0.1),
                               torch.cat(rows, dim=2))


FIXED = [  # (backend, options at construction, option, another value)
    ("linformer", {"max_len": 16, "rank": 4}, "max_len", 32),
    ("linformer", {"max_len": 16, "rank": 4}, "rank", 8),
    ("linformer", {"max_len": 16, "rank": 4}, "share_kv", True),
    ("lsh", {"seed": 0}, "shared_qk", True),
]


@pytest.mark.parametrize("name,options,option,value", FIXED)
def test_an_option_fixed_at_construction_set_to_another_value_is_refused(name, options, option,
                                                                       value):
    """linformer's max_len and rank were taken and did nothing (E and F kept their
    (4, 16) shape, and a key length of 20 with max_len set to 32 failed inside the matmul);
    share_kv set later did nothing either. lsh's shared_qk set later changed the keys of a
    backend whose attention module still projects keys (or passes queries as keys). The
    value in force may be set again; a bad value gets the constructor's message."""
    backend = get_backend(name, **options)
    before = getattr(backend, option)
    with pytest.raises(AttributeError, match=(
            rf"{name} backend: {option} is fixed at construction .*cannot be set to "
            rf"{value!r} \(it is {before!r}\); build a new backend with {option}={value!r}")):
        setattr(backend, option, value)
    assert getattr(backend, option) == before
    setattr(backend, option, before)  # the value in force: nothing changes
    assert getattr(backend, option) == before
    with pytest.raises(ValueError, match=rf"{name} backend: {option} must be"):
        setattr(backend, option, "8")


def test_linformer_after_a_refused_resize_is_its_eq_7_with_the_constructors_projections():
    """softmax(Q (E K)ᵀ · scale) (F V) of Wang et al. 2020, Eq. 7, with E and F of shape
    (rank, max_len) = (4, 16) as built, written out."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8, generator=g, dtype=torch.float64) for _ in range(3))
    backend = get_backend("linformer", max_len=16, rank=4).double()
    for option, value in (("max_len", 32), ("rank", 8)):
        with pytest.raises(AttributeError):
            setattr(backend, option, value)
    assert backend.E.shape == backend.F.shape == (4, 16)
    e, f = backend.E[:, :10].detach(), backend.F[:, :10].detach()
    exact = torch.softmax(q @ (e @ k).transpose(-2, -1) / 8**0.5, -1) @ (f @ v)
    torch.testing.assert_close(backend(q, k, v), exact)
    with pytest.raises(ValueError, match=r"key length 20 exceeds max_len=16"):
        backend(*(torch.randn(1, 2, 20, 8, dtype=torch.float64) for _ in range(3)))


def favor_attention(q, k, v, omega, eps=1e-6):
    """Non-causal FAVOR+ (Choromanski et al. 2021, Lemma 1) written out with features ``omega``
    and scale 1/√D: φ(x) = exp(ωᵀx − ‖x‖²/2)/√m, x = q·D^{-1/4}."""
    root = q.shape[-1] ** -0.25
    m = omega.shape[0]

    def phi(x):
        x = x * root
        return torch.exp(x @ omega.T.to(x.dtype) - (x * x).sum(-1, keepdim=True) / 2) / m**0.5

    sims = phi(q) @ phi(k).transpose(-2, -1)
    return (sims @ v) / (sims.sum(-1, keepdim=True) + eps)


PERFORMER_LATER = [  # options set after construction (built with seed 0, 16 orthogonal features)
    {"num_features": 8}, {"feature_type": "iid"}, {"seed": 1}, {"num_features": None},
    {"seed": None}, {"num_features": 12, "feature_type": "iid", "seed": 3},
]


@pytest.mark.parametrize("drawn_at", ["construction", "first call"])
@pytest.mark.parametrize("later", PERFORMER_LATER)
def test_performer_feature_options_set_later_are_those_of_the_next_call(later, drawn_at):
    """Set after the features were drawn (at construction with head_dim, or at a first call)
    and after training calls that redrew them, the next calls are those of a backend built
    with the new options: the same features (the generator restarted from the seed, torch's
    global one without a seed), the same redraws (the count towards redraw_interval
    restarted), and each output FAVOR+ written out with that backend's features. The next
    call used the old features: num_features set to 8 kept 16 of them, a new seed none of its
    own."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    base = {"num_features": 16, "seed": 0, "redraw_interval": 2}
    at_construction = {"head_dim": 4} if drawn_at == "construction" else {}
    backend = get_backend("performer", **base, **at_construction).train()
    for _ in range(3):  # draws (at the first call) and redraws the features
        backend(q, k, v)
    torch.manual_seed(5)  # torch's generator, for the options without a seed
    for option, value in later.items():
        setattr(backend, option, value)
    outs = [(backend(q, k, v), backend.omega.clone()) for _ in range(3)]  # the third redraws
    torch.manual_seed(5)
    built = get_backend("performer", **{**base, **later}, **at_construction).train()
    for out, omega in outs:
        expected = built(q, k, v)
        torch.testing.assert_close(omega, built.omega)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(out, favor_attention(q, k, v, built.omega))
    m = later.get("num_features", 16) or round(4 * math.log(4))
    assert backend.omega.shape == (m, 4)


def test_performer_feature_options_set_to_the_values_in_force_change_nothing():
    """Features, generator and the count of calls go on as if nothing had been set."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    options = {"num_features": 16, "seed": 0, "redraw_interval": 2, "head_dim": 4}
    backend, untouched = (get_backend("performer", **options).train() for _ in range(2))
    backend(q, k, v), untouched(q, k, v)
    backend.num_features, backend.feature_type, backend.seed, backend.head_dim = (
        16, "orthogonal", 0, 4)
    for _ in range(3):  # the second call redraws from the generator's continued stream
        torch.testing.assert_close(backend(q, k, v), untouched(q, k, v))
        torch.testing.assert_close(backend.omega, untouched.omega)


@pytest.mark.parametrize("change", ["redraw", "seed", "num_features", "load_state_dict"])
def test_a_performer_decoding_state_of_features_redrawn_since_is_refused(change):
    """Sums of φ(k)vᵀ under one feature draw went on under the next: the step's output mixed
    two draws (neither the old nor the new features' causal pass). Refused, naming the fix;
    decoding again from the start equals the new features' causal pass."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    backend = get_backend("performer", num_features=16, seed=0, head_dim=4).double()
    _, state = backend.decode(q[:, :, :3], k[:, :, :3], v[:, :, :3], None)
    _, unchanged = backend.decode(q[:, :, 3:4], k[:, :, 3:4], v[:, :, 3:4], state)  # as before
    if change == "redraw":
        backend.redraw_features()
    elif change == "seed":
        backend.seed = 7
    elif change == "num_features":
        backend.num_features = 8
    else:
        other = get_backend("performer", num_features=16, seed=3, head_dim=4).double()
        backend.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match=r"performer backend: this decoding state \(4 "
                                         r"positions\) was made with features that have been "
                                         r"redrawn since .* decode the sequence again"):
        backend.decode(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], unchanged)
    _, state = backend.decode(q[:, :, :4], k[:, :, :4], v[:, :, :4], None)
    last, _ = backend.decode(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], state)
    torch.testing.assert_close(last, backend(q, k, v, is_causal=True)[:, :, 4:])


def test_performer_head_dim_set_later_draws_the_features_for_it():
    """Built without head_dim and called with D = 4, then head_dim set to 8: the features are
    those of a backend built with head_dim=8 (the call with D = 4 refused before), and set to
    None they are dropped and drawn at the next call, as in a backend built without it."""
    g = torch.Generator().manual_seed(1)
    q4, q8 = (torch.randn(1, 2, 6, d, generator=g, dtype=torch.float64) for d in (4, 8))
    backend = get_backend("performer", num_features=16, seed=0)
    backend(q4, q4, q4)
    backend.head_dim = 8
    built = get_backend("performer", num_features=16, seed=0, head_dim=8)
    assert backend.head_dim == 8
    torch.testing.assert_close(backend.omega, built.omega)
    torch.testing.assert_close(backend(q8, q8, q8), favor_attention(q8, q8, q8, built.omega))
    backend.head_dim = None
    assert backend.head_dim is None and backend.omega.numel() == 0
    fresh = get_backend("performer", num_features=16, seed=0)
    torch.testing.assert_close(backend(q4, q4, q4), fresh(q4, q4, q4))


@pytest.mark.parametrize("layout,message", [
    (torch.full((2, 2), 0.5), r"layout must hold bools \(or 0 and 1\), got the value 0\.5"),
    (torch.ones(2, 3, dtype=torch.bool), r"layout must be a square .* got shape \(2, 3\)"),
    ("all", r"layout must be a square \(blocks, blocks\) bool matrix, got 'all'"),
])
def test_a_block_sparse_layout_set_later_is_refused_as_the_constructor_refuses_it(layout,
                                                                                   message):
    """A float layout set later was taken (0.5 indexed as a keep-mask), a non-square one too."""
    with pytest.raises(ValueError, match=rf"block_sparse backend: {message}"):
        get_backend("block_sparse", layout=layout, block_size=4)
    backend = get_backend("block_sparse", layout=torch.eye(2, dtype=torch.bool), block_size=4)
    before = backend.layout
    with pytest.raises(ValueError, match=rf"block_sparse backend: {message}"):
        backend.layout = layout
    assert backend.layout is before and dict(backend.named_buffers())["layout"] is before


def test_a_block_sparse_layout_set_later_as_a_list_is_the_pattern_of_the_next_call():
    """A nested list of 0 and 1, as the constructor takes it (refused before, as a buffer
    must be a tensor): masked softmax attention over its blocks, written out."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))
    backend = get_backend("block_sparse", layout=torch.eye(2, dtype=torch.bool), block_size=4)
    backend(q, k, v)
    backend.layout = [[1, 0], [1, 1]]
    keep = torch.tensor([[i // 4 >= j // 4 for j in range(8)] for i in range(8)])
    torch.testing.assert_close(backend(q, k, v), masked_attention(q, k, v, keep))


def test_every_constructor_option_of_every_backend_is_checked_when_set():
    """Each option a backend is built with is a property with a setter (checked, fixed, or
    restarting what depends on it), or the layout buffer, which the class checks when set: no
    option is a plain attribute that takes anything and may do nothing."""
    import graded.attention.backends as backends

    classes = [c for c in map(backends.__dict__.get, backends.__all__) if isinstance(c, type)
               and issubclass(c, backends.AttentionBackend) and c.name]
    assert sorted(c.name for c in classes) == backends.available_backends()
    plain = []
    for cls in classes:
        for option in inspect.signature(cls.__init__).parameters:
            if option == "self" or (cls is backends.BlockSparseBackend and option == "layout"):
                continue
            attr = inspect.getattr_static(cls, option, None)
            if not (isinstance(attr, property) and attr.fset is not None):
                plain.append(f"{cls.name}.{option}")
    assert plain == []
