"""Banded weight-shared and conjugated block operators (004 Defs 2.7, 2.8; Prop 2.9).

004 names these "LGT" and "EGT"; in this library those names belong to the feature-graded models
of 000, so they are ``BandedBlocks`` and ``ConjugatedBlocks`` here.

- ``BandedBlocks``: 𝓔 banded (h = g + δ, δ ∈ Δ) and Φ_{(g+δ)←g} = K_δ independent of g (weight
  sharing along the grade axis, a convolution over grades). Needs equal d_g.
- ``ConjugatedBlocks``: Φ_{(g+δ)←g} = D_{g+δ} K̂_δ D_g^{-1} with positive diagonal D_g. With
  scalar D_g = λ^{index(g)} this is K̂_δ scaled by λ^δ, i.e. again banded (004's "EGT" coincides
  with its "LGT" as a model class, notes B12); it differs only for non-scalar D_g. The D_g are
  buffers held in float64 whatever the blocks are cast to (``graded._precision``), and each use
  casts them to the dtype of the state: a float64 model computes λ^δ K̂ x to float64 precision
  (float32 diagonals put D = 1.1³ off by 5·10⁻⁸), and a cast to bfloat16 and back leaves them
  exact (a bfloat16 buffer would keep 1.1³ = 1.331 at 1.328125 for good).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from graded._precision import held_precision, widen_loaded
from graded.checks import check_float
from graded.morphic.blocks import FFNBlock, LinearBlock
from graded.morphic.edges import EdgeSet
from graded.morphic.state import GradedStateSpace

SCALE_DTYPE = torch.float64  # what the conjugating diagonals D_g are held in (module doc)


def _held(module: nn.Module) -> dict[str, Callable[[torch.dtype], torch.dtype]]:
    """``graded._precision`` rules keeping the diagonals D_g of ``module`` (its buffers named
    ``scale_…``) in ``SCALE_DTYPE``."""
    return {name: (lambda dtype: SCALE_DTYPE) for name in module._buffers
            if name.startswith("scale_")}


class _HeldScales:
    """A module whose diagonals D_g (buffers ``scale_…``) stay in ``SCALE_DTYPE`` through
    casts (``.to``, ``.bfloat16()``) and state-dict loads (module doc)."""

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> nn.Module:
        with held_precision(self, _held(self)):
            super()._apply(fn, recurse)
        return self

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        widen_loaded(state_dict, prefix, _held(self))  # float32 D_g of an older state dict
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _equal_dim(space: GradedStateSpace) -> int:
    dims = {g.dim for g in space.grades}
    if len(dims) != 1:
        raise ValueError(
            f"banded blocks need equal grade dims, got {[g.dim for g in space.grades]}")
    return dims.pop()


def _kernel(d: int, kind: str, hidden: int | None) -> nn.Module:
    if kind == "linear":
        return LinearBlock(d, d)
    if kind == "ffn":
        if hidden is None:
            raise ValueError("kind='ffn' needs hidden=<width>")
        return FFNBlock(d, d, hidden)
    raise ValueError(f"kind must be 'linear' or 'ffn', got {kind!r}")


class _SharedKernel(_HeldScales, nn.Module):
    """The block of one edge: D_h K_δ(D_g^{-1} x), with K_δ a module shared by all edges of shift δ.

    Registering the same kernel under several edges is fine: ``parameters()`` deduplicates.
    """

    differentiable = True
    token_local = True
    reads_dest = False

    def __init__(
        self, kernel: nn.Module, scale_src: Tensor | None = None, scale_dst: Tensor | None = None
    ) -> None:
        super().__init__()
        self.kernel = kernel
        self.d_in, self.d_out = kernel.d_in, kernel.d_out
        self.conjugated = scale_src is not None
        if self.conjugated:
            self.register_buffer("scale_src", scale_src.to(SCALE_DTYPE).clone())
            self.register_buffer("scale_dst", scale_dst.to(SCALE_DTYPE).clone())

    def forward(self, x_src: Tensor, x_dst: Tensor | None = None) -> Tensor:
        if not self.conjugated:
            return self.kernel(x_src)
        return (self.scale_dst.to(x_src.dtype)
                * self.kernel(x_src / self.scale_src.to(x_src.dtype)))


class BandedBlocks(nn.Module):
    """Kernels K_δ shared across g; ``edge_set`` and ``blocks()`` give the layer's edges."""

    def __init__(
        self, space: GradedStateSpace, shifts: Iterable[int], *, kind: str = "linear",
        hidden: int | None = None,
    ) -> None:
        super().__init__()
        self.space = space
        self.d = _equal_dim(space)
        self.edge_set = EdgeSet.banded(space, shifts)
        self.shifts = sorted({space.index(e.dest) - space.index(e.source) for e in self.edge_set})
        self.kernels = nn.ModuleDict({str(s): _kernel(self.d, kind, hidden) for s in self.shifts})

    def shift_of(self, edge_index: int) -> int:
        e = self.edge_set[edge_index]
        return self.space.index(e.dest) - self.space.index(e.source)

    def blocks(self) -> list[nn.Module]:
        """One block per edge of ``edge_set`` (in order), sharing K_δ across g."""
        return [
            _SharedKernel(self.kernels[str(self.shift_of(i))]) for i in range(len(self.edge_set))
        ]


