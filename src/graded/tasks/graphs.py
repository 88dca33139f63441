"""Invariants of random graphs from named families, the home of the split by family (003 §3.2).

Each example is a graph on n vertices, n uniform in [min_vertices, max_vertices], drawn from a
family chosen uniformly in ``graph_families``. Its vertices are then renumbered by a uniformly
random permutation, so that the labels carry no trace of the generator. The label is one
isomorphism invariant, chosen by ``target``.

**Encoding.** The vertex count, then the edge list of
:class:`~graded.encodings.graphs.EdgeListCodec` (vertices numbered from 1, edges u < v,
sorted)::

    n=5 1 2 1 5 2 4 3 4 3 5        the 5-cycle 1-2-4-3-5-1

An edge list rather than the upper-triangle bits, for two reasons. First, a vertex token names
the same vertex at every n, whereas the k-th bit of the upper triangle is a different vertex
pair for each n, so a size split (train on small n, test on larger n) would change the format
under the model. Second, every token is a vertex, and its degree is a natural grade. The cost is
length: 2|E| + 1 tokens, up to n(n - 1) + 1 for a dense graph, and every sequence is padded to
that. The leading ``n=K`` token is needed because an edge list does not show isolated vertices.

**Families** (``FAMILIES``). 003 §3.2 warns that the generator is part of the data: Erdős–Rényi
graphs have trivial automorphism groups, the other families many.

- ``erdos_renyi``: G(n, ``edge_prob``);
- ``tree``: a uniform labelled tree (a uniform Prüfer sequence, n^(n-2) trees);
- ``cycle``: the cycle C_n;
- ``complete_bipartite``: K_{a, n-a}, a uniform in 1..n-1;
- ``regular``: every degree d = min(``degree``, n - 1), one vertex d - 1 when n·d is odd; a
  Havel–Hakimi realisation mixed by 10·|E| degree-preserving double-edge swaps (close to uniform
  among such graphs, not exactly uniform);
- ``grid``: the first n cells, row by row, of a grid of width w uniform in 2..max(2, ⌊√n⌋)
  (a ladder when w = 2), edges between horizontal and vertical neighbours.

**Targets** (classification): ``bipartite`` (2 classes, no odd cycle), ``connected`` (2),
``triangles`` (the count bucketed as 0, 1, 2-3, 4-7, 8+: 5 classes), ``max_degree`` (classes
0..V-1) and ``edges`` (classes 0..V(V-1)/2), where V is ``vocab_vertices`` (default
``max_vertices``), which also fixes the vocabulary so that a size split shares both.

**Grades** (``graded_object = "tokens"``): the degree of the vertex each token names; 0 for the
``n=K`` token and padding. The datasets also carry ``family`` (N,), indices into ``FAMILIES``.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from graded.checks import check_choice, check_float, check_int
from graded.encodings.canonical import MAX_CANONICAL_VERTICES, canonical_graph
from graded.encodings.graphs import EdgeListCodec, adjacency_from_edges, as_adjacency
from graded.tasks.base import Task, TaskDataset, Vocab, check_seed, pad_sequences

FAMILIES = ("erdos_renyi", "tree", "cycle", "complete_bipartite", "regular", "grid")
TARGETS = ("bipartite", "connected", "triangles", "max_degree", "edges")
TRIANGLE_BUCKETS = ("0", "1", "2-3", "4-7", "8+")
MIN_VERTICES = 3

Edges = list[tuple[int, int]]


# ---- invariants -----------------------------------------------------------------------------
def is_connected(adj: np.ndarray) -> bool:
    """Whether breadth-first search from vertex 0 reaches every vertex."""
    n = adj.shape[0]
    seen, queue = {0}, deque([0])
    while queue:
        for w in np.flatnonzero(adj[queue.popleft()]).tolist():
            if w not in seen:
                seen.add(w)
                queue.append(w)
    return len(seen) == n


def is_bipartite(adj: np.ndarray) -> bool:
    """Whether breadth-first 2-colouring of every component meets no edge inside a colour."""
    colour = [-1] * adj.shape[0]
    for start in range(adj.shape[0]):
        if colour[start] >= 0:
            continue
        colour[start] = 0
        queue = deque([start])
        while queue:
            v = queue.popleft()
            for w in np.flatnonzero(adj[v]).tolist():
                if colour[w] < 0:
                    colour[w] = 1 - colour[v]
                    queue.append(w)
                elif colour[w] == colour[v]:
                    return False
    return True


def count_triangles(adj: np.ndarray) -> int:
    """Triangles u < v < w, counted as the common neighbours w > v of each edge u < v."""
    total = 0
    for u, v in zip(*np.nonzero(np.triu(adj, 1))):
        total += int((adj[u, v + 1:] & adj[v, v + 1:]).sum())
    return total


def triangle_bucket(count: int) -> int:
    """The class of a triangle count: 0, 1, 2-3, 4-7, 8+ (``TRIANGLE_BUCKETS``)."""
    return min(count.bit_length(), len(TRIANGLE_BUCKETS) - 1)


# ---- families (0-indexed edges before the random renumbering) -------------------------------
def random_tree(rng: random.Random, n: int) -> Edges:
    """A uniform labelled tree: the tree of a uniform Prüfer sequence of length n - 2."""
    code = [rng.randrange(n) for _ in range(n - 2)]
    remaining = [1] * n  # degree still to attach: 1 + occurrences in the code
    for v in code:
        remaining[v] += 1
    edges = []
    for v in code:
        leaf = remaining.index(1)  # the smallest current leaf
        edges.append((leaf, v))
        remaining[leaf] -= 1
        remaining[v] -= 1
    u, w = (x for x in range(n) if remaining[x] == 1)
    return [*edges, (u, w)]


def havel_hakimi(degrees: list[int]) -> Edges:
    """A graph with the given degree sequence (Havel–Hakimi); ValueError if there is none."""
    remaining = list(degrees)
    edges = []
    while True:
        order = sorted(range(len(remaining)), key=lambda x: (-remaining[x], x))
        v, k = order[0], remaining[order[0]]
        if k == 0:
            return edges
        targets = order[1: k + 1]
        if len(targets) < k or remaining[targets[-1]] == 0:
            raise ValueError(f"degree sequence {degrees} is not graphical")
        remaining[v] = 0
        for t in targets:
            remaining[t] -= 1
            edges.append((min(v, t), max(v, t)))


def near_regular(rng: random.Random, n: int, degree: int) -> Edges:
    """Degrees min(degree, n - 1) (one less at one vertex when the sum is odd), mixed by
    10·|E| double-edge swaps {a, b}, {c, e} -> {a, e}, {c, b} that keep the graph simple."""
    d = min(degree, n - 1)
    degrees = [d] * n
    if n * d % 2:
        degrees[-1] -= 1
    edges = havel_hakimi(degrees)
    present = set(edges)
    for _ in range(10 * len(edges)):
        i, j = rng.randrange(len(edges)), rng.randrange(len(edges))
        (a, b), (c, e) = edges[i], edges[j]
        if rng.random() < 0.5:
            c, e = e, c
        if len({a, b, c, e}) < 4:
            continue
        new_i, new_j = (min(a, e), max(a, e)), (min(c, b), max(c, b))
        if new_i in present or new_j in present:
            continue
        present -= {edges[i], edges[j]}
        present |= {new_i, new_j}
        edges[i], edges[j] = new_i, new_j
    return edges


def family_edges(family: str, n: int, rng: random.Random, *, edge_prob: float,
                 degree: int) -> Edges:
    """The edges of one graph of ``family`` on vertices 0..n-1 (see the module docstring)."""
    if family == "erdos_renyi":
        return [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < edge_prob]
    if family == "tree":
        return random_tree(rng, n)
    if family == "cycle":
        return [(i, (i + 1) % n) for i in range(n)]
    if family == "complete_bipartite":
        a = rng.randint(1, n - 1)
        return [(i, j) for i in range(a) for j in range(a, n)]
    if family == "regular":
        return near_regular(rng, n, degree)
    if family == "grid":
        w = rng.randint(2, max(2, math.isqrt(n)))
        return ([(i, i + 1) for i in range(n - 1) if (i + 1) % w]
                + [(i, i + w) for i in range(n - w)])
    raise ValueError(f"unknown graph family {family!r}; known: {FAMILIES}")


def permuted(adj: np.ndarray, rng: random.Random) -> np.ndarray:
    """``adj`` with vertex v renamed perm[v], for a uniform permutation perm."""
    perm = list(range(adj.shape[0]))
    rng.shuffle(perm)
    inverse = np.argsort(perm)  # new vertex w is old vertex inverse[w]
    return adj[np.ix_(inverse, inverse)]


def _family_names(name: str, value: Any) -> tuple[str, ...]:
    """``value`` (a name or a sequence of names) as a checked, non-empty tuple of families."""
    try:
        names = (value,) if isinstance(value, str) else tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be a family name or a sequence of names, got "
                        f"{value!r}") from None
    if not names:
        raise ValueError(f"{name} must name at least one family of {FAMILIES}, got {value!r}")
    for f in names:
        check_choice(f"{name} entry", f, FAMILIES)
    if len(set(names)) != len(names):
        raise ValueError(f"{name} must not repeat a family, got {names}")
    return names


@dataclasses.dataclass
class GraphProperties(Task):
    """Predict an invariant of a random graph from its edge list (SPEC C10; 003 §3.2).

    See the module docstring for the format, families, targets and grades. Splits: ``random``;
    ``size`` (train on n <= mid, test on n > mid, mid the midpoint of the vertex range);
    ``family`` (train on ``graph_families`` minus ``test_families``, test on
    ``test_families``); ``relabelled`` (train on canonical forms,
    :func:`graded.encodings.canonical.canonical_graph`; test on graphs renumbered once more,
    whose labels are unchanged because every target is an isomorphism invariant).
    """

    target: str = "bipartite"
    min_vertices: int = 4
    max_vertices: int = 10
    graph_families: tuple[str, ...] = FAMILIES
    test_families: tuple[str, ...] = ("cycle", "grid")
    edge_prob: float = 0.3
    degree: int = 3
    vocab_vertices: int | None = None

    name: ClassVar[str] = "graph_properties"
    kind: ClassVar[str] = "classification"
    metric: ClassVar[str] = "accuracy"
    graded_object: ClassVar[str] = "tokens"

    def __post_init__(self) -> None:
        check_choice("target", self.target, TARGETS)
        check_int("min_vertices", self.min_vertices, minimum=MIN_VERTICES)
        check_int("max_vertices", self.max_vertices, minimum=self.min_vertices,
                  maximum=MAX_CANONICAL_VERTICES)
        if self.vocab_vertices is not None:
            check_int("vocab_vertices", self.vocab_vertices, minimum=self.max_vertices,
                      maximum=MAX_CANONICAL_VERTICES)
        self.graph_families = _family_names("graph_families", self.graph_families)
        self.test_families = _family_names("test_families", self.test_families)
        check_float("edge_prob", self.edge_prob, minimum=0.0, maximum=1.0)
        check_int("degree", self.degree, minimum=1)
        nv = self._nv
        self._vocab = Vocab(["<pad>", *(f"n={k}" for k in range(MIN_VERTICES, nv + 1)),
                             *(str(v) for v in range(1, nv + 1))])

    @property
    def _nv(self) -> int:
        return self.vocab_vertices if self.vocab_vertices is not None else self.max_vertices

    @property
    def vocab(self) -> Vocab:
        return self._vocab

    @property
    def grades(self) -> tuple[float, ...]:
        return tuple(float(d) for d in range(self._nv))

    @property
    def num_outputs(self) -> int:
        nv = self._nv
        return {"bipartite": 2, "connected": 2, "triangles": len(TRIANGLE_BUCKETS),
                "max_degree": nv, "edges": nv * (nv - 1) // 2 + 1}[self.target]

    @property
    def max_len(self) -> int:
        return 1 + self.max_vertices * (self.max_vertices - 1)  # n=K and 2 tokens per edge

    def families(self) -> tuple[str, ...]:
        return FAMILIES

    def info(self) -> dict[str, Any]:
        return {**super().info(), "families": self.families()}

    # ---- graphs and their tokens -----------------------------------------------------------
    def invariant(self, adj: np.ndarray) -> int:
        """The class of ``adj`` for this task's ``target``."""
        if self.target == "bipartite":
            return int(is_bipartite(adj))
        if self.target == "connected":
            return int(is_connected(adj))
        if self.target == "triangles":
            return triangle_bucket(count_triangles(adj))
        if self.target == "max_degree":
            return int(adj.sum(1).max())
        return int(adj.sum()) // 2

    def sample_graph(self, family: str, n: int, rng: random.Random) -> np.ndarray:
        """One graph of ``family`` on n vertices, renumbered by a uniform permutation."""
        edges = family_edges(family, n, rng, edge_prob=self.edge_prob, degree=self.degree)
        return permuted(adjacency_from_edges(n, edges), rng)

    def format_graph(self, adj: np.ndarray) -> list[str]:
        """The tokens of one graph: ``n=K`` then its edge list."""
        n = adj.shape[0]
        return [f"n={n}", *EdgeListCodec(n).encode(adj)]

    def grade_tokens(self, tokens: str | Sequence[str]) -> list[int]:
        """0 for ``n=K``, then the degree of the vertex each token names, as the datasets
        grade a graph: its number of occurrences in the edge list (the degree when no edge is
        repeated); 0 for ``<pad>``, as the datasets pad ``token_grades``. A vertex's degree
        depends on later edges, so the grades are not causal."""
        toks = self._tokens(tokens)
        if not toks or not toks[0].startswith("n="):
            raise ValueError(f"a graph prompt starts with its vertex count n=K, got "
                             f"{' '.join(toks)!r}")
        if any(t.startswith("n=") for t in toks[1:]):
            raise ValueError(f"a graph prompt has one n=K token, first; got {' '.join(toks)!r}")
        counts = Counter(toks[1:])
        return [0, *(0 if t == self.vocab.pad else counts[t] for t in toks[1:])]

    def graphs(self, data: TaskDataset) -> list[np.ndarray]:
        """The adjacency matrices of a dataset, decoded from its tokens."""
        out = []
        for row in data.inputs:
            tokens = self.vocab.decode(row)
            n = int(tokens[0].removeprefix("n="))
            out.append(EdgeListCodec(n).decode(tokens[1:]))
        return out

    def encode_graphs(self, graphs: list[np.ndarray]) -> TaskDataset:
        """A dataset of the given adjacency matrices (no ``family`` tensor), e.g. to ask a
        trained model about graphs of one's own. Each graph is an n x n symmetric 0/1 matrix
        (NumPy, torch or nested lists) with ``MIN_VERTICES`` <= n <= ``vocab_vertices``
        (default ``max_vertices``), the vertex counts the vocabulary has tokens for. Rows are
        padded to ``max_len``, or to the longest edge list when a graph above ``max_vertices``
        (a size split's train side asked about larger graphs) has more edges than that."""
        adjs = []
        for i, g in enumerate(graphs):
            try:
                adj = as_adjacency(g)
            except (TypeError, ValueError) as err:
                raise type(err)(f"graph {i}: {err}") from None
            if not MIN_VERTICES <= adj.shape[0] <= self._nv:
                raise ValueError(f"graph {i} has {adj.shape[0]} vertices; this task's vocabulary "
                                 f"has tokens for {MIN_VERTICES}..{self._nv} (vocab_vertices)")
            adjs.append(adj)
        return TaskDataset(self._encode(adjs), task=self.name, kind=self.kind,
                           info=self.info())

    def _encode(self, graphs: list[np.ndarray]) -> dict[str, Tensor]:
        seqs, grades = [], []
        for adj in graphs:
            tokens = self.format_graph(adj)
            degrees = adj.sum(1)
            seqs.append(self.vocab.encode(tokens))
            grades.append([0, *(int(degrees[int(t) - 1]) for t in tokens[1:])])
        width = max([self.max_len, *map(len, seqs)])  # max_len unless encode_graphs exceeds it
        ids = pad_sequences(seqs, width, self.vocab.pad_id)
        return {
            "inputs": ids,
            "targets": torch.tensor([self.invariant(adj) for adj in graphs], dtype=torch.long),
            "key_padding_mask": ids == self.vocab.pad_id,
            "token_grades": pad_sequences(grades, width, 0),
        }

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        rng = random.Random(seed)
        graphs, families = [], []
        for _ in range(n):
            family = rng.choice(self.graph_families)
            size = rng.randint(self.min_vertices, self.max_vertices)
            graphs.append(self.sample_graph(family, size, rng))
            families.append(FAMILIES.index(family))
        return {**self._encode(graphs), "family": torch.tensor(families, dtype=torch.long)}

    # ---- splits ----------------------------------------------------------------------------
    def size_configs(self) -> tuple[GraphProperties, GraphProperties]:
        """Train on [min_vertices, mid] vertices, test on (mid, max_vertices]; one vocabulary."""
        if self.max_vertices <= self.min_vertices:
            raise ValueError("a size split needs max_vertices > min_vertices, got "
                             f"{self.min_vertices}..{self.max_vertices}")
        mid = (self.min_vertices + self.max_vertices) // 2
        return (dataclasses.replace(self, max_vertices=mid, vocab_vertices=self._nv),
                dataclasses.replace(self, min_vertices=mid + 1, vocab_vertices=self._nv))

    def family_configs(self) -> tuple[GraphProperties, GraphProperties]:
        """Train on ``graph_families`` minus ``test_families``, test on ``test_families``."""
        outside = [f for f in self.test_families if f not in self.graph_families]
        if outside:
            raise ValueError(f"test_families {outside} are not among graph_families "
                             f"{self.graph_families}")
        train = tuple(f for f in self.graph_families if f not in self.test_families)
        if not train:
            raise ValueError(f"a family split needs a training family, but test_families "
                             f"{self.test_families} hold out all of {self.graph_families}")
        return (dataclasses.replace(self, graph_families=train),
                dataclasses.replace(self, graph_families=self.test_families))

    def canonicalize(self, data: TaskDataset) -> TaskDataset:
        """Every graph replaced by its canonical form (003 §3.1 "uniqueness")."""
        return data.replace(**self._encode([canonical_graph(g) for g in self.graphs(data)]))

    def relabel(self, data: TaskDataset, seed: int) -> TaskDataset:
        """Every graph renumbered by a fresh uniform permutation; targets recomputed (they are
        isomorphism invariants, so they come out unchanged)."""
        seed = check_seed(seed)
        rng = random.Random(seed)
        return data.replace(**self._encode([permuted(g, rng) for g in self.graphs(data)]))
