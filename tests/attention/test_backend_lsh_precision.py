"""LSH attention hashes half-precision inputs in float32: bfloat16 and float16 positions fall in
the buckets of their float32 values, and float32 and float64 hashing is the plain projection."""

import pytest
import torch

from graded.attention.backends import get_backend
from graded.attention.backends.lsh import hash_buckets


def _inputs(dtype, *shape):
    torch.manual_seed(0)
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_get_the_buckets_of_their_float32_upcast(dtype):
    x = _inputs(dtype, 2, 4, 256, 64)
    rotations = torch.randn(3, 64, 8)
    upcast = hash_buckets(x.float(), rotations)
    # in bfloat16's own precision 0.3 % of these positions changed bucket
    assert torch.equal(hash_buckets(x, rotations), upcast)


def test_float16_inputs_whose_projections_pass_its_range_hash_as_float32():
    x = _inputs(torch.float16, 1, 2, 128, 64) * 8000  # within float16, |xR| up to ~2·10⁵
    rotations = torch.randn(2, 64, 4)
    assert (torch.einsum("bhtd,rdk->bhrtk", x.float(), rotations).abs() > 65504).any()
    # in float16 these projections were ±inf, and argmax took the first of the tied ones
    assert torch.equal(hash_buckets(x, rotations), hash_buckets(x.float(), rotations))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_precision_hashing_is_the_argmax_of_the_projection_in_that_precision(dtype):
    x = _inputs(dtype, 2, 3, 50, 16)
    rotations = torch.randn(2, 16, 4)
    proj = torch.einsum("bhtd,rdk->bhrtk", x, rotations.to(dtype))
    expected = torch.cat([proj, -proj], dim=-1).argmax(dim=-1)
    assert torch.equal(hash_buckets(x, rotations), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_half_precision_attention_is_its_float32_upcast_rounded_once(dtype, causal):
    q, k, v = _inputs(torch.float32, 2, 4, 256, 64), torch.randn(2, 4, 256, 64), \
        torch.randn(2, 4, 256, 16)
    padding = torch.zeros(2, 256, dtype=torch.bool)
    padding[1, 200:] = True
    backend = get_backend("lsh", n_buckets=8, chunk_size=32, seed=3)
    low = backend(*(t.to(dtype) for t in (q, k, v)), key_padding_mask=padding,
                  is_causal=causal)
    high = backend(*(t.to(dtype).float() for t in (q, k, v)), key_padding_mask=padding,
                   is_causal=causal)
    assert low.dtype == dtype
    # the same buckets, scores and softmax, rounded once at the end (computed in bfloat16, a
    # position that changed bucket attended elsewhere, and outputs differed by up to 1.1)
    assert torch.equal(low, high.to(dtype))

