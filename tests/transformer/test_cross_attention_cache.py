"""Cached cross-attention remembers the encoder memory its keys and values were projected from:
a later step with another memory, or the same one changed in place, is refused instead of
attending to the old memory; generation (greedy, sampled, beams with reordering) and a
reorder that moves the memory along still decode what the uncached pass gives."""

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig


def seq2seq(**overrides):
    torch.manual_seed(0)
    cfg = TransformerConfig(**{"vocab_size": 17, "d_model": 16, "n_heads": 2, "n_layers": 2,
                               "max_len": 32, "dropout": 0.0, **overrides})
    return Seq2SeqTransformer(cfg).eval()


def cached_steps(model, tgt, memory, cache):
    """Logits of ``tgt`` decoded one token a step through ``cache``; ``memory`` is a tensor,
    or a list of one per step."""
    memories = memory if isinstance(memory, list) else [memory] * tgt.shape[1]
    return torch.cat([model.decode(tgt[:, i:i + 1], memories[i], cache=cache)
                      for i in range(tgt.shape[1])], dim=1)


@torch.no_grad()
def test_a_step_with_another_memory_is_refused_naming_the_decoder_and_step():
    """The old cache answered the third step from the first memory: its logits were those of
    the uncached decoder over the old memory, not the new one."""
    model = seq2seq()
    src = torch.randint(0, 17, (2, 5))
    tgt = torch.randint(0, 17, (2, 3))
    old, new = model.encode(src), model.encode(src.flip(1))
    cache = model.new_cache()
    cached_steps(model, tgt[:, :2], old, cache)
    with pytest.raises(ValueError, match=r"TransformerDecoder, step 3 of the cache: the encoder "
                       r"memory holds other values .*cache is unchanged.*new cache"):
        model.decode(tgt[:, 2:], new, cache=cache)


@torch.no_grad()
def test_the_memory_encoded_again_at_each_step_is_taken_and_decodes_as_the_uncached_pass():
    """Equal values in a new tensor (the source encoded again) are the memory the keys came
    from: compared once with the recorded one and taken; another source's memory, or one of
    another shape, is refused."""
    model = seq2seq()
    src = torch.randint(0, 17, (2, 5))
    tgt = torch.randint(0, 17, (2, 4))
    cache = model.new_cache()
    got = cached_steps(model, tgt, [model.encode(src) for _ in range(4)], cache)
    torch.testing.assert_close(got, model.decode(tgt, model.encode(src)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"step 5 .*has shape \(2, 4, 16\)"):
        model.decode(tgt[:, :1], model.encode(src[:, :4]), cache=cache)


@torch.no_grad()
def test_another_tensor_after_the_recorded_one_changed_in_place_is_refused():
    model = seq2seq()
    src = torch.randint(0, 17, (2, 5))
    tgt = torch.randint(0, 17, (2, 2))
    memory = model.encode(src)
    cache = model.new_cache()
    cached_steps(model, tgt[:, :1], memory, cache)
    again = memory.clone()
    memory.zero_()
    with pytest.raises(ValueError, match=r"another tensor, and the one .* changed since"):
        model.decode(tgt[:, 1:], again, cache=cache)


@torch.no_grad()
def test_a_memory_changed_in_place_between_steps_is_refused():
    model = seq2seq()
    memory = model.encode(torch.randint(0, 17, (2, 5)))
    tgt = torch.randint(0, 17, (2, 3))
    cache = model.new_cache()
    cached_steps(model, tgt[:, :1], memory, cache)
    memory.mul_(2.0)  # through a view too: views share the version counter
    with pytest.raises(ValueError, match=r"TransformerDecoder, step 2 .*changed in place"):
        model.decode(tgt[:, 1:2], memory, cache=cache)


@torch.no_grad()
def test_a_memory_changed_through_a_view_or_given_other_data_is_refused():
    model = seq2seq()
    tgt = torch.randint(0, 17, (2, 2))
    memory = model.encode(torch.randint(0, 17, (2, 5)))
    cache = model.new_cache()
    cached_steps(model, tgt[:, :1], memory, cache)
    memory[1:].zero_()
    with pytest.raises(ValueError, match="changed in place"):
        model.decode(tgt[:, 1:], memory, cache=cache)

    memory = model.encode(torch.randint(0, 17, (2, 5)))
    cache = model.new_cache()
    cached_steps(model, tgt[:, :1], memory, cache)
    memory.data = torch.randn_like(memory)  # other storage, no version bump
    with pytest.raises(ValueError, match="holds other data"):
        model.decode(tgt[:, 1:], memory, cache=cache)


@torch.no_grad()
def test_a_refused_step_repeated_with_the_right_memory_decodes_as_the_uncached_pass():
    """The step is refused before it changes the cache: repeated with the first memory, it is
    step 2 again, and the steps decode what the uncached pass gives (more in
    test_cache_refusal_leaves_state.py)."""
    model = seq2seq()
    tgt = torch.randint(0, 17, (2, 3))
    memory = model.encode(torch.randint(0, 17, (2, 5)))
    cache = model.new_cache()
    first = cached_steps(model, tgt[:, :1], memory, cache)
    with pytest.raises(ValueError, match=r"step 2 of the cache: .*other values"):
        model.decode(tgt[:, 1:2], memory + 1.0, cache=cache)
    rest = cached_steps(model, tgt[:, 1:], memory, cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), model.decode(tgt, memory),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_the_same_memory_at_every_step_decodes_as_the_uncached_pass(mode):
    """Inference tensors keep no version counter: the record does without it."""
    model = seq2seq()
    src = torch.randint(0, 17, (2, 5))
    tgt = torch.randint(0, 17, (2, 6))
    with getattr(torch, mode)():
        memory = model.encode(src)
        full = model.decode(tgt, memory)
        stepped = cached_steps(model, tgt, memory, model.new_cache())
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("options", [{}, {"do_sample": True, "top_k": 5},
                                     {"num_beams": 3}, {"num_beams": 2, "eos_token_id": 4}])
def test_cached_generation_equals_uncached_generation(options, mode):
    """Beam search reorders the cache every step and passes the same repeated memory."""
    model = seq2seq()
    src = torch.randint(0, 17, (3, 6))
    outs = []
    with getattr(torch, mode)():
        for use_cache in (True, False):
            g = torch.Generator().manual_seed(1)
            outs.append(model.generate(src, 7, bos_token_id=1, use_cache=use_cache,
                                       generator=g, **options))
    assert torch.equal(*outs)


@torch.no_grad()
def test_a_reorder_that_moves_the_memory_along_decodes_the_reordered_rows():
    """``reorder(index, memory=memory[index])`` records the new memory: the next steps pass
    it (and the old one is refused); the logits are the uncached pass over the reordered
    rows. Without ``memory`` the next steps pass the old tensor (beam search: the rows it
    mixes are equal)."""
    model = seq2seq()
    src = torch.randint(0, 17, (3, 5))
    tgt = torch.randint(0, 17, (3, 4))
    memory = model.encode(src)
    index = torch.tensor([2, 0, 0])
    moved = memory.index_select(0, index)
    cache = model.new_cache()
    cached_steps(model, tgt[:, :2], memory, cache)
    cache.reorder(index, memory=moved)
    stepped = cached_steps(model, tgt[index, 2:], moved, cache)
    full = model.decode(tgt[index], moved)[:, 2:]
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="step 5 of the cache: the encoder memory holds other "):
        model.decode(tgt[index, 3:], memory, cache=cache)

    repeated = memory.repeat_interleave(2, dim=0)  # beams of one source: equal rows
    cache = model.new_cache()
    beams = tgt.repeat_interleave(2, dim=0)
    cached_steps(model, beams[:, :2], repeated, cache)
    swap = torch.tensor([1, 1, 3, 2, 4, 4])
    cache.reorder(swap)
    stepped = cached_steps(model, beams[swap, 2:], repeated, cache)
    torch.testing.assert_close(stepped, model.decode(beams[swap], repeated)[:, 2:],
                               atol=1e-5, rtol=1e-5)


