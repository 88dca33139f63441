"""Whole-model reference tests: our LMs against Hugging Face GPT-2 and LLaMA, and our encoder
against BERT, in float64.

Both are randomly initialised (no download); weights are mapped by :mod:`graded.interop`.
Hugging Face's LLaMA computes its RMSNorm and its rotary angles in float32 whatever the
model's dtype, so a float64 comparison to 1e-10 runs it with those two computations in the
model's dtype (:func:`llama_in_float64`; the formulas are unchanged), and the model as shipped
is compared at float32 precision.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from graded.interop import (  # noqa: E402
    from_bert,
    from_gpt2,
    from_llama,
    graft_grading,
    to_bert,
    to_gpt2,
    to_llama,
)

torch.set_default_dtype(torch.float32)


def _gpt2(**kw):
    cfg = transformers.GPT2Config(vocab_size=37, n_positions=24, n_embd=16, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=None, eos_token_id=None, **kw)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).double().eval()


def _llama(**kw):
    base = {"vocab_size": 41, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
            "rope_theta": 500.0, "bos_token_id": None, "eos_token_id": None,
            "pad_token_id": None}
    cfg = transformers.LlamaConfig(**{**base, **kw})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():  # norms away from 1 so that a wrong mapping cannot hide
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.3)
    return model


@pytest.fixture
def llama_in_float64(monkeypatch):
    """Hugging Face's LLaMA norm and rotary angles computed in the input's dtype."""
    from transformers.models.llama import modeling_llama as m

    def norm(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True)
                                              + self.variance_epsilon))

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].to(x.dtype) * self.inv_freq.to(x.device, x.dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    monkeypatch.setattr(m.LlamaRMSNorm, "forward", norm)
    monkeypatch.setattr(m.LlamaRotaryEmbedding, "forward", torch.no_grad()(rotary))


def _ids(vocab: int, shape=(3, 11)) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(1))


def test_gpt2_logits_equal_hugging_face_in_float64():
    hf = _gpt2()
    lm = from_gpt2(hf)
    ids = _ids(37)
    assert torch.allclose(lm(ids), hf(ids).logits, atol=1e-10, rtol=0)


@pytest.mark.parametrize(("kv_heads", "bias", "tied"), [(2, False, False), (4, True, True),
                                                        (1, False, False)])
def test_llama_logits_equal_hugging_face_in_float64(kv_heads, bias, tied, llama_in_float64):
    hf = _llama(num_key_value_heads=kv_heads, attention_bias=bias, mlp_bias=bias,
                tie_word_embeddings=tied)
    lm = from_llama(hf)
    ids = _ids(41)
    assert torch.allclose(lm(ids), hf(ids).logits, atol=1e-10, rtol=0)


def test_llama_as_shipped_agrees_to_float32_precision(monkeypatch):
    hf = _llama()
    lm = from_llama(hf)
    ids = _ids(41)
    assert torch.allclose(lm(ids), hf(ids).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("convert", ["gpt2", "llama"])
def test_greedy_and_beam_outputs_equal_hugging_face(convert, llama_in_float64):
    hf = _gpt2() if convert == "gpt2" else _llama()
    lm = from_gpt2(hf) if convert == "gpt2" else from_llama(hf)
    prompt = _ids(hf.config.vocab_size, (1, 4))
    ours = lm.generate(prompt, 8)
    theirs = hf.generate(prompt, max_new_tokens=8, do_sample=False, num_beams=1,
                         attention_mask=torch.ones_like(prompt))
    assert torch.equal(ours, theirs)
    prompts = _ids(hf.config.vocab_size, (2, 4))
    for early in (True, False, "never"):
        ours = lm.generate(prompts, 6, num_beams=3, early_stopping=early, eos_token_id=5,
                           pad_token_id=5, length_penalty=1.0)
        theirs = hf.generate(prompts, max_new_tokens=6, do_sample=False, num_beams=3,
                             early_stopping=early, eos_token_id=5, pad_token_id=5,
                             length_penalty=1.0, attention_mask=torch.ones_like(prompts))
        assert torch.equal(ours, theirs), early


def test_round_trips_give_back_the_same_hugging_face_weights(llama_in_float64):
    for hf, there, back in ((_gpt2(), from_gpt2, to_gpt2), (_llama(), from_llama, to_llama)):
        again = back(there(hf))
        theirs, mine = hf.state_dict(), again.state_dict()
        for key, value in theirs.items():
            assert torch.equal(mine[key], value), key


def test_a_local_checkpoint_folder_loads_without_downloading(tmp_path):
    hf = _gpt2()
    hf.save_pretrained(tmp_path / "gpt2")
    lm = from_gpt2(tmp_path / "gpt2")
    ids = _ids(37)
    assert torch.allclose(lm.double()(ids), hf(ids).logits, atol=1e-10, rtol=0)
    with pytest.raises(FileNotFoundError, match="not a local checkpoint folder"):
        from_gpt2(tmp_path / "missing")


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_grafted_grading_starts_from_the_pretrained_function(grading):
    lm = from_gpt2(_gpt2())
    graded = graft_grading(lm, grading, learnable_grades=True)
    ids = _ids(37)
    assert torch.allclose(graded(ids), lm(ids), atol=1e-12, rtol=0)
    grades = [p for n, p in graded.named_parameters() if n.endswith("grades")]
    assert grades and all(p.requires_grad for p in grades)
    with pytest.raises(ValueError, match="no Hugging Face counterpart"):
        to_gpt2(graded)


def test_untied_gpt2_logits_and_round_trip_equal_hugging_face():
    hf = _gpt2(tie_word_embeddings=False)
    with torch.no_grad():  # an output layer unlike the token embeddings
        hf.lm_head.weight.normal_(0.0, 1.0)
    lm = from_gpt2(hf)
    ids = _ids(37)
    assert torch.allclose(lm(ids), hf(ids).logits, atol=1e-10, rtol=0)
    again = to_gpt2(lm)
    assert not again.config.tie_word_embeddings
    for key, value in hf.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


@pytest.mark.parametrize("activation", ["gelu", "relu", "silu", "gelu_pytorch_tanh"])
def test_gpt2_with_another_activation_equals_hugging_face(activation):
    hf = _gpt2(activation_function=activation)
    lm = from_gpt2(hf)
    ids = _ids(37)
    assert torch.allclose(lm(ids), hf(ids).logits, atol=1e-10, rtol=0)
    assert torch.allclose(to_gpt2(lm).double()(ids).logits, hf(ids).logits, atol=1e-10, rtol=0)


@pytest.mark.parametrize("tied", [True, False])
def test_training_steps_on_the_converted_gpt2_follow_hugging_face(tied):
    """The same SGD steps on both models (one loss written out for both) keep them equal: the
    gradients, of tied or untied embeddings, are the same."""
    hf = _gpt2(tie_word_embeddings=tied)
    lm = from_gpt2(hf)
    hf.train()
    lm.train()
    ids = _ids(37, (4, 10))

    def loss(logits):
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 37),
                                                 ids[:, 1:].reshape(-1))

    optimisers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (hf, lm)]
    for _ in range(3):
        for opt, logits in zip(optimisers, (hf(ids).logits, lm(ids)), strict=True):
            opt.zero_grad()
            loss(logits).backward()
            opt.step()
    hf.eval()
    lm.eval()
    assert torch.allclose(lm(ids), hf(ids).logits, atol=1e-10, rtol=0)


@pytest.mark.parametrize(("saved", "load", "found", "expected"), [
    ("llama", from_gpt2, "llama", "gpt2"), ("gpt2", from_llama, "gpt2", "llama")],
    ids=["llama_as_gpt2", "gpt2_as_llama"])
def test_a_folder_of_another_architecture_is_refused(tmp_path, saved, load, found, expected):
    """Hugging Face would load it into randomly initialised weights and only log a report (a
    GPT-2 folder read as LLaMA even gets LLaMA's default 7B-parameter shape)."""
    (_llama() if saved == "llama" else _gpt2()).save_pretrained(tmp_path / saved)
    with pytest.raises(ValueError, match=f"model_type='{found}'; expected model_type="
                                         f"'{expected}'"):
        load(tmp_path / saved)


def test_a_folder_without_every_weight_or_a_config_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = _llama()
    hf.save_pretrained(tmp_path / "llama")
    weights = tmp_path / "llama" / "model.safetensors"
    state = load_file(weights)
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks weights .*model\.layers\.1\.mlp\.up_proj"):
        from_llama(tmp_path / "llama")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        from_llama(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("[1, 2")
    with pytest.raises(ValueError, match=r"config\.json is not a JSON object"):
        from_llama(tmp_path / "empty")


def test_a_local_llama_folder_loads_with_every_weight(tmp_path, llama_in_float64):
    hf = _llama(tie_word_embeddings=False)
    hf.save_pretrained(tmp_path / "llama")
    lm = from_llama(tmp_path / "llama")
    ids = _ids(41)
    assert torch.allclose(lm.double()(ids), hf(ids).logits, atol=1e-10, rtol=0)


def _lm(base: str, **fields):
    from graded.transformer import TransformerLM

    config = from_gpt2(_gpt2()).config if base == "gpt2" else from_llama(_llama()).config
    lm = TransformerLM(config.replace(**fields)).double().eval()
    torch.manual_seed(0)
    with torch.no_grad():  # biases and norms away from their initial 0 and 1
        for p in lm.parameters():
            p.normal_(0.0, 0.5)
    return lm


@pytest.mark.parametrize(("base", "field", "value"), [
    ("gpt2", "embed_scale", True), ("gpt2", "embed_norm", True), ("gpt2", "logit_bias", True),
    ("gpt2", "final_norm", False), ("gpt2", "n_kv_heads", 2), ("gpt2", "qkv_bias", False),
    ("gpt2", "ffn_bias", False), ("gpt2", "attn_score", "dot"), ("gpt2", "positional", "rope"),
    ("gpt2", "activation", "swiglu"), ("llama", "embed_scale", True),
    ("llama", "logit_bias", True), ("llama", "embed_norm", True), ("llama", "out_bias", True),
    ("llama", "norm_first", False), ("llama", "attn_score", "dot"),
])
def test_exports_refuse_what_the_reference_cannot_express(base, field, value):
    """Each of these fields changes the function (the logits differ from the same weights
    without it), so an export that dropped it would be a different model."""
    lm = _lm(base, **{field: value})
    plain = _lm(base)
    shared = {k: v for k, v in lm.state_dict().items() if k in plain.state_dict()
              and v.shape == plain.state_dict()[k].shape}
    plain.load_state_dict(shared, strict=False)
    ids = _ids(lm.config.vocab_size)
    assert not torch.allclose(lm(ids), plain(ids), atol=1e-6)
    export = to_gpt2 if base == "gpt2" else to_llama
    with pytest.raises(ValueError, match=f"{field}={value!r} \\(expected "):
        export(lm)


def test_exports_refuse_attention_that_is_not_exact():
    lm = _lm("gpt2", attn_backend="sliding_window", attn_backend_options={"window": 2})
    with pytest.raises(ValueError, match="attn_backend='sliding_window' is not exact"):
        to_gpt2(lm)


@pytest.mark.parametrize("backend", ["full", "explicit", "chunked"])
@pytest.mark.parametrize("base", ["gpt2", "llama"])
def test_exports_refuse_a_backend_scale_other_than_one_over_root_head_dim(base, backend):
    """GPT-2 and LLaMA scale scores by 1/sqrt(head_dim) (here 1/2); a backend's ``scale``
    option changes the function and was exported as if unset."""
    export = to_gpt2 if base == "gpt2" else to_llama
    lm = _lm(base, attn_backend=backend, attn_backend_options={"scale": 1.0})
    plain = _lm(base, attn_backend=backend)
    plain.load_state_dict(lm.state_dict())
    ids = _ids(lm.config.vocab_size)
    assert not torch.allclose(lm(ids), plain(ids), atol=1e-6)
    with pytest.raises(ValueError, match=r"attn_backend_options scale=1.0 scales the scores "
                                         r"otherwise than .*; expected it unset or "
                                         r"1/sqrt\(head_dim\) = 0.5"):
        export(lm)
    # the scale they use, given explicitly, is the same function and exports
    same = _lm(base, attn_backend=backend, attn_backend_options={"scale": 0.5})
    same.load_state_dict(plain.state_dict())
    assert torch.allclose(same(ids), plain(ids), atol=1e-12, rtol=0)
    # (LLaMA as shipped: its RMSNorm and rotary angles in float32)
    assert torch.allclose(export(same)(ids).logits, plain(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("make", "option", "message"), [
    (lambda: _gpt2(scale_attn_by_inverse_layer_idx=True), from_gpt2,
     "scale_attn_by_inverse_layer_idx=True"),
    (lambda: _gpt2(activation_function="quick_gelu"), from_gpt2,
     "activation_function='quick_gelu' is not mapped; expected one of"),
    (lambda: _llama(head_dim=8), from_llama, "head_dim=8 is not mapped; expected .* = 4"),
    (lambda: _llama(hidden_act="gelu"), from_llama, "hidden_act='gelu' is not mapped"),
    (lambda: _llama(rope_scaling={"rope_type": "linear", "factor": 2.0}), from_llama,
     "type 'linear'"),
], ids=["inverse_layer_idx", "quick_gelu", "head_dim", "hidden_act", "rope_scaling"])
def test_unmapped_hugging_face_options_are_refused_by_name(make, option, message):
    with pytest.raises(ValueError, match=message):
        option(make())


def test_graft_grading_refuses_fields_that_change_the_architecture():
    lm = from_gpt2(_gpt2())
    with pytest.raises(ValueError, match=r"grading fields only; got \['d_model', 'n_layers'\]"):
        graft_grading(lm, "linear", d_model=32, n_layers=3)


@pytest.mark.parametrize("options", [{}, {"grades_per_head": True,
                                          "grade_attention_variant": "multi_head"},
                                     {"fold_grading": False}])
def test_grafted_llama_starts_from_the_pretrained_function(options, llama_in_float64):
    hf = _llama()
    graded = graft_grading(from_llama(hf), "exponential", learnable_grades=True, **options)
    ids = _ids(41)
    assert torch.allclose(graded(ids), hf(ids).logits, atol=1e-10, rtol=0)


def _bert(**kw):
    cfg = transformers.BertConfig(**{
        "vocab_size": 31, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 24, "max_position_embeddings": 20, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-7, **kw})
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).double().eval()
    with torch.no_grad():  # norms, biases and segment rows away from their initial values
        for name, p in model.named_parameters():
            p.normal_(1.0 if "LayerNorm.weight" in name else 0.0, 0.3)
    return model


def _right_padded(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = _ids(vocab, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return ids, mask


@pytest.mark.parametrize("activation", ["gelu", "relu", "gelu_new"])
def test_bert_hidden_states_equal_hugging_face_in_float64(activation):
    hf = _bert(hidden_act=activation)
    encoder = from_bert(hf)
    ids, mask = _right_padded(31)
    theirs = hf(ids, attention_mask=mask).last_hidden_state
    ours, _ = encoder(ids, mask == 0)
    keep = mask.bool()
    assert torch.allclose(ours[keep], theirs[keep], atol=1e-10, rtol=0)
    back = to_bert(encoder)
    again = back(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(again[keep], theirs[keep], atol=1e-10, rtol=0)


def test_left_padded_bert_equals_hugging_face_given_its_positions():
    """BERT counts positions from each row's first slot, padding included."""
    hf = _bert()
    encoder = from_bert(hf)
    ids = _ids(31, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    theirs = hf(ids, attention_mask=mask).last_hidden_state
    ours, _ = encoder(ids, mask == 0, positions=torch.arange(7).expand(2, 7))
    keep = mask.bool()
    assert torch.allclose(ours[keep], theirs[keep], atol=1e-10, rtol=0)


def test_the_encoder_of_a_local_bert_masked_lm_folder_loads(tmp_path):
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM(_bert().config).double().eval()
    mlm.save_pretrained(tmp_path / "mlm")
    encoder = from_bert(tmp_path / "mlm").double()
    ids = _ids(31)
    assert torch.allclose(encoder(ids)[0], mlm.bert(ids).last_hidden_state, atol=1e-10, rtol=0)


@pytest.mark.parametrize(("options", "message"), [
    ({"is_decoder": True}, "is_decoder=True is not mapped"),
    ({"position_embedding_type": "relative_key"},
     "position_embedding_type='relative_key' is not mapped; expected 'absolute'"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not mapped"),
])
def test_unmapped_bert_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        from_bert(_bert(**options))


@pytest.mark.parametrize(("field", "value"), [("norm_first", True), ("embed_norm", False),
                                              ("positional", "sinusoidal"), ("norm", "rms")])
def test_bert_export_refuses_what_bert_cannot_express(field, value):
    from graded.transformer.models import TransformerEncoder

    encoder = TransformerEncoder(from_bert(_bert()).config.replace(**{field: value}))
    with pytest.raises(ValueError, match=f"{field}={value!r} \\(expected "):
        to_bert(encoder)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_grafted_bert_encoder_starts_from_hugging_face(grading):
    from graded.transformer.models import TransformerEncoder

    hf = _bert()
    graded = graft_grading(from_bert(hf), grading, learnable_grades=True)
    assert type(graded) is TransformerEncoder and graded.config.grading == grading
    ids, mask = _right_padded(31)
    theirs = hf(ids, attention_mask=mask).last_hidden_state
    ours, _ = graded(ids, mask == 0)
    keep = mask.bool()
    assert torch.allclose(ours[keep], theirs[keep], atol=1e-10, rtol=0)
    with pytest.raises(TypeError, match=r"expected one of .*TransformerEncoder.*, got Linear"):
        graft_grading(torch.nn.Linear(2, 2), grading)
    with pytest.raises(ValueError, match=f"grading='{grading}': a graded model has no"):
        to_bert(graded)


@pytest.mark.parametrize("convert", ["gpt2", "llama"])
def test_an_output_layer_untied_after_loading_is_the_one_converted(convert, llama_in_float64):
    """``tie_word_embeddings`` stays True, but Hugging Face computes with the new layer."""
    hf = _gpt2() if convert == "gpt2" else _llama(tie_word_embeddings=True)
    torch.manual_seed(2)
    hf.lm_head.weight = torch.nn.Parameter(0.1 * torch.randn_like(hf.lm_head.weight))
    assert hf.config.tie_word_embeddings
    lm = from_gpt2(hf) if convert == "gpt2" else from_llama(hf)
    ids = _ids(hf.config.vocab_size)
    assert torch.allclose(lm(ids), hf(ids).logits, atol=1e-10, rtol=0)
    assert not lm.config.tie_embeddings


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_left_padded_batch_fills_max_len_with_its_real_tokens_as_hugging_face(use_cache,
                                                                                num_beams):
    """Positions skip left padding (Hugging Face counts them from ``attention_mask``), so a
    batch whose longest real prompt plus the new tokens fills ``n_positions`` exactly is
    generated, padding or not, and equals GPT-2's tokens; one more new token is refused."""
    hf = _gpt2()  # n_positions = 24
    lm = from_gpt2(hf)
    ids = _ids(37, (2, 28))
    mask = torch.ones_like(ids)
    mask[0, :8] = 0  # real prompts of 20 and 12 tokens, left-padded to 28
    mask[1, :16] = 0
    ids = ids.masked_fill(mask == 0, 0)
    assert ids.shape[1] + 4 > hf.config.n_positions
    assert int(mask.sum(1).max()) + 4 == hf.config.n_positions
    ours = lm.generate(ids, 4, key_padding_mask=mask == 0, num_beams=num_beams,
                       use_cache=use_cache, pad_token_id=0)
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                         num_beams=num_beams, pad_token_id=0)
    assert torch.equal(ours, theirs)
    with pytest.raises(ValueError, match=r"longest prompt \(real tokens, left padding excluded\)"
                       r" 20 \+ max_new_tokens 5 exceeds the model's max_len=24"):
        lm.generate(ids, 5, key_padding_mask=mask == 0)


@pytest.mark.parametrize("convert", ["gpt2", "llama"])
def test_left_padded_generation_with_stop_tokens_equals_hugging_face(convert, llama_in_float64):
    """Rows of different real lengths, left-padded, a stop token that ends some rows early:
    greedy and 3-beam tokens, with and without the cache, equal Hugging Face's ``generate``
    given the same ``attention_mask`` (GPT-2's learned positions, LLaMA's rotary ones)."""
    hf = _gpt2() if convert == "gpt2" else _llama()
    lm = from_gpt2(hf) if convert == "gpt2" else from_llama(hf)
    eos = 25 if convert == "gpt2" else 28  # a token that greedy decoding emits in some rows
    ids = _ids(hf.config.vocab_size, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :5] = 0
    ids = ids.masked_fill(mask == 0, 0)
    # pad id 1, not 0: Hugging Face's beam search fills with `pad_token_id or eos_token_id`,
    # the EOS id for a pad id of 0
    for num_beams in (1, 3):
        theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                             num_beams=num_beams, pad_token_id=1, eos_token_id=eos)
        for use_cache in (True, False):
            ours = lm.generate(ids, 8, key_padding_mask=mask == 0, num_beams=num_beams,
                               use_cache=use_cache, pad_token_id=1, eos_token_id=eos)
            assert torch.equal(ours, theirs), (num_beams, use_cache)
        if num_beams == 1:  # a row stopped early and was padded, another ran to the end
            stopped = (ours[:, 7:] == eos).any(dim=1)
            assert stopped.any() and not stopped.all()


@pytest.mark.parametrize("convert", ["gpt2", "llama"])
@pytest.mark.parametrize("options", [{"temperature": 0.8}, {"top_k": 5}, {"top_p": 0.7},
                                     {"temperature": 1.3, "top_k": 8, "top_p": 0.9}])
def test_sampled_tokens_equal_hugging_faces_under_the_same_seed(convert, options,
                                                                 llama_in_float64):
    """Both draw with ``torch.multinomial`` from the global generator: after the same seed,
    the same temperature / top-k / top-p give the same tokens, left padding included."""
    hf = _gpt2() if convert == "gpt2" else _llama()
    lm = from_gpt2(hf) if convert == "gpt2" else from_llama(hf)
    ids = _ids(hf.config.vocab_size, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids = ids.masked_fill(mask == 0, 0)
    torch.manual_seed(11)
    ours = lm.generate(ids, 8, key_padding_mask=mask == 0, do_sample=True, pad_token_id=0,
                       **options)
    torch.manual_seed(11)
    theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=True,
                         pad_token_id=0, **{"top_k": 0, **options})  # HF's default top_k is 50
    assert len(set(ours[:, 7:].flatten().tolist())) > 3
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("convert", ["bert", "llama"])
def test_the_pad_tokens_embedding_gets_no_gradient_as_in_hugging_face(convert, llama_in_float64):
    """BERT's and LLaMA's embeddings hold ``padding_idx = pad_token_id``: a pad token in the
    input gives its row no gradient. One backward pass over inputs holding the pad token gives
    our embedding the gradient of Hugging Face's (its pad row zero), where the converted model
    used to give the pad row a gradient; the export gives the pad id back."""
    pad = 3
    hf = _bert(pad_token_id=pad) if convert == "bert" else _llama(pad_token_id=pad)
    ours = from_bert(hf) if convert == "bert" else from_llama(hf)
    tokens = ours.embed.tokens if convert == "bert" else ours.decoder.embed.tokens
    theirs = hf.embeddings.word_embeddings if convert == "bert" else hf.model.embed_tokens
    ids = _ids(hf.config.vocab_size, (2, 9))
    ids[:, ::3] = pad
    hf.train()
    ours.train()
    out = hf(ids).last_hidden_state if convert == "bert" else hf(ids).logits
    out.pow(2).mean().backward()
    (ours(ids)[0] if convert == "bert" else ours(ids)).pow(2).mean().backward()
    assert theirs.weight.grad[pad].abs().max() == 0
    torch.testing.assert_close(tokens.weight.grad, theirs.weight.grad, atol=1e-10, rtol=0)
    back = to_bert(ours) if convert == "bert" else to_llama(ours)
    assert back.config.pad_token_id == pad


def test_a_hub_name_is_refused_saying_that_nothing_is_downloaded(tmp_path, monkeypatch):
    """``from_gpt2("gpt2")`` reads a local folder only; the error says how to load the hub
    model instead (it used to say only that "gpt2" is not a local folder)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"gpt2 is not a local checkpoint folder of a "
                       r"GPT2LMHeadModel; nothing is downloaded: pass a model object \(e\.g\. "
                       r"transformers\.GPT2LMHeadModel\.from_pretrained\('gpt2'\)\)"):
        from_gpt2("gpt2")
