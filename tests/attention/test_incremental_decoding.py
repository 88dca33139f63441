"""Incremental decoding of the efficient backends: a decoding state of each backend's own (a
rolling window, running sums, the cached keys of a sparse pattern) reproduces the causal pass
over the whole sequence, step by step and inside models, and the windowed and kernel states
do not grow with the length. ``lsh`` is refused, and a test shows why."""

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.attention.backends import (
    DecodeState,
    backend_capabilities,
    backends_supporting,
    decodes_with_state,
    get_backend,
)
from pattern_reference import decode_in_steps

# Options under which each pattern actually restricts attention at the lengths used below.
LAYOUT = torch.tril(torch.ones(8, 8, dtype=torch.bool))
LAYOUT[3, 1] = LAYOUT[5, 2] = LAYOUT[6, 4] = LAYOUT[7, 3] = False
STATEFUL = {
    "sliding_window": {"window": 3, "block_size": 4},
    "dilated": {"dilation": 3},
    "dilated-window": {"dilation": 2, "window": 2},
    "sparse_fixed": {"block": 3, "summary": 1},
    "block_sparse": {"layout": LAYOUT, "block_size": 3},
    "bigbird": {"block_size": 2, "num_global_blocks": 1, "num_random_blocks": 1,
                "window_blocks": 1, "seed": 3},
    "linear": {"eps": 1e-300},
    "performer": {"num_features": 12, "seed": 0, "eps": 1e-300},
}


def backend(key: str):
    return get_backend(key.split("-")[0], **STATEFUL[key])


def qkv(t: int, seed: int = 0, b: int = 2, h: int = 2, d: int = 4):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=gen, dtype=torch.float64) for _ in range(3)]


def test_every_causal_backend_decodes_incrementally_except_lsh():
    causal = set(backends_supporting("causal"))
    assert set(backends_supporting("incremental")) == causal - {"lsh"}
    for name in {k.split("-")[0] for k in STATEFUL}:
        assert decodes_with_state(get_backend(name, **STATEFUL.get(name, {})))
    for name in ("full", "explicit", "chunked"):  # these attend over the cached keys instead
        assert not decodes_with_state(get_backend(name))


@pytest.mark.parametrize("steps", [(5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), (1,) * 16, (4, 3, 2, 7)])
@pytest.mark.parametrize("key", sorted(STATEFUL))
def test_decoding_in_steps_equals_the_causal_pass(key, steps):
    """A prompt, then one or several positions at a time, with padding: every output equals
    the backend's causal forward pass over all positions."""
    total = sum(steps)
    q, k, v = qkv(total)
    pad = torch.zeros(2, total, dtype=torch.bool)
    pad[1, :2] = True  # a left-padded row
    pad[0, 7] = True  # a padded position in the middle
    attn = backend(key)
    want = attn(q, k, v, key_padding_mask=pad, is_causal=True)
    got, state = decode_in_steps(attn, q, k, v, pad, steps)
    assert state.length == total
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("key", sorted(STATEFUL))
def test_a_position_output_does_not_depend_on_later_positions(key):
    """The property that makes a cache possible: the causal pass over a prefix equals the
    prefix of the causal pass over the whole sequence."""
    q, k, v = qkv(16, seed=1)
    attn = backend(key)
    full = attn(q, k, v, is_causal=True)
    for t in (1, 5, 9, 12):
        torch.testing.assert_close(attn(q[:, :, :t], k[:, :, :t], v[:, :, :t], is_causal=True),
                                   full[:, :, :t], rtol=1e-10, atol=1e-12)


def test_lsh_is_refused_because_its_buckets_depend_on_later_positions():
    """LSH sorts the whole sequence by bucket and attends within chunks of the sorted order, so
    appending positions moves earlier ones between chunks and changes their outputs: no cache
    of earlier positions can reproduce the uncached pass."""
    q, k, v = qkv(24, seed=2)
    attn = get_backend("lsh", n_buckets=4, n_rounds=1, chunk_size=2, seed=0)
    full = attn(q, k, v, is_causal=True)
    prefix = attn(q[:, :, :12], k[:, :, :12], v[:, :, :12], is_causal=True)
    assert (prefix - full[:, :, :12]).abs().max() > 0.1
    assert not backend_capabilities("lsh").incremental


def lm(key: str, **kw) -> TransformerLM:
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=13, d_model=16, n_heads=2, n_layers=2, max_len=64,
                            attn_backend=key.split("-")[0], attn_backend_options=STATEFUL[key],
                            **kw)
    return TransformerLM(cfg).double().eval()


@pytest.mark.parametrize("key", sorted(STATEFUL))
def test_cached_generation_equals_uncached_token_for_token(key):
    model = lm(key)
    prompt = torch.randint(0, 13, (3, 5), generator=torch.Generator().manual_seed(4))
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[2, :2] = True
    cached = model.generate(prompt, 18, key_padding_mask=pad, use_cache=True)
    uncached = model.generate(prompt, 18, key_padding_mask=pad, use_cache=False)
    assert torch.equal(cached, uncached)
    beams = [model.generate(prompt[:1], 6, num_beams=3, use_cache=c) for c in (True, False)]
    assert torch.equal(*beams)


