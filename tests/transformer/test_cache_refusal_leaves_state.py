"""A decoding step the KV cache refuses leaves the cache as it was: the same length, positions,
padding, every layer's keys, values, cross-attention keys and values, and the same record of
the encoder memory. The caller corrects the call and repeats the step, and decodes what a
cache that never saw the bad call decodes: the uncached pass over the whole sequence."""

import copy

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM

CONFIG = {"vocab_size": 17, "d_model": 16, "n_heads": 2, "n_layers": 2, "max_len": 32,
          "dropout": 0.0}


def seq2seq(**overrides):
    torch.manual_seed(0)
    return Seq2SeqTransformer(TransformerConfig(**{**CONFIG, **overrides})).eval()


def assert_same_cache(cache, before):
    """``cache`` holds what ``before`` (a deep copy taken earlier) holds, tensor for tensor."""
    assert cache.length == before.length
    for name in ("positions", "key_padding_mask", "real"):
        got, want = getattr(cache, name), getattr(before, name)
        assert (got is None) == (want is None), name
        assert got is None or torch.equal(got, want), name
    assert len(cache.layers) == len(before.layers)
    for i, (layer, old) in enumerate(zip(cache.layers, before.layers, strict=True)):
        for name in ("k", "v", "cross_k", "cross_v"):
            got, want = getattr(layer, name), getattr(old, name)
            assert (got is None) == (want is None), (i, name)
            assert got is None or torch.equal(got, want), (i, name)
        assert (layer.state is None) == (old.state is None), i
        if layer.state is not None:
            assert layer.state.nbytes == old.state.nbytes, i


def assert_same_record(cache, before, memory):
    """The memory record still names ``memory`` (the tensor itself), with the step count,
    version and shape it had in ``before``."""
    record, old = cache.memory_record, before.memory_record
    assert record.memory is memory
    assert torch.equal(record.memory, old.memory)
    assert (record.steps, record.version, record.shape) == (old.steps, old.version, old.shape)


def steps(model, tgt, memory, cache):
    return torch.cat([model.decode(tgt[:, i:i + 1], memory, cache=cache)
                      for i in range(tgt.shape[1])], dim=1)


REFUSED_MEMORIES = {
    "other values": (lambda m: m + 1.0, "other values"),
    "another shape": (lambda m: m[:, :4].clone(), r"has shape \(2, 4, 16\)"),
    "another source": (lambda m: m.flip(1).clone(), "other values"),
}


@pytest.mark.parametrize("kind", list(REFUSED_MEMORIES))
@torch.no_grad()
def test_a_step_refused_for_its_memory_leaves_the_cache_and_the_record_unchanged(kind):
    """The old cache had written the refused step's token (length 3 -> 4) and its keys and
    values into every layer before the first cross-attention looked at the memory."""
    model = seq2seq()
    src = torch.randint(0, 17, (2, 5))
    tgt = torch.randint(0, 17, (2, 4))
    memory = model.encode(src)
    cache = model.new_cache()
    model.decode(tgt[:, :2], memory, cache=cache)  # the prompt: two tokens in one step
    model.decode(tgt[:, 2:3], memory, cache=cache)
    before = copy.deepcopy(cache)
    bad, message = REFUSED_MEMORIES[kind]
    with pytest.raises(ValueError, match=r"step 3 of the cache: .*" + message):
        model.decode(tgt[:, 3:], bad(memory), cache=cache)
    assert_same_cache(cache, before)
    assert_same_record(cache, before, memory)


