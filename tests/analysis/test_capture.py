"""Capturing attention calls leaves the model as it was, also when nested."""

from __future__ import annotations

import torch

from graded.analysis import capture_attention
from graded.attention.multihead import MultiheadAttention
from graded.folding import activation_grading


def test_capture_restores_attend_and_nests(egt_lm, tokens):
    with capture_attention(egt_lm) as outer:
        with capture_attention(egt_lm, need_weights=False) as inner:
            egt_lm(tokens)
        egt_lm(tokens)
    assert len(inner) == 2 and len(outer) == 4
    assert all(c.weights is not None for c in outer)
    for m in egt_lm.modules():
        if isinstance(m, MultiheadAttention):
            assert "attend" not in m.__dict__


def test_captured_inputs_are_the_ungraded_projections(egt_lm, tokens):
    egt_lm.eval()
    with capture_attention(egt_lm) as calls:
        egt_lm(tokens)
    attn = egt_lm.decoder.stack.blocks[0].self_attn.attn
    x = egt_lm.decoder.embed(tokens, torch.arange(7).expand(3, 7))
    with activation_grading(attn):
        q, k, _ = attn.project(*(egt_lm.decoder.stack.blocks[0].res_attn.pre(x),) * 3)
    assert torch.allclose(calls[0].q, q, atol=1e-6) and torch.allclose(calls[0].k, k, atol=1e-6)
    assert calls[0].is_causal and calls[0].attn_mask is None


def test_capture_without_weights_keeps_the_fused_path(egt_lm, tokens):
    with capture_attention(egt_lm, need_weights=False) as calls:
        egt_lm(tokens)
    assert len(calls) == 2 and all(c.weights is None for c in calls)
    assert calls[0].heads.shape == (3, 2, 7, 8)
