"""The arithmetic of softmax attention every exact backend shares: the dtype it computes in,
the temperature and the row softmax over a keep-mask (002 Eq. 2.15, 2.29).

A query with no admissible key returns a zero vector (:func:`softmax_rows` makes its row of
weights zeros), the convention of every backend.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["compute_dtype", "default_scale", "softmax_rows"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the exact backends compute scores, softmax and weighted sum in: float32 for
    half-precision inputs (float16, bfloat16), the inputs' own dtype otherwise. Torch's math
    SDPA (``_scaled_dot_product_attention_math``) does the same, upcasting half-precision
    q, k and v to float32 and rounding the output once; its fused kernels accumulate in float32
    too. Scores, an exponential and a sum formed in bfloat16 have about twice their error."""
    return torch.promote_types(dtype, torch.float32)


def default_scale(scale: float | None, head_dim: int) -> float:
    """The softmax temperature: ``scale`` when given, else 1/√D (002 Eq. 2.15)."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def softmax_rows(scores: Tensor, keep: Tensor | None) -> Tensor:
    """Row softmax over the last axis with a keep-mask; rows with no kept entry become zeros.

    Subtracts the row maximum (002 Eq. 2.29)."""
    if scores.shape[-1] == 0:  # no key at all: empty rows (the maximum has nothing to reduce)
        return scores
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - row_max)
    denom = p.sum(dim=-1, keepdim=True)
    return p / torch.where(denom > 0, denom, torch.ones_like(denom))