@pytest.mark.parametrize("key", ["sliding_window", "linear", "performer", "bigbird"])
def test_cached_step_logits_equal_the_full_pass(key):
    """Each cached step's logits equal the last position of the uncached pass (float64)."""
    model = lm(key, positional="rope")
    ids = torch.randint(0, 13, (2, 20), generator=torch.Generator().manual_seed(5))
    cache = model.new_cache()
    got = [model(ids[:, :6], cache=cache)]
    got += [model(ids[:, t:t + 1], cache=cache) for t in range(6, 20)]
    torch.testing.assert_close(torch.cat(got, dim=1), model(ids), rtol=1e-9, atol=1e-10)


def test_sliding_window_state_stays_at_the_window_and_kernel_states_do_not_grow():
    """Nothing in the cache grows with the length: not the states, not the positions and
    padding (only the newest tokens' are kept when every layer decodes with a state)."""
    sizes = {}
    for key in ("sliding_window", "linear", "performer"):
        model = lm(key)
        cache = model.new_cache()
        ids = torch.randint(0, 13, (1, 40), generator=torch.Generator().manual_seed(6))
        model(ids[:, :2], cache=cache)
        layer_bytes, whole = [], []
        for t in range(2, 40):
            model(ids[:, t:t + 1], cache=cache)
            layer_bytes.append(sum(lay.state.nbytes for lay in cache.layers))
            whole.append(cache.nbytes)
        assert len(set(whole[3:])) == 1, key
        assert cache.layers[0].k is None  # no growing key/value cache
        assert cache.length == 40 and cache.positions.shape == (1, 1)
        sizes[key] = layer_bytes
        assert layer_bytes[5] == layer_bytes[-1], key
    window = STATEFUL["sliding_window"]["window"]
    model = lm("sliding_window")
    cache = model.new_cache()
    model(torch.zeros(1, 9, dtype=torch.long), cache=cache)
    assert cache.layers[0].state.tensors["k"].shape[2] == window
    # 2 layers × (keys and values: 2 heads × window × head_dim 8 × 8 bytes, + window pad flags)
    assert sizes["sliding_window"][0] == 2 * (2 * 2 * window * 8 * 8 + window)


def test_beam_search_reorders_the_decoding_state():
    state = DecodeState(3, {"kv": torch.arange(4.0)[:, None].expand(4, 2)})
    state.reorder(torch.tensor([2, 2, 0, 1]))
    assert state.tensors["kv"][:, 0].tolist() == [2.0, 2.0, 0.0, 1.0]


def test_seq2seq_decoder_with_a_sliding_window_generates_with_its_cache():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=13, d_model=16, n_heads=2, n_layers=1, max_len=40,
                            attn_backend="sliding_window",
                            attn_backend_options=STATEFUL["sliding_window"],
                            cross_attn_backend="full")
    model = Seq2SeqTransformer(cfg).double().eval()
    src = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(7))
    out = [model.generate(src, 12, bos_token_id=1, use_cache=c) for c in (True, False)]
    assert torch.equal(*out)


def test_default_generation_caches_where_every_backend_can_and_recomputes_otherwise(
        monkeypatch):
    """use_cache=None (the default): an lsh LM, whose buckets depend on later positions,
    generates by recomputing the prefix (the same tokens as use_cache=False) instead of
    raising; a sliding-window LM generates with its cache; True refuses lsh, naming it."""
    from graded.transformer import generation

    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=13, d_model=16, n_heads=2, n_layers=2, max_len=64,
                            attn_backend="lsh",
                            attn_backend_options=dict(n_buckets=4, chunk_size=4, seed=0))
    model = TransformerLM(cfg).double().eval()
    prompt = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(1))
    assert generation.cacheless_backends(model) == [
        ("stack.blocks.0.self_attn", "lsh"), ("stack.blocks.1.self_attn", "lsh")]
    assert torch.equal(model.generate(prompt, 6), model.generate(prompt, 6, use_cache=False))
    with pytest.raises(ValueError, match=r"'lsh'.*use_cache=False or None"):
        model.generate(prompt, 6, use_cache=True)
    with pytest.raises(TypeError, match="use_cache must be None, True or False, got 'yes'"):
        model.generate(prompt, 6, use_cache="yes")

    caches = []
    original = generation.KVCache.empty

    def spy(n_layers):
        caches.append(n_layers)
        return original(n_layers)

    monkeypatch.setattr(generation.KVCache, "empty", staticmethod(spy))
    window = lm("sliding_window")
    assert generation.resolve_use_cache(window, None)
    window.generate(prompt, 3)
    assert caches == [window.decoder.n_layers]
