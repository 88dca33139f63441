"""Finite simple graphs on vertices 0..n-1 (003 Example 3.3).

**Object.** A graph is its adjacency matrix: an n×n ``numpy.ndarray`` of dtype int64, symmetric,
0/1, zero diagonal. Encoders also accept a torch tensor or nested lists; decoders always return
a fresh numpy array. :func:`adjacency_from_edges` and :func:`edges_of` convert from and to an
edge set of 0-indexed pairs (i, j), i < j.

- :class:`AdjacencyCodec`: the flattened adjacency matrix, n² tokens "0"/"1".
- :class:`UpperTriangleCodec`: the strictly upper triangle read row by row, n(n-1)/2 bits (the
  encoding of the public PatternBoost code).
- :class:`EdgeListCodec`: the edges (u, v), u < v, sorted, as 2·|E| vertex tokens numbered from
  ``start`` (1 by default, as in the notes: "[(1,2), (1,5), ...]" is ``1 2 1 5 ...``).

Canonical labelling (a certificate equal exactly for isomorphic graphs) is in
:mod:`graded.encodings.canonical`; ``UpperTriangleCodec(n, canonical=True)`` encodes the
canonical representative (003 §3.1 "uniqueness").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from graded.checks import check_bool, check_int
from graded.encodings.base import (
    Codec,
    DecodeError,
    bits_to_tokens,
    parse_token_int,
    tokens_to_bits,
)


def as_adjacency(obj: Any, n: int | None = None) -> np.ndarray:
    """``obj`` as a checked int64 adjacency matrix; ValueError/TypeError if it is not one."""
    if hasattr(obj, "detach"):  # torch tensor
        obj = obj.detach().cpu().numpy()
    try:
        arr = np.asarray(obj)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"a graph must be an n x n 0/1 array, got {type(obj).__name__}") from exc
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"a graph must be an n x n 0/1 array, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"adjacency matrix must be square n x n, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"graph has {arr.shape[0]} vertices, expected {n}")
    if not np.isin(arr, (0, 1)).all():
        raise ValueError(
            "adjacency entries must be 0 or 1, got values "
            f"{sorted(set(np.unique(arr).tolist()) - {0, 1})}"
        )
    adj = arr.astype(np.int64)
    if (np.diagonal(adj) != 0).any():
        raise ValueError(
            f"self-loop at vertex {int(np.flatnonzero(np.diagonal(adj))[0])}: "
            "a simple graph has a zero diagonal"
        )
    if (adj != adj.T).any():
        i, j = np.argwhere(adj != adj.T)[0]
        raise ValueError(f"adjacency matrix is not symmetric at ({i}, {j})")
    return adj


def adjacency_from_edges(n: int, edges: Iterable[tuple[int, int]]) -> np.ndarray:
    """Adjacency matrix of the graph on 0..n-1 with the given (0-indexed) edges."""
    n = check_int("n", n, minimum=0)
    adj = np.zeros((n, n), dtype=np.int64)
    for edge in edges:
        u, v = (check_int("vertex", x, minimum=0) for x in edge)
        if u >= n or v >= n:
            raise ValueError(f"edge {edge} has a vertex outside 0..{n - 1}")
        if u == v:
            raise ValueError(f"edge {edge} is a self-loop")
        adj[u, v] = adj[v, u] = 1
    return adj


def edges_of(adj: Any) -> list[tuple[int, int]]:
    """Sorted 0-indexed edges (i, j), i < j, of an adjacency matrix."""
    a = as_adjacency(adj)
    return [(int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(a, 1)))]


class _GraphCodec(Codec[np.ndarray]):
    def __init__(self, n: int) -> None:
        self.n = check_int("n", n, minimum=0)


class AdjacencyCodec(_GraphCodec):
    """Flattened n×n matrix; rejects a wrong length, a bad token, a loop or an asymmetric pair."""

    @property
    def tokens(self) -> tuple[str, ...]:
        return ("0", "1")

    def encode(self, obj: Any) -> list[str]:
        return bits_to_tokens(as_adjacency(obj, self.n).ravel().tolist())

    def decode(self, tokens: Sequence[str]) -> np.ndarray:
        n = self.n
        adj = np.array(
            tokens_to_bits(tokens, n * n, f"an {n}x{n} adjacency matrix"), dtype=np.int64
        ).reshape(n, n)
        loops = np.flatnonzero(np.diagonal(adj))
        if loops.size:
            raise DecodeError(f"diagonal entry ({loops[0]}, {loops[0]}) is 1: a self-loop")
        if (adj != adj.T).any():
            i, j = np.argwhere(adj != adj.T)[0]
            raise DecodeError(f"entries ({i}, {j}) and ({j}, {i}) differ: not symmetric")
        return adj


class UpperTriangleCodec(_GraphCodec):
    """Strict upper triangle, row-major: (0,1), (0,2), ..., (0,n-1), (1,2), ...

    With ``canonical=True`` the encoder first relabels the graph to its canonical form, so that
    isomorphic graphs get the same tokens (the decoder then returns the canonical graph). Canonical
    labelling stops at ``MAX_CANONICAL_VERTICES`` = 64, so a canonical codec with more vertices
    is refused here (it could encode nothing, and ``is_valid`` would raise instead of answering).
    """

    def __init__(self, n: int, canonical: bool = False) -> None:
        super().__init__(n)
        self.canonical = check_bool("canonical", canonical)
        if self.canonical:
            from graded.encodings.canonical import MAX_CANONICAL_VERTICES

            if self.n > MAX_CANONICAL_VERTICES:
                raise ValueError(
                    f"UpperTriangleCodec(n={self.n}, canonical=True): canonical labelling is "
                    f"limited to {MAX_CANONICAL_VERTICES} vertices; use canonical=False"
                )
        self._rows, self._cols = np.triu_indices(self.n, 1)

    @property
    def tokens(self) -> tuple[str, ...]:
        return ("0", "1")

    def encode(self, obj: Any) -> list[str]:
        adj = as_adjacency(obj, self.n)
        if self.canonical:
            from graded.encodings.canonical import canonical_graph

            adj = canonical_graph(adj)
        return bits_to_tokens(adj[self._rows, self._cols].tolist())

    def decode(self, tokens: Sequence[str]) -> np.ndarray:
        n = self.n
        bits = tokens_to_bits(tokens, len(self._rows), f"the upper triangle of {n} vertices")
        adj = np.zeros((n, n), dtype=np.int64)
        adj[self._rows, self._cols] = bits
        adj = adj + adj.T
        if self.canonical:
            from graded.encodings.canonical import canonical_graph

            if not np.array_equal(canonical_graph(adj), adj):
                raise DecodeError("the graph is not in canonical form")
        return adj


class EdgeListCodec(_GraphCodec):
    """Sorted edges u < v as vertex-token pairs; rejects odd length, loops, repeats, disorder."""

    def __init__(self, n: int, start: int = 1) -> None:
        super().__init__(n)
        self.start = check_int("start", start, minimum=0)

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(str(self.start + i) for i in range(self.n))

    def encode(self, obj: Any) -> list[str]:
        as_adjacency(obj, self.n)
        return [str(self.start + v) for edge in edges_of(obj) for v in edge]

    def to_string(self, obj: Any) -> str:
        """The notes' edge-list string, e.g. "[(1,2), (1,5), (2,4)]" (003 Ex. 3.3)."""
        t = self.encode(obj)
        return "[" + ", ".join(f"({t[k]},{t[k + 1]})" for k in range(0, len(t), 2)) + "]"

    def decode(self, tokens: Sequence[str]) -> np.ndarray:
        if len(tokens) % 2:
            raise DecodeError(f"odd length {len(tokens)}: an edge list has two tokens per edge")
        hi = self.start + self.n - 1
        values = [parse_token_int(t, self.start, hi, "a vertex") - self.start for t in tokens]
        edges = list(zip(values[::2], values[1::2]))
        for k, (u, v) in enumerate(edges):
            if u == v:
                raise DecodeError(f"edge {k + 1} is a self-loop at vertex {u + self.start}")
            if u > v:
                raise DecodeError(
                    f"edge {k + 1} ({u + self.start}, {v + self.start}) is not "
                    "written with the smaller vertex first"
                )
            if k and edges[k - 1] >= (u, v):
                what = "repeated" if edges[k - 1] == (u, v) else "out of order"
                raise DecodeError(f"edge {k + 1} ({u + self.start}, {v + self.start}) is {what}")
        return adjacency_from_edges(self.n, edges)
