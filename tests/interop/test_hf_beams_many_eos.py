"""Beam search with several EOS ids against GPT-2's ``generate`` (random tiny model, float64,
no download): each step reads as many candidates as Hugging Face's ``beams_to_keep``,
``max(2, 1 + n_eos) * num_beams``, so that the running beams are filled after every EOS
candidate among the best."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from graded.interop import from_gpt2  # noqa: E402


def _gpt2(seed: int):
    cfg = transformers.GPT2Config(vocab_size=13, n_positions=40, n_embd=16, n_layer=2,
                                  n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(cfg).double().eval()
    with torch.no_grad():  # sharper scores: a few tokens take most of the probability
        hf.lm_head.weight.mul_(4.0)
    return hf


@pytest.mark.parametrize(("seed", "num_beams"), [(1, 2), (4, 3)])
def test_beam_search_with_four_eos_ids_equals_hugging_face(seed, num_beams):
    """The four most likely tokens all end rows; a row ends when no running beam can still
    enter its best hypotheses (``early_stopping="never"``). Reading 2 * num_beams candidates,
    a step whose best ones were nearly all EOS kept too few running beams (none: the row ended):
    seed 4, 3 beams gave [[11], [4]] where GPT-2 gives [[11, 12, 12, 12, 12, 12],
    [10, 10, 10, 10, 10, 10]]."""
    hf = _gpt2(seed)
    lm = from_gpt2(hf)
    ids = torch.randint(0, 13, (2, 3), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        probs = hf(ids).logits[:, -1].softmax(-1).mean(0)
    eos = probs.argsort(descending=True)[:4].tolist()
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                         num_beams=num_beams, do_sample=False, eos_token_id=eos,
                         pad_token_id=12, early_stopping="never")
    for use_cache in (True, False):
        ours = lm.generate(ids, 6, num_beams=num_beams, eos_token_id=eos, pad_token_id=12,
                           early_stopping="never", use_cache=use_cache)
        assert torch.equal(ours, theirs), use_cache
