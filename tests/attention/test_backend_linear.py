"""The `linear` backend (elu+1 kernel attention) against its quadratic forms."""

import math

import pytest
import torch
import torch.nn.functional as F

from graded.attention.backends import get_backend


def quadratic_kernel_attention(q, k, v, keep):
    """Katharopoulos et al. 2020 Eq. 2 with sim = φ(q)ᵀφ(k), φ = elu + 1, as a masked
    (Tq, Tk) matrix: rows normalised by their sums."""
    sim = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)
    sim = sim * keep
    return (sim @ v) / sim.sum(-1, keepdim=True)


def inputs(t_q, t_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, t_q, 6, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, t_k, 6, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, t_k, 4, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_linear_causal_prefix_sum_equals_masked_quadratic_form(chunk):
    q, k, v = inputs(30, 30)
    q = q * torch.linspace(0.2, 2.0, 6, dtype=torch.float64)  # graded: before the feature map
    pad = torch.zeros(2, 30, dtype=torch.bool)
    pad[0, :3] = True
    pad[1, 20:] = True
    keep = torch.ones(30, 30, dtype=torch.bool).tril() & ~pad[:, None, None, :]
    backend = get_backend("linear", chunk_size=chunk, eps=1e-12)
    out = backend(q, k, v, key_padding_mask=pad, is_causal=True)
    ref = quadratic_kernel_attention(q, k, v, keep)
    torch.testing.assert_close(out[0, :, 3:], ref[0, :, 3:])  # rows 0-2 of batch 0 see no key
    torch.testing.assert_close(out[1], ref[1])


def test_linear_non_causal_equals_quadratic_form_for_cross_attention():
    q, k, v = inputs(9, 21)
    pad = torch.zeros(2, 21, dtype=torch.bool)
    pad[1, 15:] = True
    out = get_backend("linear", eps=1e-12)(q, k, v, key_padding_mask=pad)
    ref = quadratic_kernel_attention(q, k, v, ~pad[:, None, None, :])
    torch.testing.assert_close(out, ref)


def test_linear_causal_gradients_equal_quadratic_form_gradients():
    q, k, v = (x.requires_grad_() for x in inputs(17, 17))
    out = get_backend("linear", chunk_size=5, eps=1e-12)(q, k, v, is_causal=True)
    ref = quadratic_kernel_attention(q, k, v, torch.ones(17, 17, dtype=torch.bool).tril())
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad),
                    torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(a, b)


def test_linear_refuses_attention_dropout_unless_told_to_ignore_it():
    q, k, v = inputs(5, 5)
    with pytest.raises(ValueError, match=r"dropout_p=0.1"):
        get_backend("linear")(q, k, v, dropout_p=0.1)
    out = get_backend("linear", ignore_dropout=True)(q, k, v, dropout_p=0.1)
    torch.testing.assert_close(out, get_backend("linear")(q, k, v))


def test_linear_options_are_checked_with_the_bad_value_named():
    """eps = NaN made every output NaN and eps = inf every output 0; eps = True was the guard
    1 and chunk_size = True a chunk of 1; a string eps failed inside a comparison."""
    for eps in (math.nan, math.inf, 0.0, -1e-6):
        with pytest.raises(ValueError, match=rf"linear backend: eps must be .*got {eps}"):
            get_backend("linear", eps=eps)
    for eps in ("1e-6", True):
        with pytest.raises(TypeError, match=r"linear backend: eps must be a number"):
            get_backend("linear", eps=eps)
    with pytest.raises(ValueError, match=r"chunk_size must be a positive int, got True"):
        get_backend("linear", chunk_size=True)
