"""Half-precision inputs of the kernel backends (performer, linear): computed in float32 and
rounded once, so the output is the float32 computation's on the same (rounded) inputs up to one
rounding. In float16 the performer's features e^{ωᵀk − c} of keys far below the largest
underflowed, and a causal query's first keys vanished (maximum error 1.6 on outputs of size ~1
at T=64, D=32); linear attention's normaliser overflowed past D·T ≈ 5·10⁴."""

from __future__ import annotations

import pytest
import torch

from graded.attention.backends import get_backend

DTYPES = [torch.float16, torch.bfloat16]


def _inputs(dtype: torch.dtype, t: int = 64, d: int = 32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 2, t, d, generator=gen).to(dtype) for _ in range(3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_half_performer_equals_the_float32_estimator_on_the_same_inputs(dtype, causal):
    backend = get_backend("performer", num_features=32, seed=0).eval()
    q, k, v = _inputs(dtype)
    pad = torch.zeros(2, 64, dtype=torch.bool)
    pad[1, 40:] = True
    expected = backend(q.float(), k.float(), v.float(), key_padding_mask=pad, is_causal=causal)
    out = backend(q, k, v, key_padding_mask=pad, is_causal=causal)
    assert out.dtype == dtype
    # one rounding of values of size < 4: half an ulp of 4 in the dtype
    tol = 4 * torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), expected, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_half_performer_decoding_equals_the_float32_causal_pass(dtype):
    backend = get_backend("performer", num_features=32, seed=0).eval()
    q, k, v = _inputs(dtype, t=24)
    expected = backend(q.float(), k.float(), v.float(), is_causal=True)
    out, state = backend.decode(q[:, :, :8], k[:, :, :8], v[:, :, :8], None)
    steps = [out]
    for t in range(8, 24):
        out, state = backend.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], state)
        steps.append(out)
    decoded = torch.cat(steps, dim=2)
    assert decoded.dtype == dtype
    torch.testing.assert_close(decoded.float(), expected, rtol=0,
                               atol=4 * torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_half_linear_attention_equals_float32_at_a_length_past_float16_range(dtype, causal):
    """At D·T = 65536 the normaliser φ(q)ᵀΣφ(k) (about 1.2·D·T) passes float16's 65504: the
    output was all but zero (error 0.077 on outputs of at most 0.077)."""
    backend = get_backend("linear")
    q, k, v = _inputs(dtype, t=1024, d=64)
    q, k, v = q[:1, :1], k[:1, :1], v[:1, :1]
    expected = backend(q.float(), k.float(), v.float(), is_causal=causal)
    out = backend(q, k, v, is_causal=causal)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, rtol=torch.finfo(dtype).eps,
                               atol=torch.finfo(dtype).eps * expected.abs().max().item())
    if causal:  # decoding after a prompt keeps the same sums, in float32
        _, state = backend.decode(q[..., :1020, :], k[..., :1020, :], v[..., :1020, :], None)
        for t in range(1020, 1024):
            step, state = backend.decode(q[..., t:t + 1, :], k[..., t:t + 1, :],
                                         v[..., t:t + 1, :], state)
            torch.testing.assert_close(step.float(), expected[..., t:t + 1, :],
                                       rtol=torch.finfo(dtype).eps,
                                       atol=4 * torch.finfo(dtype).eps)
