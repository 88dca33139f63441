"""Linformer on half-precision inputs: computed in float32 with its float32 projections E and F,
the output rounded once, so its error is the rounding of the output and no more."""

import pytest
import torch

from graded.attention.backends import get_backend


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linformer_half_precision_error_is_the_rounding_of_its_output(dtype):
    torch.manual_seed(0)
    backend = get_backend("linformer", max_len=64, rank=16)  # float32 E and F
    q, k, v = (torch.randn(2, 2, 64, 32).to(dtype) for _ in range(3))
    pad = torch.zeros(2, 64, dtype=torch.bool)
    pad[1, 50:] = True
    out = backend(q, k, v, key_padding_mask=pad)
    assert out.dtype == dtype
    # the same attention in float64 on the same rounded inputs and the same E and F
    exact = backend.double()(q.double(), k.double(), v.double(), key_padding_mask=pad)
    rounding = (exact.to(dtype).double() - exact).pow(2).mean().sqrt()
    error = (out.double() - exact).pow(2).mean().sqrt()
    # in the inputs' own precision (E and F rounded, projections and scores rounded) the
    # error was 2.5x the output's rounding, in bfloat16 and in float16
    assert error <= 1.1 * rounding