class ConjugatedBlocks(_HeldScales, BandedBlocks):
    """Φ_{(g+δ)←g} x = D_{g+δ} K̂_δ(D_g^{-1} x) (004 Def 2.8, Prop 2.9).

    ``base`` λ > 0 gives scalar D_g = λ^{index(g)}; ``scales`` (label → positive (d,) tensor)
    gives general diagonal D_g. Exactly one of the two.
    """

    def __init__(
        self, space: GradedStateSpace, shifts: Iterable[int], *, base: float | None = None,
        scales: Mapping[str, Tensor] | None = None, kind: str = "linear", hidden: int | None = None,
    ) -> None:
        super().__init__(space, shifts, kind=kind, hidden=hidden)
        if (base is None) == (scales is None):
            raise ValueError("give exactly one of base (scalar λ) or scales (per-grade diagonal), "
                             f"got base={base!r} and scales={scales!r}")
        diag = {}
        tiny, huge = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max
        for g in space.grades:
            if base is not None:
                lam = check_float("base λ", base, minimum=0, strict_min=True)
                try:  # a Python float: past float32's range, or OverflowError past float64's
                    value = lam ** space.index(g.label)
                except OverflowError:
                    value = math.inf
                if not tiny <= value <= huge:  # D_g x would be inf or 0, D_g⁻¹ x NaN or inf
                    raise ValueError(
                        f"base λ = {lam} gives D_{g.label} = λ^{space.index(g.label)} = {value}; "
                        f"expected a scale in float32's normal range [{tiny}, {huge}] (a λ "
                        f"closer to 1 or smaller grade indices)")
                diag[g.label] = torch.full((self.d,), value, dtype=SCALE_DTYPE)
            else:
                if g.label not in scales:
                    raise ValueError(f"scales is missing grade {g.label!r}")
                s = torch.as_tensor(scales[g.label], dtype=SCALE_DTYPE).detach().clone()
                if s.shape != (self.d,) or not bool(((s >= tiny) & (s <= huge)).all()):
                    raise ValueError(f"scales[{g.label!r}] must be positive of shape ({self.d},), "
                                     f"got {s.tolist()}; expected finite values in float32's "
                                     f"normal range [{tiny}, {huge}]")
                diag[g.label] = s
        for label, s in diag.items():
            self.register_buffer(f"scale_{label}", s)

    def scale(self, label: str) -> Tensor:
        return getattr(self, f"scale_{label}")

    def blocks(self) -> list[nn.Module]:
        return [
            _SharedKernel(
                self.kernels[str(self.shift_of(i))], self.scale(e.source), self.scale(e.dest)
            )
            for i, e in enumerate(self.edge_set)
        ]
