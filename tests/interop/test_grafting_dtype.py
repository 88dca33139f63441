"""A grading grafted onto a converted model in that model's dtype: its initial grades are made
in float64 for a float64 model, so the graded model starts from the pretrained function to
float64 rounding (Hugging Face models built from configs, random weights, no download)."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from graded.grading import GradingMap  # noqa: E402
from graded.interop import from_bert, from_gpt2, graft_grading  # noqa: E402

torch.set_default_dtype(torch.float32)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=37, n_positions=24, n_embd=18, n_layer=2, n_head=3,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).double().eval()


def _bert():
    cfg = transformers.BertConfig(vocab_size=31, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=1, intermediate_size=24,
                                  max_position_embeddings=20, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertModel(cfg, add_pooling_layer=False).double().eval()


def _grades(model: torch.nn.Module) -> list[torch.Tensor]:
    return [m.grades for m in model.modules() if isinstance(m, GradingMap)]


@pytest.mark.parametrize("learnable", [False, True], ids=["fixed", "learnable"])
def test_grafted_softplus_grading_starts_from_gpt2_to_float64_rounding(learnable):
    """softplus(q) = 1 at q = log(e − 1). The graded model used to be built in float32 and
    cast: q rounded to float32 gave scales 1 − 4.5e-10 and logits 2e-10 away from GPT-2's."""
    hf = _gpt2()
    graded = graft_grading(from_gpt2(hf), "linear", grading_f="softplus",
                           learnable_grades=learnable)
    grades = _grades(graded)
    assert grades and all(q.dtype == torch.float64 for q in grades)
    for q in grades:
        assert torch.all(q == math.log(math.expm1(1.0)))
        torch.testing.assert_close(torch.nn.functional.softplus(q), torch.ones_like(q),
                                   atol=4e-16, rtol=0)  # two float64 ulps of 1
    ids = torch.randint(0, 37, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    keep = mask.bool()
    theirs = hf(ids, attention_mask=mask).logits
    # GPT-2 and the converted model agree to 1e-15 here; the grades add nothing above it
    torch.testing.assert_close(graded(ids, mask == 0)[keep], theirs[keep], atol=1e-13, rtol=0)


def test_a_constant_grade_init_is_the_value_in_float64():
    """``grade_init_value=0.1`` on a float64 BERT encoder is 0.1 in float64, not its float32
    rounding 0.10000000149."""
    graded = graft_grading(from_bert(_bert()), "exponential", grade_init="constant",
                           grade_init_value=0.1)
    grades = _grades(graded)
    assert grades and all(q.dtype == torch.float64 and torch.all(q == 0.1) for q in grades)
    assert torch.get_default_dtype() == torch.float32  # the default is given back
