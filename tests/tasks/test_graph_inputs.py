"""Graph labels against networkx: generated graphs of every family for every target, and
``GraphProperties.encode_graphs`` on one's own graphs, in any adjacency format that
``graded.encodings.as_adjacency`` accepts; a graph the vocabulary cannot write is refused
naming its vertex count and the range allowed."""

import networkx as nx
import numpy as np
import pytest
import torch

from graded.tasks import get_task


@pytest.mark.parametrize("target", ["bipartite", "connected", "max_degree", "edges"])
def test_graphs_given_as_lists_arrays_or_tensors_get_the_networkx_label(target):
    task = get_task("graph_properties", target=target)
    graphs = [nx.petersen_graph(), nx.path_graph(4), nx.cycle_graph(7),
              nx.disjoint_union(nx.complete_graph(3), nx.empty_graph(2))]
    expected = {
        "bipartite": [int(nx.is_bipartite(g)) for g in graphs],
        "connected": [int(nx.is_connected(g)) for g in graphs],
        "max_degree": [max(d for _, d in g.degree()) for g in graphs],
        "edges": [g.number_of_edges() for g in graphs],
    }[target]
    arrays = [nx.to_numpy_array(g, dtype=np.int64) for g in graphs]
    for form in (arrays, [a.tolist() for a in arrays], [torch.from_numpy(a) for a in arrays]):
        assert task.encode_graphs(form).targets.tolist() == expected


@pytest.mark.parametrize("n", [2, 11])
def test_a_graph_outside_the_vocabularys_vertex_counts_is_refused_naming_them(n):
    task = get_task("graph_properties", max_vertices=10)
    with pytest.raises(ValueError, match=rf"graph 1 has {n} vertices; .* tokens for 3\.\.10"):
        task.encode_graphs([np.zeros((4, 4), dtype=np.int64), np.zeros((n, n), dtype=np.int64)])
    with pytest.raises(ValueError, match=r"graph 0: adjacency matrix is not symmetric"):
        task.encode_graphs([np.triu(np.ones((5, 5), dtype=np.int64), 1)])


def networkx_target(target: str, g: nx.Graph) -> int:
    if target == "triangles":  # buckets 0, 1, 2-3, 4-7, 8+
        count = sum(nx.triangles(g).values()) // 3
        return 0 if count == 0 else min(4, count.bit_length())
    return {"bipartite": lambda: int(nx.is_bipartite(g)),
            "connected": lambda: int(nx.is_connected(g)),
            "max_degree": lambda: max(d for _, d in g.degree()),
            "edges": g.number_of_edges}[target]()


@pytest.mark.parametrize("target", ["bipartite", "connected", "triangles", "max_degree", "edges"])
def test_generated_graphs_of_every_family_carry_the_networkx_label(target):
    task = get_task("graph_properties", target=target, min_vertices=3, max_vertices=9,
                    edge_prob=0.5)
    data = task.generate(150, seed=3)
    graphs = [nx.from_numpy_array(a) for a in task.graphs(data)]
    assert data.targets.tolist() == [networkx_target(target, g) for g in graphs]
    assert set(data.tensors["family"].tolist()) == set(range(len(task.families())))


def test_a_graph_above_max_vertices_that_the_vocabulary_writes_is_encoded_whole():
    # vocab_vertices=8 gives tokens for 8 vertices, but max_len (21) is that of 5: K8 has 28
    # edges, 57 tokens; the row grows to hold them rather than the encoding failing
    task = get_task("graph_properties", target="edges", max_vertices=5, vocab_vertices=8)
    graphs = [nx.complete_graph(8), nx.cycle_graph(4)]
    data = task.encode_graphs([nx.to_numpy_array(g, dtype=np.int64) for g in graphs])
    assert data.targets.tolist() == [g.number_of_edges() for g in graphs]
    assert data.inputs.shape == (2, 1 + 2 * 28)
    assert (~data.tensors["key_padding_mask"]).sum(1).tolist() == [57, 9]
    decoded = [nx.from_numpy_array(a) for a in task.graphs(data)]
    assert [sorted(g.edges()) for g in decoded] == [sorted(g.edges()) for g in graphs]
    assert data.tensors["token_grades"][0, 1:57].tolist() == [7] * 56  # every degree is 7
    assert task.generate(4, seed=0).inputs.shape == (4, task.max_len)  # generated rows unchanged
