"""Key/value cache for incremental decoding.

A layer caches its keys and values, or, when its self-attention backend keeps a decoding state
of its own (:class:`graded.attention.backends.DecodeState`: a rolling window, running sums),
that state instead. A decoder layer with cross-attention projects the encoder memory into keys
and values once, at the first cached step, and keeps them; the cache keeps a
:class:`MemoryRecord` of the memory they came from: a later step that passes another memory,
or the same one changed in place, is refused (the cached keys would silently attend to the old
memory). The decoder checks a step before it changes anything in the cache
(:meth:`KVCache.check_memory` last), so a refused step leaves the cache as it was, and the
step may be repeated with the right memory."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from graded.attention.backends import DecodeState

__all__ = ["KVCache", "LayerCache", "MemoryRecord"]

_PROJECTED = "the cached cross-attention keys and values were projected from"


class MemoryRecord:
    """What a cache's cross-attention keys and values were projected from: the encoder memory
    tensor, its version counter ``_version`` (which every in-place change bumps, on the memory
    or on any view of its storage), its shape and its data pointer (``.data`` or ``set_``
    swapped under it). :meth:`check` compares these host-side numbers, no value is read, when
    a step passes the same tensor (about a microsecond of host time a step, every layer at
    once, CPU, timeit; no wait on a GPU). A step that passes another tensor (the memory encoded
    again) is compared with the recorded one, value for value, once: equal values are taken
    (and the new tensor recorded), others refused. The record holds the memory (the cached keys
    and values are each its size already). An inference tensor (``torch.inference_mode``)
    keeps no version counter: a change in place under inference mode is not seen (another
    tensor, shape or storage still is). ``steps`` counts the cache's steps that passed the
    check, 1 for the step that projected the memory (the errors name the step being
    checked). A refused step changes nothing, the record included."""

    __slots__ = ("data_ptr", "memory", "shape", "steps", "version")

    def __init__(self, memory: Tensor) -> None:
        self.track(memory)
        self.steps = 1

    def track(self, memory: Tensor) -> None:
        """Record ``memory`` as the tensor the keys and values are of (the step count
        stays)."""
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
        """Count a step that passes ``memory``, recording it when it is another tensor of
        equal values; refuse, naming ``who`` and the step and changing nothing, a ``memory``
        whose values may differ from those the keys were projected from (:meth:`refusal`)."""
        why = self.refusal(memory)
        if why is not None:
            raise ValueError(
                f"{who}, step {self.steps + 1} of the cache: {why}; they would attend to the "
                "old memory. The cache is unchanged: repeat the step with the memory the cache "
                "began with, unchanged, or start a new cache (model.new_cache()) for another "
                "memory")
        if memory is not self.memory:  # the memory encoded again: the same values
            self.track(memory)
        self.steps += 1

    def refusal(self, memory: Tensor) -> str | None:
        """Why ``memory`` may hold other values than the keys were projected from, or None:
        the recorded tensor changed in place or given other storage since, or another tensor
        whose shape or values are not the recorded one's. Reads values only for another
        tensor of the recorded shape."""
        if memory is self.memory:
            if self._unchanged():
                return None
            if self.version is not None and memory._version != self.version:
                return (f"the encoder memory was changed in place (version {memory._version}, "
                        f"was {self.version}) after {_PROJECTED} it")
            return (f"the encoder memory holds other data (shape {tuple(memory.shape)}, was "
                    f"{tuple(self.shape)}; or other storage) than when {_PROJECTED} it")
        if not self._unchanged():
            return (f"the encoder memory is another tensor, and the one {_PROJECTED} has been "
                    "changed since, so the two cannot be compared")
        if memory.shape != self.shape:
            return (f"the encoder memory has shape {tuple(memory.shape)}, the one {_PROJECTED} "
                    f"{tuple(self.shape)}")
        # compared in the dtype both convert to exactly (an autocast memory of another dtype
        # is equal only where every recorded value is one it holds)
        common = torch.promote_types(memory.dtype, self.memory.dtype)
        if not torch.equal(memory.to(dtype=common),
                           self.memory.to(memory.device, common)):
            return f"the encoder memory holds other values than the one {_PROJECTED}"
        return None


@dataclass
class LayerCache:
    """Per-layer cached per-head keys and values, (B, H, S, head_dim), or the self-attention
    backend's decoding ``state``; and the cross-attention keys and values of the encoder memory,
    projected at the first cached step (:attr:`KVCache.memory_record` records the memory)."""

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
    cache grows with the length. ``memory_record`` is the :class:`MemoryRecord` of the encoder
    memory the layers' cross-attention keys and values were projected from
    (:meth:`check_memory`)."""

    layers: list[LayerCache] = field(default_factory=list)
    positions: Tensor | None = None  # (B, S) absolute positions of cached tokens
    key_padding_mask: Tensor | None = None  # (B, S) True = padding
    length: int = 0
    real: Tensor | None = None  # (B, 1) non-padding tokens recorded
    memory_record: MemoryRecord | None = None

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

    def check_memory(self, memory: Tensor, who: str) -> None:
        """Take the encoder ``memory`` of a step of a decoder with cross-attention, before the
        step changes anything: at the first step (no cross-attention keys cached) record it;
        after it, refuse (:meth:`MemoryRecord.check`, naming ``who``) a memory that is not
        the unchanged tensor the keys were projected from, or one of equal values, leaving
        the cache as it was; count the step otherwise. One check for every layer: their keys
        are all projected at the same step from the same memory. Not checked under the
        compiler (its graph holds no Python state of the cache's) or for keys projected under
        it (no record)."""
        if torch.compiler.is_compiling():
            return
        if self.layers[0].cross_k is None:  # this step projects the memory
            self.memory_record = MemoryRecord(memory)
        elif self.memory_record is not None:
            self.memory_record.check(memory, who)

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
        if memory is not None and any(layer.cross_k is not None for layer in self.layers):
            if self.memory_record is None:
                self.memory_record = MemoryRecord(memory)
            else:
                self.memory_record.track(memory)
