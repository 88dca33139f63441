"""Feed-forward networks and normalisation layers (002 §3.5-3.6, 003 §2.5).

- :class:`FeedForward`: position-wise FFN ``W_2 σ(W_1 x + b_1) + b_2`` with σ = ReLU, GELU
  (exact, or its tanh approximation ``gelu_tanh`` as in GPT-2) or SiLU (LLaMA's activation,
  ungated), or the gated SwiGLU form ``W_2 (SiLU(W_1 x) ⊙ W_3 x)`` (Shazeer 2020).
- :func:`make_norm`: LayerNorm or RMSNorm (Zhang & Sennrich 2019), both from ``torch.nn``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from graded.folding import graded_linear

__all__ = ["ACTIVATIONS", "NORMS", "FeedForward", "make_norm"]

# FeedForward's activation: an elementwise σ, or the gated "swiglu".
_ELEMENTWISE = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}
ACTIVATIONS = (*_ELEMENTWISE, "swiglu")
NORMS = ("layer", "rms")  # make_norm's kind


class FeedForward(nn.Module):
    """Position-wise feed-forward network; dropout after the activation (002 §6.3)."""

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "gelu", dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {ACTIVATIONS}")
        self.activation = activation
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)
        self.fc_gate = nn.Linear(d_model, d_ff, bias=bias) if activation == "swiglu" else None
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, out_scales: Tensor | None = None, *,
                folded: Callable[[], tuple[Tensor, Tensor | None]] | None = None) -> Tensor:
        """Fnn(x); with ``out_scales`` m, m·Fnn(x), m folded into the output layer
        (:func:`graded.folding.graded_linear`); with ``folded``, the output layer's weight and
        bias with m folded in already (computed with other layers')."""
        h = self.fc_in(x)
        if self.fc_gate is None:
            h = _ELEMENTWISE[self.activation](h)
        else:
            h = F.silu(h) * self.fc_gate(x)
        if folded is not None:
            return F.linear(self.dropout(h), *folded())
        return graded_linear(self.dropout(h), self.fc_out.weight, self.fc_out.bias,
                             out_scales=out_scales)


def make_norm(kind: str, d_model: int, eps: float = 1e-5) -> nn.Module:
    """``"layer"`` -> :class:`torch.nn.LayerNorm`, ``"rms"`` -> :class:`torch.nn.RMSNorm`."""
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rms":
        return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; expected one of {NORMS}")
