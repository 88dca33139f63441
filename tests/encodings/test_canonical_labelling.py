"""Canonical labelling: certificates are equal exactly for isomorphic graphs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.encodings import (
    MAX_CANONICAL_VERTICES,
    UpperTriangleCodec,
    adjacency_from_edges,
    canonical_certificate,
    canonical_graph,
    canonical_order,
)

# OEIS A000088: number of graphs on n unlabelled vertices.
A000088 = [1, 1, 2, 4, 11, 34, 156, 1044]


def random_graph(n: int, bits: list[int]) -> np.ndarray:
    adj = np.zeros((n, n), dtype=np.int64)
    adj[np.triu_indices(n, 1)] = bits
    return adj + adj.T


def brute_force_isomorphic(a: np.ndarray, b: np.ndarray) -> bool:
    """Try every bijection of the vertices (independent of the search-tree code)."""
    n = a.shape[0]
    if b.shape[0] != n or a.sum() != b.sum():
        return False
    return any(
        all(a[i, j] == b[p[i], p[j]] for i in range(n) for j in range(i + 1, n))
        for p in itertools.permutations(range(n))
    )


@st.composite
def small_graph(draw, min_n=0, max_n=6):
    n = draw(st.integers(min_n, max_n))
    m = n * (n - 1) // 2
    return random_graph(n, draw(st.lists(st.integers(0, 1), min_size=m, max_size=m)))


@settings(max_examples=80, deadline=None)
@given(small_graph(), st.data())
def test_certificate_is_invariant_under_every_relabelling(adj, data):
    n = adj.shape[0]
    perm = data.draw(st.permutations(range(n)))
    relabelled = adj[np.ix_(perm, perm)]
    assert canonical_certificate(relabelled) == canonical_certificate(adj)
    assert np.array_equal(canonical_graph(relabelled), canonical_graph(adj))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 6), st.data())
def test_certificates_agree_exactly_when_brute_force_finds_an_isomorphism(n, data):
    m = n * (n - 1) // 2
    edges = data.draw(st.integers(0, m))  # same edge count makes the question non-trivial
    bits = st.permutations([1] * edges + [0] * (m - edges))
    a, b = random_graph(n, data.draw(bits)), random_graph(n, data.draw(bits))
    same = canonical_certificate(a) == canonical_certificate(b)
    assert same == brute_force_isomorphic(a, b)


@settings(max_examples=40, deadline=None)
@given(small_graph(max_n=9))
def test_canonical_graph_is_the_input_relabelled_by_canonical_order(adj):
    order = canonical_order(adj)
    assert sorted(order) == list(range(adj.shape[0]))
    assert np.array_equal(canonical_graph(adj), adj[np.ix_(order, order)])
    n = adj.shape[0]
    assert canonical_certificate(adj) == f"{n}:" + "".join(
        UpperTriangleCodec(n).encode(canonical_graph(adj))
    )


@pytest.mark.parametrize("n", range(6))
def test_number_of_distinct_certificates_is_the_number_of_graphs_oeis_a000088(n):
    m = n * (n - 1) // 2
    certs = {
        canonical_certificate(random_graph(n, list(bits)))
        for bits in itertools.product([0, 1], repeat=m)
    }
    assert len(certs) == A000088[n]


@pytest.mark.slow
def test_number_of_distinct_certificates_on_six_vertices_is_oeis_a000088():
    for n in (6,):
        m = n * (n - 1) // 2
        certs = {
            canonical_certificate(random_graph(n, list(bits)))
            for bits in itertools.product([0, 1], repeat=m)
        }
        assert len(certs) == A000088[n]


def test_symmetric_graphs_on_twenty_vertices_have_relabelling_invariant_certificates():
    """Highly symmetric graphs are the hard case for the search tree (automorphism pruning)."""
    n = 20
    rng = np.random.default_rng(0)
    bipartite = np.zeros((n, n), dtype=np.int64)
    bipartite[:10, 10:] = bipartite[10:, :10] = 1
    cycle = adjacency_from_edges(n, [(i, (i + 1) % n) for i in range(n)])
    for adj in (np.zeros((n, n), dtype=np.int64), 1 - np.eye(n, dtype=np.int64), bipartite, cycle):
        perm = rng.permutation(n)
        assert canonical_certificate(adj[np.ix_(perm, perm)]) == canonical_certificate(adj)
    two_triangles = adjacency_from_edges(6, [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)])
    hexagon = adjacency_from_edges(6, [(i, (i + 1) % 6) for i in range(6)])
    assert canonical_certificate(two_triangles) != canonical_certificate(hexagon)


def test_canonical_labelling_refuses_graphs_above_the_vertex_limit():
    n = MAX_CANONICAL_VERTICES + 1
    with pytest.raises(ValueError, match=f"limited to {MAX_CANONICAL_VERTICES} vertices"):
        canonical_certificate(np.zeros((n, n), dtype=np.int64))


def test_cospectral_strongly_regular_pair_is_told_apart_and_each_is_relabelling_invariant():
    """The 4x4 rook's graph and the Shrikhande graph are both srg(16, 6, 2, 2): colour refinement
    cannot split either, so only the search tree separates them. They are not isomorphic: the
    neighbourhood of a vertex is two disjoint triangles in the rook's graph and a 6-cycle in the
    Shrikhande graph."""
    rook = adjacency_from_edges(16, [(a, b) for a in range(16) for b in range(a + 1, 16)
                                     if (a // 4 == b // 4) != (a % 4 == b % 4)])
    steps = {(0, 1), (0, 3), (1, 0), (3, 0), (1, 1), (3, 3)}
    shrikhande = adjacency_from_edges(16, [
        (a, b) for a in range(16) for b in range(a + 1, 16)
        if ((a // 4 - b // 4) % 4, (a % 4 - b % 4) % 4) in steps])
    for adj in (rook, shrikhande):  # both srg(16, 6, 2, 2)
        assert set(adj.sum(1).tolist()) == {6}
        common = adj @ adj
        assert {int(common[i, j]) for i in range(16) for j in range(16) if i != j} == {2}
    # neighbourhoods: the rook's has 6 edges in two triangles, the Shrikhande's a 6-cycle
    nbhd = [adj[np.ix_(np.flatnonzero(adj[0]), np.flatnonzero(adj[0]))] for adj in
            (rook, shrikhande)]
    assert [int(m.sum()) // 2 for m in nbhd] == [6, 6]
    assert int(np.trace(np.linalg.matrix_power(nbhd[0], 3))) // 6 == 2
    assert int(np.trace(np.linalg.matrix_power(nbhd[1], 3))) // 6 == 0
    assert canonical_certificate(rook) != canonical_certificate(shrikhande)
    rng = np.random.default_rng(1)
    for adj in (rook, shrikhande):
        for _ in range(5):
            perm = rng.permutation(16)
            assert canonical_certificate(adj[np.ix_(perm, perm)]) == canonical_certificate(adj)


def test_certificates_agree_exactly_when_networkx_finds_an_isomorphism_on_regular_graphs():
    # beyond brute force (n <= 6): regular graphs on 8-10 vertices, where colour refinement
    # alone separates nothing and the search tree does the work; plus shuffled copies
    import random

    import networkx as nx

    rng = random.Random(0)
    graphs = [nx.random_regular_graph(d, n, seed=rng.randrange(10**6))
              for n, d in [(8, 3), (10, 3), (10, 4)] for _ in range(12)]
    graphs += [nx.petersen_graph(), nx.circular_ladder_graph(5), nx.moebius_kantor_graph()]
    certs = []
    for g in graphs:
        adj = nx.to_numpy_array(g, dtype=np.int64)
        perm = rng.sample(range(len(adj)), len(adj))
        assert canonical_certificate(adj[np.ix_(perm, perm)]) == canonical_certificate(adj)
        certs.append(canonical_certificate(adj))
    for (g, a), (h, b) in itertools.combinations(zip(graphs, certs), 2):
        if (g.number_of_nodes(), g.number_of_edges()) == (h.number_of_nodes(),
                                                          h.number_of_edges()):
            assert (a == b) == nx.is_isomorphic(g, h)
