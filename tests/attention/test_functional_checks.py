"""Attention primitives: the checks no other test reaches, merging with one mask absent, and
dropout on the explicit-weights path against F.dropout of the weights under the same seed."""

import pytest
import torch
import torch.nn.functional as F

from graded.attention.functional import attention, causal_mask, merge_masks


def test_causal_mask_refuses_negative_lengths():
    with pytest.raises(ValueError, match=r"non-negative lengths, got t_q=-1, t_k=3"):
        causal_mask(-1, 3)


def test_merging_with_no_second_mask_returns_the_first():
    a = torch.tensor([[True, False]])
    assert merge_masks(a, None, torch.float32) is a


def test_attention_needs_four_dimensional_inputs():
    q = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"\(batch, heads, length, head_dim\); got \(2, 3, 4\), "
                                         r"\(1, 1, 3, 4\), \(1, 1, 3, 4\)"):
        attention(q, torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4))


def test_dropout_on_the_explicit_path_drops_the_returned_weights():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g) for _ in range(3))
    scores = q @ k.transpose(-1, -2) / 2.0  # scale 1/√4
    w0 = torch.softmax(scores, -1)
    torch.manual_seed(123)
    expected = F.dropout(w0, p=0.5)
    torch.manual_seed(123)
    out, w = attention(q, k, v, dropout_p=0.5, need_weights=True)
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(out, expected @ v)
    assert bool((w == 0).any())  # some weights were dropped, the rest scaled by 2