@torch.no_grad()
def test_a_step_refused_for_a_memory_changed_in_place_leaves_the_cache_unchanged():
    model = seq2seq()
    memory = model.encode(torch.randint(0, 17, (2, 5)))
    tgt = torch.randint(0, 17, (2, 3))
    cache = model.new_cache()
    steps(model, tgt[:, :2], memory, cache)
    before = copy.deepcopy(cache)
    memory.mul_(2.0)
    with pytest.raises(ValueError, match=r"step 3 of the cache: .*changed in place"):
        model.decode(tgt[:, 2:], memory, cache=cache)
    assert_same_cache(cache, before)
    assert cache.memory_record.steps == before.memory_record.steps
    with pytest.raises(ValueError, match=r"step 3 of the cache: .*changed in place"):
        model.decode(tgt[:, 2:], memory, cache=cache)  # refused again, the same step


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_the_step_repeated_with_the_right_memory_decodes_as_the_uncached_pass(mode):
    """Refused twice (other values, another shape), then repeated with the memory the cache
    began with: every step's logits are those of the uncached decoder over the whole target,
    and equal, bit for bit, those of a cache that never saw the refused calls. The old cache
    refused the repeated step too (it held the refused step's token)."""
    model = seq2seq()
    src = torch.randint(0, 17, (2, 5))
    tgt = torch.randint(0, 17, (2, 5))
    with getattr(torch, mode)():
        memory = model.encode(src)
        full = model.decode(tgt, memory)
        cache = model.new_cache()  # the same steps, without the refused calls
        clean = torch.cat([model.decode(tgt[:, :2], memory, cache=cache),
                           steps(model, tgt[:, 2:], memory, cache)], dim=1)
        cache = model.new_cache()
        got = [model.decode(tgt[:, :2], memory, cache=cache)]
        for bad in (memory + 1.0, memory[:, :3].clone()):
            with pytest.raises(ValueError, match="step 2 of the cache"):
                model.decode(tgt[:, 2:3], bad, cache=cache)
        got += [model.decode(tgt[:, i:i + 1], memory, cache=cache) for i in range(2, 5)]
        got = torch.cat(got, dim=1)
    assert cache.length == 5 and cache.memory_record.steps == 4
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, clean, atol=0, rtol=0)


@torch.no_grad()
def test_a_first_step_refused_for_its_memory_leaves_the_cache_empty():
    """A memory of another batch or width is refused before the first step projects it: the
    old cache kept the step's positions, the first layer's keys and, for another batch, the
    memory's cross-attention keys and its record, so the corrected step was refused too."""
    model = seq2seq()
    src = torch.randint(0, 17, (2, 5))
    tgt = torch.randint(0, 17, (2, 3))
    memory = model.encode(src)
    cache = model.new_cache()
    for bad, shape in ((memory[[0, 1, 1]], r"\(3, 5, 16\)"), (memory[..., :8], r"\(2, 5, 8\)")):
        with pytest.raises(ValueError, match=rf"memory has shape {shape}; expected .*\(2, S, 16\)"):
            model.decode(tgt[:, :1], bad, cache=cache)
    assert_same_cache(cache, model.new_cache())
    assert cache.memory_record is None
    got = steps(model, tgt, memory, cache)
    torch.testing.assert_close(got, model.decode(tgt, memory), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_step_refused_by_a_later_layer_backend_leaves_the_cache_unchanged():
    """With ``attn_backend_cycle`` the second layer's backend (lsh) cannot decode with a cache:
    the old call refused it after the first layer had cached its keys."""
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(
        **CONFIG, attn_backend_cycle=[{}, {"backend": "lsh",
                                           "options": {"chunk_size": 4}}])).eval()
    cache = model.new_cache()
    with pytest.raises(ValueError, match=r"attention backend 'lsh' cannot serve .*use_cache=False"):
        model(torch.randint(0, 17, (2, 3)), cache=cache)
    assert_same_cache(cache, model.new_cache())