def test_a_reorder_refuses_a_memory_of_other_rows():
    model = seq2seq()
    cache = model.new_cache()
    with pytest.raises(ValueError, match=r"memory has 2 row\(s\), the index 3"):
        cache.reorder(torch.tensor([0, 1, 1]), memory=torch.zeros(2, 5, 16))
    with pytest.raises(TypeError, match="memory must be a tensor"):
        cache.reorder(torch.tensor([0]), memory=[0.0])


@torch.no_grad()
def test_compiled_cached_decoding_is_unchecked_and_equals_eager():
    """Under the compiler the cache keeps no record (no Python state in the graph): the
    compiled decode traces without a graph break and gives the eager logits."""
    model = seq2seq()
    memory = model.encode(torch.randint(0, 17, (2, 5)))
    tgt = torch.randint(0, 17, (2, 3))
    eager = cached_steps(model, tgt, memory, model.new_cache())
    torch._dynamo.reset()
    decode = torch.compile(model.decode, backend="eager", fullgraph=True)
    cache = model.new_cache()
    compiled = torch.cat([decode(tgt[:, i:i + 1], memory, cache=cache) for i in range(3)],
                         dim=1)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    assert cache.memory_record is None


@torch.no_grad()
def test_a_refused_step_names_the_decoders_own_class():
    """A subclass of the decoder is named in the refusal as its other checks name it (the
    refusal named ``TransformerDecoder`` whatever the class)."""
    from graded.transformer import TransformerDecoder
    from graded.transformer.cache import KVCache

    class MyDecoder(TransformerDecoder):
        pass

    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=17, d_model=16, n_heads=2, n_layers=2, max_len=32,
                            dropout=0.0)
    decoder = MyDecoder(cfg, cross_attention=True).eval()
    memory = torch.randn(2, 5, 16)
    cache = KVCache.empty(decoder.n_layers)
    tgt = torch.randint(0, 17, (2, 2))
    decoder(tgt[:, :1], memory=memory, cache=cache)
    with pytest.raises(ValueError, match=r"^MyDecoder, step 2 of the cache: the encoder memory "
                       r"holds other values"):
        decoder(tgt[:, 1:], memory=memory + 1, cache=cache)


def test_a_memory_of_another_dtype_is_equal_only_to_values_it_holds_exactly():
    """The recorded memory is compared with a new one of another dtype in the dtype both
    convert to exactly: a bfloat16 copy of a float32 memory whose values bfloat16 does not
    hold is another memory (it was taken: the float32 memory was rounded to bfloat16 before
    the comparison), one whose values it holds is the same."""
    from graded.transformer.cache import MemoryRecord

    recorded = torch.tensor([[[1.0 + 2.0 ** -12, 2.0]]])  # 1 + 2^-12: not a bfloat16 value
    record = MemoryRecord(recorded)
    assert torch.equal(recorded.bfloat16().float(), torch.tensor([[[1.0, 2.0]]]))
    assert "holds other values" in record.refusal(recorded.bfloat16())
    exact = MemoryRecord(torch.tensor([[[1.5, 2.0]]]))
    assert exact.refusal(torch.tensor([[[1.5, 2.0]]], dtype=torch.bfloat16)) is None
    assert exact.refusal(torch.tensor([[[1.5, 2.0]]], dtype=torch.float64)) is None
