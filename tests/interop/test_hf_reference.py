"""Whole-model reference tests: our LMs against Hugging Face GPT-2 and LLaMA in float64.

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

from graded.interop import from_gpt2, from_llama, graft_grading, to_gpt2, to_llama  # noqa: E402

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
