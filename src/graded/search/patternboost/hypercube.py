"""Most edges deletable from the d-cube keeping its diameter d (003 §3.3).

003 §3.3 says "without decreasing its diameter"; deleting edges can only lengthen distances, so
the constraint meant (and used here) is that the diameter stays d, i.e. every pair of vertices
is still joined by a path of length at most d.

The d-cube Q_d has vertices 0..2^d−1 and an edge between two vertices that differ in one bit;
its edges are numbered by vertex v and bit b with bit b of v clear, in that order. An object is
a 0/1 vector over these d·2^{d−1} edges, 1 = deleted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .problem import Problem, pack_bits, packed_length, unpack_bits

__all__ = ["HypercubeDiameter", "far_pairs", "hypercube_edges"]


def hypercube_edges(d: int) -> np.ndarray:
    """Edges of Q_d as an (d·2^{d−1}, 2) array (v, v + 2^b) ordered by v, then b."""
    return np.array(
        [(v, v | 1 << b) for v in range(1 << d) for b in range(d) if not v >> b & 1],
        dtype=np.int64,
    ).reshape(-1, 2)


def far_pairs(adj: np.ndarray, radius: int) -> int:
    """Number of unordered vertex pairs at distance > radius (disconnected pairs included).

    Breadth-first search for all sources at once: `radius` boolean matrix products.
    """
    a = np.asarray(adj, dtype=np.float32)
    reach = np.eye(a.shape[0], dtype=bool)
    for _ in range(radius):
        reach = reach | ((reach.astype(np.float32) @ a) > 0)
    return int((~reach).sum()) // 2


class HypercubeDiameter(Problem):
    """Delete as many edges of Q_d as possible while its diameter stays d (003 §3.3).

    score = #deleted when the diameter is d, else #deleted − #(pairs at distance > d). Local
    search: re-add the deleted edge that brings the most far pairs back within distance d until
    none is left, then try deleting the remaining edges in a random order, keeping each deletion
    that leaves the diameter at d. One pass suffices: an edge whose deletion breaks the diameter
    still breaks it after further deletions.
    """

    name = "hypercube"
    size_argument = "d"

    def __init__(self, d: int, bits_per_token: int = 4) -> None:
        if not isinstance(d, int) or not 2 <= d <= 8:
            raise ValueError(f"d (cube dimension) must be an int in 2..8, got {d!r}")
        self.d = d
        self.bits_per_token = bits_per_token
        self.edges = hypercube_edges(d)
        self._length = packed_length(len(self.edges), bits_per_token)

    @property
    def n(self) -> int:
        """Problem size as the command line names it (the dimension d)."""
        return self.d

    @property
    def vocab_size(self) -> int:
        return 1 << self.bits_per_token

    @property
    def max_length(self) -> int:
        return self._length

    def params(self) -> dict[str, Any]:
        return {"d": self.d, "bits_per_token": self.bits_per_token}

    def _deleted(self, obj: Any) -> np.ndarray:
        x = np.asarray(obj)
        if x.shape != (len(self.edges),):
            raise ValueError(f"expected a 0/1 vector of length {len(self.edges)}, got shape "
                             f"{x.shape}")
        if not np.isin(x, (0, 1)).all():
            raise ValueError(f"expected a 0/1 vector of length {len(self.edges)}, got entries "
                             f"{sorted(set(np.unique(x).tolist()) - {0, 1})}")
        return x.astype(np.uint8)

    def adjacency(self, obj: Any) -> np.ndarray:
        """Adjacency matrix of Q_d minus the deleted edges."""
        kept = self.edges[self._deleted(obj) == 0]
        a = np.zeros((1 << self.d, 1 << self.d), dtype=np.uint8)
        a[kept[:, 0], kept[:, 1]] = 1
        a[kept[:, 1], kept[:, 0]] = 1
        return a

    def empty(self) -> np.ndarray:
        return np.zeros(len(self.edges), dtype=np.uint8)

    def encode(self, obj: Any) -> list[int]:
        return pack_bits(self._deleted(obj), self.bits_per_token)

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        return unpack_bits(tokens, self.bits_per_token, len(self.edges))

    def key(self, obj: Any) -> bytes:
        return np.packbits(self._deleted(obj)).tobytes()

    def is_valid(self, obj: Any) -> bool:
        return far_pairs(self.adjacency(obj), self.d) == 0

    def score(self, obj: Any) -> float:
        x = self._deleted(obj)
        return float(int(x.sum()) - far_pairs(self.adjacency(x), self.d))

    def local_search(self, obj: Any, rng: np.random.Generator) -> np.ndarray:
        x = self._deleted(obj).copy()
        far = far_pairs(self.adjacency(x), self.d)
        while far > 0:
            deleted = np.flatnonzero(x)
            after = []
            for e in deleted:
                x[e] = 0
                after.append(far_pairs(self.adjacency(x), self.d))
                x[e] = 1
            after_arr = np.asarray(after)
            best = np.flatnonzero(after_arr == after_arr.min())
            x[deleted[best[int(rng.integers(len(best)))]]] = 0
            far = int(after_arr.min())
        for e in rng.permutation(len(self.edges)):
            if x[e]:
                continue
            x[e] = 1
            if far_pairs(self.adjacency(x), self.d) > 0:
                x[e] = 0
        return x

    def describe(self, obj: Any) -> str:
        return f"{int(self._deleted(obj).sum())} deleted, score {self.score(obj):g}"
