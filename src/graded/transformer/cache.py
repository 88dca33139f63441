"""Key/value cache for incremental decoding.

A layer caches its keys and values, or, when its self-attention backend keeps a decoding state
of its own (:class:`graded.attention.backends.DecodeState`: a rolling window, running sums),
that state instead."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from graded.attention.backends import DecodeState

__all__ = ["KVCache", "LayerCache"]


@dataclass
class LayerCache:
    """Per-layer cached per-head keys and values, (B, H, S, head_dim), or the self-attention
    backend's decoding ``state``; cross-attention keys and values of the encoder memory."""

    k: Tensor | None = None
    v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    state: DecodeState | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


@dataclass
class KVCache:
    """The cache of a whole decoder: one :class:`LayerCache` per layer, plus the positions
    and padding of the cached tokens (so ALiBi, RoPE and padding stay right), ``length`` (the
    number of tokens recorded) and ``real`` (B, 1), the number of non-padding tokens per row.
    When every layer keeps a decoding state of its own, the positions and padding of the
    newest tokens alone are kept (``history=False`` in :meth:`extend`), so nothing in the
    cache grows with the length."""

    layers: list[LayerCache] = field(default_factory=list)
    positions: Tensor | None = None  # (B, S) absolute positions of cached tokens
    key_padding_mask: Tensor | None = None  # (B, S) True = padding
    length: int = 0
    real: Tensor | None = None  # (B, 1) non-padding tokens recorded

    @classmethod
    def empty(cls, n_layers: int) -> KVCache:
        return cls(layers=[LayerCache() for _ in range(n_layers)])

    def check(self, n_layers: int, batch: int, who: str) -> None:
        """Refuse, naming both, a cache made for another number of layers
        (``model.new_cache()`` makes the right one) or holding another number of rows than the
        ``batch`` of the new tokens (a cache continues the rows it was filled with). Shapes
        only: no value is read."""
        if len(self.layers) != n_layers:
            raise ValueError(f"{who}: the cache has {len(self.layers)} layer(s); expected "
                             f"{n_layers}, one per decoder layer (make it with "
                             "model.new_cache())")
        rows = self.real.shape[0] if self.real is not None else None
        if rows is not None and rows != batch:
            raise ValueError(f"{who}: the cache holds {rows} row(s), the new tokens {batch}; "
                             "a cache continues the rows it was filled with (use a new one "
                             "for another batch)")

    def extend(self, positions: Tensor, key_padding_mask: Tensor, *, history: bool = True
               ) -> tuple[Tensor, Tensor]:
        """Record new tokens' positions and padding; return the (B, S) tensors of every cached
        token, or with ``history=False`` those of the new tokens only."""
        self.length += positions.shape[1]
        count = (~key_padding_mask).long().sum(dim=1, keepdim=True)
        self.real = count if self.real is None else self.real + count
        if self.positions is None or not history:
            self.positions, self.key_padding_mask = positions, key_padding_mask
        else:
            self.positions = torch.cat([self.positions, positions], dim=1)
            self.key_padding_mask = torch.cat([self.key_padding_mask, key_padding_mask], dim=1)
        return self.positions, self.key_padding_mask

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached tensors of every layer (positions and padding included)."""
        total = sum(t.numel() * t.element_size()
                    for t in (self.positions, self.key_padding_mask, self.real) if t is not None)
        for layer in self.layers:
            total += sum(t.numel() * t.element_size()
                         for t in (layer.k, layer.v, layer.cross_k, layer.cross_v)
                         if t is not None)
            total += 0 if layer.state is None else layer.state.nbytes
        return total

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): every cached tensor becomes ``t[index]``."""
        for layer in self.layers:
            for name in ("k", "v", "cross_k", "cross_v"):
                t = getattr(layer, name)
                if t is not None:
                    setattr(layer, name, t.index_select(0, index))
            if layer.state is not None:
                layer.state.reorder(index)
        if self.positions is not None:
            self.positions = self.positions.index_select(0, index)
            self.key_padding_mask = self.key_padding_mask.index_select(0, index)
            self.real = self.real.index_select(0, index)
