"""GAT and GATv2 (003 §3.6 Eqs 3.1-3.2 and the GATv2 score) against torch_geometric's
``GATConv`` and ``GATv2Conv`` with the same weights, in float64.

``tests/nn/test_graph.py`` checks the layers against a per-node loop; here the reference is a
library: PyG reads an edge list (source j -> target i) where the layers read a dense adjacency
(adj[i, j] != 0: j is a neighbour of i), so the test also pins that convention. Both use the
positive LeakyReLU slope 0.2 (SPEC's decision on 003 Remark 3.7) and add self-loops.
"""

import pytest
import torch

from graded.nn.graph import GATLayer, GATv2Layer

pyg = pytest.importorskip("torch_geometric.nn")

N, F_IN, F_OUT, HEADS = 9, 5, 4, 3


def directed_graph(seed):
    """Node features and a random directed adjacency (no self-loops); node 8 has no
    neighbour, so its N(i) is itself only."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, F_IN, generator=g, dtype=torch.float64)
    adj = (torch.rand(N, N, generator=g) < 0.35) & ~torch.eye(N, dtype=torch.bool)
    adj[N - 1] = False
    return x, adj


def edge_index(adj):
    """PyG's (2, E) edge list, row 0 the message source j, row 1 the target i, for adj[i, j]."""
    i, j = adj.nonzero(as_tuple=True)
    return torch.stack([j, i])


def randomise(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.7)


@pytest.mark.parametrize("concat", [True, False])
def test_gat_equals_torch_geometric_gatconv_003_eq_3_1_3_2(concat):
    """003 Eq 3.1 e_ij = LeakyReLU(a_1ᵀ W h_i + a_2ᵀ W h_j), α_ij = softmax over N(i) ∪ {i},
    Eq 3.2 before σ: h'_i = Σ_j α_ij W h_j, heads concatenated or averaged, plus the bias."""
    x, adj = directed_graph(0)
    layer = GATLayer(F_IN, F_OUT, HEADS, concat=concat).double()
    randomise(layer, 1)
    ref = pyg.GATConv(F_IN, F_OUT, heads=HEADS, concat=concat, negative_slope=0.2).double()
    with torch.no_grad():
        ref.lin.weight.copy_(layer.lin.weight)
        ref.att_dst.copy_(layer.att_dst[None])  # a_1: the query (target) part
        ref.att_src.copy_(layer.att_src[None])  # a_2: the neighbour (source) part
        ref.bias.copy_(layer.bias)
    out, alpha = layer(x, adj, need_weights=True)
    expected, (index, weights) = ref(x, edge_index(adj), return_attention_weights=True)
    torch.testing.assert_close(out, expected)
    dense = torch.zeros(HEADS, N, N, dtype=torch.float64)
    dense[:, index[1], index[0]] = weights.T
    torch.testing.assert_close(alpha, dense)


@pytest.mark.parametrize(("concat", "share_weights"), [(True, False), (False, False),
                                                       (True, True)])
def test_gatv2_equals_torch_geometric_gatv2conv(concat, share_weights):
    """GATv2 (Brody et al. 2022, 003 §3.6): e_ij = aᵀ LeakyReLU(W_r h_i + b_r + W_l h_j + b_l),
    messages W_l h_j + b_l, softmax over N(i) ∪ {i}; PyG's lin_r is the target side, lin_l the
    source side."""
    x, adj = directed_graph(2)
    layer = GATv2Layer(F_IN, F_OUT, HEADS, concat=concat, share_weights=share_weights,
                       projection_bias=True).double()
    randomise(layer, 3)
    ref = pyg.GATv2Conv(F_IN, F_OUT, heads=HEADS, concat=concat, negative_slope=0.2,
                        share_weights=share_weights).double()
    with torch.no_grad():
        for mine, theirs in ((layer.lin_l, ref.lin_l), (layer.lin_r, ref.lin_r)):
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
        ref.att.copy_(layer.att[None])
        ref.bias.copy_(layer.bias)
    out = layer(x, adj)
    torch.testing.assert_close(out, ref(x, edge_index(adj)))
