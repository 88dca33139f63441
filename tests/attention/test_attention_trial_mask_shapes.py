"""An ``attn_mask`` must broadcast *to* (B, H, Tq, Tk): one that only broadcasts *with* it (more
dimensions, or a batch of masks for a batch of one) is refused naming its shape. Before, the
explicit backend returned an output of the widened shape (B', H, Tq, Dv) silently, and the full
and chunked backends failed inside torch with messages that named neither."""

from __future__ import annotations

import pytest
import torch

from graded.attention.backends import get_backend

EXACT = ["full", "explicit", "chunked"]


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("shape", [(1, 1, 1, 3, 3), (2, 1, 3, 3), (1, 3, 3, 3)])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_a_mask_that_would_widen_the_output_is_refused_naming_its_shape(name, shape, dtype):
    q = torch.randn(1, 2, 3, 4)
    mask = torch.ones(shape, dtype=dtype)
    with pytest.raises(ValueError, match=rf"{name} backend: attn_mask of shape "
                                          rf"\({', '.join(map(str, shape))}\) does not broadcast"
                                          r" to \(B, H, Tq, Tk\) = \(1, 2, 3, 3\)"):
        get_backend(name)(q, q, q, attn_mask=mask)


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("shape", [(3, 3), (1, 3), (3, 1), (2, 1, 3), (1, 2, 3, 3)])
def test_a_mask_that_broadcasts_to_the_scores_equals_sdpa_with_it(name, shape):
    """Every broadcastable keep-mask is served: against torch's SDPA with the same mask (each
    query row keeps its first key, so no row is empty)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    keep = torch.rand(shape, generator=gen) < 0.6
    keep = keep | (torch.arange(shape[-1]) == 0)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    out = get_backend(name)(q, k, v, attn_mask=keep)
    torch.testing.assert_close(out, expected)
