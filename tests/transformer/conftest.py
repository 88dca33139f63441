"""Shared set-ups of the transformer tests."""

import pytest
import torch


@pytest.fixture
def gpt2_pair():
    """A small GPT-2 whose weights are redrawn (embeddings at unit scale, fan-in scaled
    matrices) so that greedy rows do not all repeat one token, and our model converted from
    it."""
    transformers = pytest.importorskip("transformers")
    from graded.interop import from_gpt2

    cfg = transformers.GPT2Config(vocab_size=13, n_positions=24, n_embd=16, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=None, eos_token_id=None)
    torch.manual_seed(4)
    hf = transformers.GPT2LMHeadModel(cfg).double().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 2:
                p.normal_(std=1.0 if name.endswith(("wte.weight", "wpe.weight"))
                          else p.shape[0] ** -0.5)
    return hf, from_gpt2(hf)
