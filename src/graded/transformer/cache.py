"""Key/value cache for incremental decoding.

A layer caches its keys and values, or, when its self-attention backend keeps a decoding state
of its own (:class:`graded.attention.backends.DecodeState`: a rolling window, running sums),
that state instead. A decoder layer with cross-attention projects the encoder memory into keys
and values once, at the first cached step, and keeps them with a :class:`MemoryRecord` of the
memory they came from: a later step that passes another memory, or the same one changed in
place, is refused (the cached keys would silently attend to the old memory)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from graded.attention.backends import DecodeState

__all__ = ["KVCache", "LayerCache", "MemoryRecord"]


class MemoryRecord:
    """What a layer's cached cross-attention keys and values were projected from: the encoder
    memory tensor, its version counter ``_version`` (which every in-place change bumps, on the
    memory or on any view of its storage), its shape and its data pointer (``.data`` or
    ``set_`` swapped under it). :meth:`check` compares these host-side numbers, no value is
    read, when a step passes the same tensor (about a microsecond of host time a layer and
    step, CPU, timeit; no wait on a GPU). A step that passes another tensor (the memory
    encoded again) is compared with the recorded one, value for value, once: equal values are
    taken (and the new tensor recorded), others refused. The record holds the memory (the
    cached keys and values are each its size already). An inference tensor
    (``torch.inference_mode``) keeps no version counter: a change in place under inference
    mode is not seen (another tensor, shape or storage still is). ``steps`` counts the cache's
    steps through the layer, 1 for the step that projected the memory (the step named in the
    errors); ``refused`` holds the first refusal, repeated at every later step (the refused
    step had already written the new tokens into the cache)."""

    __slots__ = ("data_ptr", "memory", "refused", "shape", "steps", "version")

    def __init__(self, memory: Tensor) -> None:
        self.track(memory)
        self.steps = 1
        self.refused: str | None = None

    def track(self, memory: Tensor) -> None:
        """Record ``memory`` as the tensor the keys and values are of (the step count and a
        refusal stay)."""
        self.memory = memory
        self.version = self._version_of(memory)
        self.shape = memory.shape
        self.data_ptr = memory.data_ptr()

    @staticmethod
    def _version_of(memory: Tensor) -> int | None:
        return None if memory.is_inference() else memory._version

    def _unchanged(self) -> bool:
        """Whether the recorded memory still holds the values the keys were projected from."""
        old = self.memory
        return (self._version_of(old) == self.version and old.shape == self.shape
                and old.data_ptr() == self.data_ptr)

    def check(self, memory: Tensor, who: str) -> None:
        """Refuse, naming ``who`` (the layer) and the step, a ``memory`` whose values may differ
        from those the keys were projected from: the recorded tensor changed in place or given
        other storage since, or another tensor whose values are not equal to the recorded
        one's; after a refusal, every step."""
        self.steps += 1
        if self.refused is not None:
            raise ValueError(f"{who}, step {self.steps} of the cache: the cache was refused "
                             f"before ({self.refused}); start a new cache (model.new_cache())")
        projected = "its cached cross-attention keys and values were projected from"
        if memory is self.memory:
            if self._unchanged():
                return
            why = (f"the encoder memory was changed in place (version {memory._version}, was "
                   f"{self.version}) after {projected} it"
                   if self.version is not None and memory._version != self.version else
                   f"the encoder memory holds other data (shape {tuple(memory.shape)}, was "
                   f"{tuple(self.shape)}; or other storage) than when {projected} it")
        elif not self._unchanged():
            why = (f"the encoder memory is another tensor, and the one {projected} has been "
                   "changed since, so the two cannot be compared")
        elif memory.shape != self.shape:
            why = (f"the encoder memory has shape {tuple(memory.shape)}, the one {projected} "
                   f"{tuple(self.shape)}")
        elif not torch.equal(memory, self.memory.to(memory.device, memory.dtype)):
            why = f"the encoder memory holds other values than the one {projected}"
        else:  # the memory encoded again: the same values, now recorded
            self.track(memory)
            return
        self.refused = f"step {self.steps}: {why}"
        raise ValueError(
            f"{who}, step {self.steps} of the cache: {why}; they would attend to the old "
            "memory. Pass the memory the cache began with at every step, unchanged, and "
            "start a new cache (model.new_cache()) for another memory")


@dataclass
class LayerCache:
    """Per-layer cached per-head keys and values, (B, H, S, head_dim), or the self-attention
    backend's decoding ``state``; cross-attention keys and values of the encoder memory, and
    ``cross_record``, the :class:`MemoryRecord` of that memory (:meth:`cross_keys`)."""

    k: Tensor | None = None
    v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    state: DecodeState | None = None
    cross_record: MemoryRecord | None = None

    def cross_keys(self, memory: Tensor, who: str) -> tuple[Tensor, Tensor] | None:
        """The cached cross-attention keys and values, or None before the first step; refused
        (:meth:`MemoryRecord.check`) when ``memory`` is not the unchanged tensor they were
        projected from. Not checked under the compiler (its graph holds no Python state of
        the cache's) or for keys kept under it (no record)."""
        if self.cross_k is None:
            return None
        if self.cross_record is not None and not torch.compiler.is_compiling():
            self.cross_record.check(memory, who)
        return self.cross_k, self.cross_v

    def keep_cross(self, k: Tensor, v: Tensor, memory: Tensor) -> None:
        """Keep the cross-attention keys and values projected from ``memory``, and its
        record."""
        self.cross_k, self.cross_v = k, v
        self.cross_record = None if torch.compiler.is_compiling() else MemoryRecord(memory)

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

    def reorder(self, index: Tensor, memory: Tensor | None = None) -> None:
        """Select batch rows (beam search): every cached tensor becomes ``t[index]``. The next
        steps pass the encoder memory the cross-attention keys were projected from, unchanged,
        as beam search does (its memory is repeated once per beam, and a reorder moves beams
        within their source's rows, which are equal); a caller that reorders the memory
        alongside (``memory.index_select(0, index)``) passes the new tensor as ``memory``, and
        the cache records it in place of the old one."""
        if memory is not None and not isinstance(memory, Tensor):
            raise TypeError(f"reorder: memory must be a tensor (the reordered encoder memory) "
                            f"or None, got {type(memory).__name__}")
        if memory is not None and memory.shape[0] != index.shape[0]:
            raise ValueError(f"reorder: the memory has {memory.shape[0]} row(s), the index "
                             f"{index.shape[0]}; expected memory.index_select(0, index)")
        for layer in self.layers:
            if memory is not None and layer.cross_k is not None:
                if layer.cross_record is None:
                    layer.cross_record = MemoryRecord(memory)
                else:
                    layer.cross_record.track(memory)
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
