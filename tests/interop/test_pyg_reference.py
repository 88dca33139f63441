"""GAT and GATv2 against PyTorch Geometric's GATConv / GATv2Conv with the same weights."""

from __future__ import annotations

import pytest
import torch

pyg = pytest.importorskip("torch_geometric.nn")

from graded.nn.graph import GATLayer, GATv2Layer  # noqa: E402


def _graph(n: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    adj = torch.rand(n, n, generator=g) < 0.4
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    i, j = adj.nonzero(as_tuple=True)  # node i attends to neighbour j: messages j -> i
    return x, adj, torch.stack([j, i])


@pytest.mark.parametrize("concat", [True, False])
def test_gat_equals_pyg_gatconv(concat):
    torch.manual_seed(0)
    ref = pyg.GATConv(5, 4, heads=3, concat=concat, negative_slope=0.2).double()
    ours = GATLayer(5, 4, heads=3, concat=concat, negative_slope=0.2).double()
    with torch.no_grad():
        ref.bias.normal_()
        ours.lin.weight.copy_(ref.lin.weight)
        ours.att_src.copy_(ref.att_src[0])
        ours.att_dst.copy_(ref.att_dst[0])
        ours.bias.copy_(ref.bias)
    x, adj, edge_index = _graph()
    assert torch.allclose(ours(x, adj), ref(x, edge_index), atol=1e-12, rtol=0)


@pytest.mark.parametrize("share_weights", [False, True])
def test_gatv2_equals_pyg_gatv2conv(share_weights):
    torch.manual_seed(0)
    ref = pyg.GATv2Conv(5, 4, heads=2, share_weights=share_weights).double()
    ours = GATv2Layer(5, 4, heads=2, share_weights=share_weights,
                      projection_bias=True).double()
    with torch.no_grad():
        for p in (ref.lin_l.bias, ref.lin_r.bias, ref.bias):
            p.normal_()
        ours.lin_l.weight.copy_(ref.lin_l.weight)
        ours.lin_l.bias.copy_(ref.lin_l.bias)
        if not share_weights:
            ours.lin_r.weight.copy_(ref.lin_r.weight)
            ours.lin_r.bias.copy_(ref.lin_r.bias)
        ours.att.copy_(ref.att[0])
        ours.bias.copy_(ref.bias)
    x, adj, edge_index = _graph(seed=1)
    assert torch.allclose(ours(x, adj), ref(x, edge_index), atol=1e-12, rtol=0)
