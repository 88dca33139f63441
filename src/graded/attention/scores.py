"""Pluggable attention scoring functions (002 §2.4).

A score maps per-head queries (B, H, Tq, D) and keys (B, H, Tk, D) to logits (B, H, Tq, Tk).
Scores that are a dot product after a linear change of the keys can also say how to run the
fused kernel (:meth:`Score.fused_inputs`), so they cost what plain attention costs; the additive
score cannot and always takes the explicit path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from graded.checks import check_bool, check_int

__all__ = [
    "AdditiveScore",
    "BilinearScore",
    "DotScore",
    "ScaledDotScore",
    "Score",
    "make_score",
]


class Score(nn.Module):
    """Base class: ``forward(q, k)`` returns logits; ``fused_inputs`` rewrites for SDPA."""

    def fused_inputs(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float | None] | None:
        """Return ``(q', k', scale)`` with ``scale · q' k'ᵀ`` equal to this score, or None."""
        return None

    def forward(self, q: Tensor, k: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class ScaledDotScore(Score):
    """``q·k / √d`` (002 Eq. 2.5, Vaswani et al.), the default."""

    def fused_inputs(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float | None]:
        return q, k, None

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])


class DotScore(Score):
    """``q·k`` without scaling (Luong "dot", 002 §2.4)."""

    def fused_inputs(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float | None]:
        return q, k, 1.0

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return torch.matmul(q, k.transpose(-2, -1))


class BilinearScore(Score):
    """``qᵀ W_h k`` with one learned (D, D) matrix per head (Luong "general", 002 §2.4).

    Initialised to the identity, so it starts as the dot score. ``scaled=True`` divides by √D
    (True or False only: read truthily, ``scaled="false"`` would scale).
    Runs on the fused kernel as ``q · (k W_hᵀ)``.
    """

    def __init__(self, num_heads: int, head_dim: int, scaled: bool = False) -> None:
        super().__init__()
        self.scaled = check_bool("BilinearScore: scaled", scaled)
        self.weight = nn.Parameter(torch.eye(head_dim).repeat(num_heads, 1, 1))

    def _keys(self, k: Tensor) -> Tensor:
        # k: (B, H, Tk, D); weight: (H, D, D) -> k W_hᵀ per head
        return torch.matmul(k, self.weight.transpose(-2, -1))

    def _scale(self, d: int) -> float:
        return 1.0 / math.sqrt(d) if self.scaled else 1.0

    def fused_inputs(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float | None]:
        return q, self._keys(k), self._scale(q.shape[-1])

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return torch.matmul(q, self._keys(k).transpose(-2, -1)) * self._scale(q.shape[-1])


class AdditiveScore(Score):
    """``vᵀ tanh(W_q q + W_k k)`` (Bahdanau et al. 2015, 002 §2.4.1 Eq. 2.12), shared across
    heads: no bias, d_a(d_q + d_k + 1) parameters, as the formula has.

    Materialises a (B, H, Tq, Tk, hidden) tensor: O(Tq·Tk·hidden) memory, explicit path only.
    """

    def __init__(self, head_dim: int, hidden_dim: int | None = None) -> None:
        super().__init__()
        check_int("AdditiveScore: head_dim", head_dim, minimum=1)
        hidden_dim = (head_dim if hidden_dim is None
                      else check_int("AdditiveScore: hidden_dim", hidden_dim, minimum=1))
        self.query = nn.Linear(head_dim, hidden_dim, bias=False)
        self.key = nn.Linear(head_dim, hidden_dim, bias=False)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        hidden = torch.tanh(self.query(q).unsqueeze(-2) + self.key(k).unsqueeze(-3))
        return self.v(hidden).squeeze(-1)


SCORES = ("scaled_dot", "dot", "bilinear", "additive")


def make_score(name: str | Score, num_heads: int, head_dim: int) -> Score:
    """Build a score by name: one of ``scaled_dot``, ``dot``, ``bilinear``, ``additive``."""
    if isinstance(name, Score):
        return name
    if name == "scaled_dot":
        return ScaledDotScore()
    if name == "dot":
        return DotScore()
    if name == "bilinear":
        return BilinearScore(num_heads, head_dim)
    if name == "additive":
        return AdditiveScore(head_dim)
    # a new score adds its branch above this line
    if name in SCORES:  # listed, but no branch above builds it
        raise NotImplementedError(
            f"attention score {name!r} is listed in graded.attention.scores.SCORES but "
            "make_score has no construction for it; add its branch to make_score in "
            "graded/attention/scores.py")
    raise ValueError(f"unknown attention score {name!r}; expected one of {SCORES} or a Score")