@torch.no_grad()
def test_a_step_refused_for_attention_weights_of_a_decoding_state_leaves_the_cache_unchanged():
    """A backend that decodes through a state of its own (linear attention) gives no weights:
    the old call refused need_weights after recording the step's positions."""
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(**CONFIG, attn_backend="linear")).eval()
    ids = torch.randint(0, 17, (2, 4))
    cache = model.new_cache()
    model(ids[:, :3], cache=cache)
    before = copy.deepcopy(cache)
    with pytest.raises(ValueError, match=r"linear.* cannot serve .*need_weights=False"):
        model(ids[:, 3:], cache=cache, need_weights=True)
    assert_same_cache(cache, before)
    torch.testing.assert_close(model(ids[:, 3:], cache=cache), model(ids)[:, 3:],
                               atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_reorder_refused_for_its_index_keeps_the_recorded_memory():
    """The old reorder recorded the new memory before selecting the rows, so an index out of
    range left the cache's keys as they were and its record naming the other memory."""
    model = seq2seq()
    memory = model.encode(torch.randint(0, 17, (2, 5)))
    cache = model.new_cache()
    model.decode(torch.randint(0, 17, (2, 2)), memory, cache=cache)
    before = copy.deepcopy(cache)
    index = torch.tensor([1, 2])
    with pytest.raises(IndexError):
        cache.reorder(index, memory=memory.flip(0).clone())
    assert_same_cache(cache, before)
    assert_same_record(cache, before, memory)


@torch.no_grad()
@pytest.mark.parametrize("first", [True, False], ids=["first step", "later step"])
def test_a_step_refused_for_its_memorys_dtype_leaves_the_cache_unchanged(first):
    """A memory of another dtype than the model's (float64 for a float32 model, or integer)
    is refused, naming both dtypes, before the step changes the cache: the first step used to
    record the memory, the step's positions and the first layer's keys before the second
    layer's projection failed, and the corrected step then failed too ('output with shape
    [2, 2, 1, 1] doesn't match the broadcast shape [2, 2, 1, 2]')."""
    model = seq2seq()
    memory = model.encode(torch.randint(0, 17, (2, 5)))
    tgt = torch.randint(0, 17, (2, 3))
    cache = model.new_cache()
    done = 0 if first else 1
    if not first:
        model.decode(tgt[:, :1], memory, cache=cache)
    before = copy.deepcopy(cache)
    for bad in (memory.double(), memory.long()):
        with pytest.raises(TypeError, match=rf"encoder memory is {bad.dtype}, the model's "
                                            r"weights torch.float32; expected the same dtype"):
            model.decode(tgt[:, done:done + 1], bad, cache=cache)
        assert_same_cache(cache, before)
    got = steps(model, tgt[:, done:], memory, cache)
    torch.testing.assert_close(got, model.decode(tgt, memory)[:, done:], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_first_step_refused_for_its_memorys_device_leaves_the_cache_empty():
    """A memory on another device than the model (here "meta") is refused, naming both, before
    the first step records anything: the projection used to fail after the step's positions
    were cached ('Tensor on device cpu is not on the expected device meta')."""
    model = seq2seq()
    memory = model.encode(torch.randint(0, 17, (2, 5)))
    tgt = torch.randint(0, 17, (2, 3))
    cache = model.new_cache()
    with pytest.raises(ValueError, match=r"encoder memory is on meta, the model on cpu"):
        model.decode(tgt[:, :1], memory.to("meta"), cache=cache)
    assert_same_cache(cache, model.new_cache())
    assert cache.memory_record is None
    got = steps(model, tgt, memory, cache)
    torch.testing.assert_close(got, model.decode(tgt, memory), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_under_autocast_a_memory_of_another_half_or_single_dtype_is_taken():
    """Autocast casts a float16, bfloat16 or float32 memory and the weights to its dtype, so
    such a memory is not refused for its dtype there (a float64 one it leaves as it is)."""
    model = seq2seq()
    memory = model.encode(torch.randint(0, 17, (2, 5)))
    tgt = torch.randint(0, 17, (2, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model.decode(tgt, memory)
        torch.testing.assert_close(model.decode(tgt, memory.bfloat16()), want,
                                   atol=0.05, rtol=0.05)
        with pytest.raises(TypeError, match=r"encoder memory is torch\.float64"):
            model.decode(tgt, memory.double())


@torch.no_grad()
@pytest.mark.parametrize("value", ["no", 1, None])
def test_a_step_refused_for_need_weights_not_a_bool_leaves_the_cache_unchanged(value):
    """need_weights takes True or False only: the first layer's attention refused another value
    after the step's positions were cached (the length grew by the step at each refusal)."""
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(**CONFIG)).eval()
    ids = torch.randint(0, 17, (2, 4))
    cache = model.new_cache()
    model(ids[:, :3], cache=cache)
    before = copy.deepcopy(cache)
    with pytest.raises(TypeError, match=rf"^need_weights must be True or False, got "
                                        rf"{value!r} \({type(value).__name__}\)$"):
        model(ids[:, 3:], cache=cache, need_weights=value)
    assert_same_cache(cache, before)
    torch.testing.assert_close(model(ids[:, 3:], cache=cache), model(ids)[:, 3:],
                               atol=1e-5, rtol=1e-5)
