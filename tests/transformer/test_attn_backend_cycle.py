"""``TransformerConfig.attn_backend_cycle``: one attention type per residual block,
interleaved over the layers, attention(X) = W_p · attend(X, A^(r mod p)) (Child et al. 2019,
§5.1, Eq. 6). A cycled model is compared with the same weights on backends given to each
layer by hand, and each layer's captured pattern with the written-out A^(r mod p)."""

from __future__ import annotations

import pytest
import torch

from graded import TransformerConfig, TransformerLM
from graded.attention import MultiheadAttention
from graded.attention.backends import get_backend
from graded.transformer.generation import cacheless_backends, resolve_use_cache

BLOCK, SUMMARY, WINDOW, STRIDE = 4, 1, 4, 4  # strided: window = dilation = l
FIXED = dict(attn_backend="sparse_fixed", attn_backend_options={"block": BLOCK,
                                                                "summary": SUMMARY},
             attn_backend_cycle=[{"options": {"part": "local"}},
                                 {"options": {"part": "summary"}}])
STRIDED = dict(attn_backend="sliding_window", attn_backend_options={"window": WINDOW},
               attn_backend_cycle=[{}, {"backend": "dilated", "options": {"dilation": STRIDE}}])
# the written-out sets of each cycle, per layer r mod 2 (before causality)
SETS = {
    "fixed": [lambda i, j: i // BLOCK == j // BLOCK, lambda i, j: j % BLOCK >= BLOCK - SUMMARY],
    "strided": [lambda i, j: abs(i - j) <= WINDOW, lambda i, j: (i - j) % STRIDE == 0],
}
BY_HAND = {
    "fixed": [lambda: get_backend("sparse_fixed", block=BLOCK, summary=SUMMARY, part="local"),
              lambda: get_backend("sparse_fixed", block=BLOCK, summary=SUMMARY,
                                  part="summary")],
    "strided": [lambda: get_backend("sliding_window", window=WINDOW),
                lambda: get_backend("dilated", dilation=STRIDE)],
}
CYCLES = {"fixed": FIXED, "strided": STRIDED}


def lm(n_layers=3, seed=0, **fields):
    cfg = TransformerConfig(vocab_size=11, d_model=12, n_heads=3, n_layers=n_layers,
                            max_len=32, **fields)
    torch.manual_seed(seed)
    return TransformerLM(cfg).double().eval()


def attentions(model):
    return [m for m in model.modules() if isinstance(m, MultiheadAttention)]


IDS = torch.randint(0, 11, (2, 13), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", ["fixed", "strided"])
def test_a_cycled_lm_equals_the_stack_with_each_layers_backend_given_by_hand(name):
    """Three layers: layer r on A^(r mod 2), the same weights as a model whose attention
    modules are given those backends one by one."""
    cycled = lm(**CYCLES[name])
    plain = lm(attn_backend="full")
    plain.load_state_dict(cycled.state_dict())
    for r, module in enumerate(attentions(plain)):
        module.backend = BY_HAND[name][r % 2]()
    with torch.no_grad():
        torch.testing.assert_close(cycled(IDS), plain(IDS), rtol=1e-12, atol=1e-12)
        assert not torch.allclose(cycled(IDS), lm(attn_backend="full")(IDS))


@pytest.mark.parametrize("name", ["fixed", "strided"])
def test_each_layers_captured_pattern_is_the_written_out_set_of_r_mod_p(name):
    from graded.analysis import capture_attention

    model = lm(**CYCLES[name])
    t = IDS.shape[1]
    with torch.no_grad(), capture_attention(model) as calls:
        model(IDS)
    assert len(calls) == 3
    for r, call in enumerate(calls):
        rule = SETS[name][r % 2]
        want = torch.tensor([[rule(i, j) and j <= i for j in range(t)] for i in range(t)])
        assert torch.equal(call.pattern.expand(t, t), want), r


def test_a_cycle_of_one_entry_equals_no_cycle_with_its_options_merged():
    one = lm(attn_backend="sparse_fixed", attn_backend_options={"block": BLOCK, "summary": 2},
             attn_backend_cycle=[{"options": {"part": "summary"}}])
    flat = lm(attn_backend="sparse_fixed",
              attn_backend_options={"block": BLOCK, "summary": 2, "part": "summary"})
    assert [(m.backend.block, m.backend.summary, m.backend.part) for m in attentions(one)] == [
        (BLOCK, 2, "summary")] * 3
    with torch.no_grad():
        assert torch.equal(one(IDS), flat(IDS))


def test_another_backends_options_are_used_alone_and_stacks_count_layers_from_zero():
    """An entry on another backend does not inherit attn_backend_options; a seq2seq model's
    encoder and decoder each start the cycle at their layer 0; cross-attention keeps its own
    backend."""
    from graded import Seq2SeqTransformer

    cfg = TransformerConfig(vocab_size=11, d_model=12, n_heads=3, n_layers=3,
                            n_decoder_layers=2, **STRIDED)
    model = Seq2SeqTransformer(cfg)
    enc = [type(b.self_attn.attn.backend).__name__ for b in model.encoder.stack.blocks]
    dec = [type(b.self_attn.attn.backend).__name__ for b in model.decoder.stack.blocks]
    assert enc == ["SlidingWindowBackend", "DilatedBackend", "SlidingWindowBackend"]
    assert dec == ["SlidingWindowBackend", "DilatedBackend"]
    assert model.decoder.stack.blocks[1].self_attn.attn.backend.dilation == STRIDE
    assert all(b.cross_attn.attn.backend_name == "full" for b in model.decoder.stack.blocks)


@pytest.mark.parametrize("name", ["fixed", "strided"])
def test_cached_generation_equals_uncached_for_a_cycled_lm(name):
    model = lm(**CYCLES[name])
    assert resolve_use_cache(model, None) is True
    prompt = IDS[:, :5]
    cached = model.generate(prompt, 9, use_cache=True)
    uncached = model.generate(prompt, 9, use_cache=False)
    assert torch.equal(cached, uncached)


def test_a_cycled_backend_without_incremental_decoding_falls_back_to_recomputation():
    """lsh cannot decode with a cache: only its layers are listed, use_cache=None recomputes
    (the same tokens as use_cache=False) and use_cache=True is refused naming it."""
    model = lm(n_layers=2, attn_backend="full",
               attn_backend_cycle=[{}, {"backend": "lsh", "options": {"chunk_size": 4}}])
    assert [backend for _, backend in cacheless_backends(model)] == ["lsh"]
    assert resolve_use_cache(model, None) is False
    prompt = IDS[:, :4]
    assert torch.equal(model.generate(prompt, 4), model.generate(prompt, 4, use_cache=False))
    with pytest.raises(ValueError, match="attention backend 'lsh'"):
        model.generate(prompt, 4, use_cache=True)


def test_the_config_round_trips_through_to_dict_and_a_run_config():
    from graded.config.schema import validate_config

    cfg = TransformerConfig(**FIXED)
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["attn_backend_cycle"] == FIXED["attn_backend_cycle"]
    run = validate_config({
        "task": {"name": "polynomial_regression", "n_train": 64, "n_eval": 32},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 2, **STRIDED},
        "train": {"steps": 10, "batch_size": 16},
    })
    assert run.model.attn_backend_cycle == STRIDED["attn_backend_cycle"]


@pytest.mark.parametrize("fields,message", [
    ({"attn_backend_cycle": [{}, {"backnd": "dilated"}]},
     r"attn_backend_cycle\[1\]=\{'backnd': 'dilated'\} is invalid: expected a dict with "
     r"optional keys backend, options, not 'backnd'"),
    ({"attn_backend_cycle": [{"backend": "sparse"}]},
     r"attn_backend_cycle\[0\].backend='sparse' is invalid: expected a backend name, one of "
     r"bigbird, .*sparse_fixed"),
    ({"attn_backend_cycle": [{"options": "local"}]},
     r"attn_backend_cycle\[0\].options='local' is invalid: expected a dict of backend options"),
    ({**FIXED, "attn_backend_cycle": [{"options": {"part": "A1"}}]},
     r"attn_backend_cycle\[0\].options=\{'part': 'A1'\} is invalid: expected options that "
     r"backend 'sparse_fixed' accepts \(sparse_fixed backend: part must be one of"),
    ({**STRIDED, "attn_backend_cycle": [{}, {"backend": "dilated", "options": {"window": 3,
                                                                              "stride": 2}}]},
     r"attn_backend_cycle\[1\].options=.* expected options that backend 'dilated' accepts "
     r"\(attention backend 'dilated' has no option\(s\) stride"),
    ({"positional": "alibi", "attn_backend_cycle": [{}, {"backend": "sliding_window"}]},
     r"attn_backend_cycle\[1\].backend='sliding_window' is invalid: expected a backend that "
     r"serves an additive float attention bias"),
    ({"attn_score": "dot", "attn_backend_cycle": [{"backend": "dilated"}]},
     r"attn_backend_cycle\[0\].backend='dilated' is invalid: expected a backend that serves a "
     r"custom score function"),
])
def test_bad_cycle_entries_are_refused_naming_the_entry(fields, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**fields)


def test_a_decoder_refuses_a_cycled_backend_without_a_causal_form_naming_the_entry():
    cfg = TransformerConfig(vocab_size=11, d_model=12, n_heads=3, n_layers=2, max_len=16,
                            attn_backend_cycle=[{}, {"backend": "linformer",
                                                     "options": {"max_len": 16, "rank": 4}}])
    with pytest.raises(ValueError, match=r"attention backend 'linformer' cannot serve causal "
                                         r".*TransformerConfig.attn_backend_cycle\[1\].backend"):
        TransformerLM(cfg)


def test_hugging_face_export_refuses_a_cycle():
    from graded.interop import to_gpt2

    model = lm(n_layers=2, attn_backend="full", positional="learned", activation="gelu_tanh",
               attn_backend_cycle=[{}, {"backend": "chunked"}])
    with pytest.raises(ValueError, match=r"to_gpt2: TransformerConfig.attn_backend_cycle=.* "
                                         "a Hugging Face model cannot express"):
        to_gpt2(model)
