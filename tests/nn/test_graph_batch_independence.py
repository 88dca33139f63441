"""A graph's centralities (and the grades and outputs of graded graph attention built on them)
do not depend on the other graphs of its batch: computed in a batch of different graphs they
equal, bit for bit, the values of the graph alone.

Before, the power iterations of eigenvector centrality and PageRank stopped every graph of a
batch at the step where the sum of all the graphs' changes fell below the tolerance, and the
matrix-vector products of a batch split each graph's sums differently from those of the graph
alone: a node's centrality moved by about 3·10⁻⁸ with its batch.
"""

from __future__ import annotations

import pytest
import torch

from graded.nn.centrality import CENTRALITIES, centrality
from graded.nn.graph import GradedGraphAttention


def random_graph(n: int, p: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    upper = torch.triu((torch.rand(n, n, generator=g) < p).float(), 1)
    return upper + upper.T


def different_graphs(n: int) -> list[torch.Tensor]:
    """Sparse to dense random graphs, a path and a graph with an isolated node: their power
    iterations converge after different numbers of steps."""
    graphs = [random_graph(n, p, seed) for seed, p in enumerate((0.15, 0.3, 0.5, 0.8))]
    path = torch.zeros(n, n)
    i = torch.arange(n - 1)
    path[i, i + 1] = path[i + 1, i] = 1.0
    lonely = random_graph(n, 0.4, seed=9)
    lonely[3] = lonely[:, 3] = 0.0
    return [*graphs, path, lonely]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [12, 40])
@pytest.mark.parametrize("kind", CENTRALITIES)
def test_a_graphs_centrality_in_a_batch_equals_its_centrality_alone(kind, n, dtype):
    graphs = different_graphs(n)
    batched = centrality(torch.stack(graphs), kind, dtype=dtype)
    for i, adj in enumerate(graphs):
        alone = centrality(adj, kind, dtype=dtype)
        assert torch.equal(batched[i], alone), (i, (batched[i] - alone).abs().max().item())
        # a batch of one, and the same graph in a batch in another order, agree too
        assert torch.equal(centrality(adj.unsqueeze(0), kind, dtype=dtype)[0], alone)
    reversed_batch = centrality(torch.stack(graphs[::-1]), kind, dtype=dtype)
    assert torch.equal(reversed_batch.flip(0), batched)


@pytest.mark.parametrize("kind", CENTRALITIES)
def test_graded_graph_attention_of_a_batch_equals_each_graph_alone(kind):
    torch.manual_seed(0)
    n = 12
    graphs = different_graphs(n)
    layer = GradedGraphAttention(5, 4, heads=2, centrality=kind)
    x = torch.randn(len(graphs), n, 5)
    batch_adj = torch.stack(graphs)
    grades = layer.node_grades(batch_adj)
    for i, adj in enumerate(graphs):
        assert torch.equal(grades[i], layer.node_grades(adj))
    out = layer(x, batch_adj)
    for i, adj in enumerate(graphs):
        torch.testing.assert_close(out[i], layer(x[i], adj), rtol=1e-6, atol=1e-6)
