"""Gradewise normalisation Norm = ⊕_g Norm_g (004 §2.5): one LayerNorm or RMSNorm per grade.

004 Lemma 2.12 claims gradewise LayerNorm preserves block-orthogonality; that is doubtful (LN is
not affine and β_g ≠ 0 moves the mean), and LN breaks conjugation invariance (notes B6, B12).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from graded.morphic.state import GradedStateSpace


class GradewiseNorm(nn.Module):
    """Applies ``kind`` ∈ {"layer", "rms"} to each grade's slice separately."""

    def __init__(self, space: GradedStateSpace, kind: str = "layer", eps: float = 1e-5) -> None:
        super().__init__()
        if kind not in ("layer", "rms"):
            raise ValueError(f"kind must be 'layer' or 'rms', got {kind!r}")
        self.space = space
        self.kind = kind
        cls = nn.LayerNorm if kind == "layer" else nn.RMSNorm
        self.norms = nn.ModuleDict({g.label: cls(g.dim, eps=eps) for g in space.grades})

    def grade(self, x: Tensor, label: str) -> Tensor:
        """Norm_g applied to one component x ∈ V_g."""
        return self.norms[label](x)

    def forward(self, z: Tensor) -> Tensor:
        parts = self.space.split(z)
        return torch.cat([self.norms[g](x) for g, x in parts.items()], dim=-1)
