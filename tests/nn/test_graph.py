"""GAT, GATv2 and centrality-graded graph attention (003 §3.6, 000 §8.9)."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graded.nn.centrality import centrality
from graded.nn.graph import GATLayer, GATv2Layer, GradedGraphAttention


def random_graph(n: int, p: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    upper = torch.triu((torch.rand(n, n, generator=g) < p).float(), 1)
    return upper + upper.T


@torch.no_grad()
def naive_gat(layer, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
    """003 Eq. (3.1)-(3.2) (or GATv2) node by node, neighbour by neighbour, in plain loops."""
    n, heads, fo = x.shape[0], layer.heads, layer.out_features
    slope = layer.negative_slope
    out = []
    for i in range(n):
        nbrs = [j for j in range(n) if adj[i, j] != 0 or (layer.add_self_loops and i == j)]
        head_outs = []
        for h in range(heads):
            rows = slice(h * fo, (h + 1) * fo)
            if isinstance(layer, GATLayer):
                w = layer.lin.weight[rows]
                msg = {j: w @ x[j] for j in nbrs}
                e = {
                    j: F.leaky_relu(
                        layer.att_dst[h] @ (w @ x[i]) + layer.att_src[h] @ msg[j], slope
                    )
                    for j in nbrs
                }
            else:
                wl, wr = layer.lin_l.weight[rows], layer.lin_r.weight[rows]
                msg = {j: wl @ x[j] for j in nbrs}
                e = {j: layer.att[h] @ F.leaky_relu(wr @ x[i] + wl @ x[j], slope) for j in nbrs}
            z = sum(math.exp(float(e[j])) for j in nbrs)
            acc = torch.zeros(fo, dtype=x.dtype)
            for j in nbrs:
                acc = acc + math.exp(float(e[j])) / z * msg[j]
            head_outs.append(acc)
        row = torch.cat(head_outs) if layer.concat else torch.stack(head_outs).mean(0)
        out.append(row + (layer.bias if layer.bias is not None else 0))
    return torch.stack(out)


@pytest.mark.parametrize("layer_cls", [GATLayer, GATv2Layer])
@pytest.mark.parametrize("concat", [True, False])
def test_dense_graph_attention_equals_a_naive_per_node_loop(layer_cls, concat):
    torch.manual_seed(0)
    layer = layer_cls(5, 3, heads=2, concat=concat).double()
    adj = random_graph(7, 0.4, seed=1).double()
    x = torch.randn(7, 5, dtype=torch.float64)
    expected = naive_gat(layer, x, adj)
    torch.testing.assert_close(layer(x, adj), expected)
    # batched input gives the same rows for every graph of the batch
    x2 = torch.randn(7, 5, dtype=torch.float64)
    adj2 = random_graph(7, 0.6, seed=2).double()
    out = layer(torch.stack([x, x2]), torch.stack([adj, adj2]))
    torch.testing.assert_close(out[0], expected)
    torch.testing.assert_close(out[1], naive_gat(layer, x2, adj2))


@pytest.mark.parametrize("layer_cls", [GATLayer, GATv2Layer])
@pytest.mark.parametrize("self_loops", [True, False])
def test_attention_is_zero_outside_neighbours_and_self(layer_cls, self_loops):
    torch.manual_seed(0)
    layer = layer_cls(4, 4, heads=3, add_self_loops=self_loops)
    adj = random_graph(9, 0.3, seed=3)
    adj[0] = adj[:, 0] = 0  # an isolated node
    _, alpha = layer(torch.randn(9, 4), adj, need_weights=True)
    allowed = (adj != 0) | (torch.eye(9, dtype=torch.bool) & self_loops)
    assert alpha.shape == (3, 9, 9)
    assert torch.all(alpha[:, ~allowed] == 0)
    has_nbr = allowed.any(-1)
    torch.testing.assert_close(alpha.sum(-1)[:, has_nbr], torch.ones(3, int(has_nbr.sum())))
    assert not self_loops or bool(has_nbr.all())


@pytest.mark.parametrize("layer_cls", [GATLayer, GATv2Layer])
def test_isolated_node_without_self_loop_gets_zero_message_and_finite_gradients(layer_cls):
    torch.manual_seed(0)
    layer = layer_cls(4, 4, heads=2, add_self_loops=False, bias=False)
    adj = random_graph(6, 0.5, seed=3)
    adj[0] = adj[:, 0] = 0
    out = layer(torch.randn(6, 4), adj)
    assert torch.all(out[0] == 0)
    out.square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_gat_ranks_neighbours_in_the_same_order_for_every_query_node():
    """Static attention (Brody et al. 2022, 003 §3.6): on the complete graph, every row of α
    orders the keys identically, whatever the (random) weights."""
    for seed in range(5):
        torch.manual_seed(seed)
        layer = GATLayer(3, 4, heads=2)
        x = torch.randn(6, 3)
        _, alpha = layer(x, torch.ones(6, 6) - torch.eye(6), need_weights=True)
        ranks = alpha.argsort(dim=-1)  # (H, N, N)
        assert torch.equal(ranks, ranks[:, :1].expand_as(ranks))


def test_gatv2_ranks_neighbours_differently_per_query_on_a_constructed_graph():
    """Constructed weights give e_ij = -(LReLU(x_i - x_j) + LReLU(x_j - x_i)), a decreasing
    function of |x_i - x_j|: each node prefers the neighbours closest to itself (dynamic)."""
    layer = GATv2Layer(1, 2, heads=1)
    with torch.no_grad():
        layer.lin_r.weight.copy_(torch.tensor([[1.0], [-1.0]]))
        layer.lin_l.weight.copy_(torch.tensor([[-1.0], [1.0]]))
        layer.att.copy_(torch.tensor([[-1.0, -1.0]]))
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0]])
    complete = torch.ones(5, 5) - torch.eye(5)
    _, alpha = layer(x, complete, need_weights=True)
    favourite = alpha[0].argmax(-1)
    assert favourite.tolist() == [0, 1, 2, 3, 4]  # each node attends most to itself
    # the ranking of keys differs between query 0 and query 4 (reversed)
    assert alpha[0, 0].argsort().tolist() == alpha[0, 4].argsort().flip(0).tolist()
    static = GATLayer(1, 2)
    _, alpha_static = static(x, complete, need_weights=True)
    assert len(set(alpha_static[0].argmax(-1).tolist())) == 1


def test_layer_rejects_negative_slope_and_mismatched_shapes():
    with pytest.raises(ValueError, match="negative_slope must be >= 0"):
        GATLayer(2, 2, negative_slope=-0.1)
    with pytest.raises(ValueError, match=r"negative_slope must be >= 0.*got nan"):
        GATv2Layer(2, 2, negative_slope=float("nan"))  # NaN < 0 is False: it passed
    layer = GATLayer(2, 2)
    with pytest.raises(ValueError, match="adjacency is for 3 nodes but x has 4"):
        layer(torch.randn(4, 2), torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"\(N, F\) or \(B, N, F\)"):
        layer(torch.randn(4), torch.ones(4, 4))


@pytest.mark.parametrize("layer_cls", [GATLayer, GATv2Layer])
def test_layer_names_a_feature_width_other_than_in_features(layer_cls):
    with pytest.raises(ValueError, match=r"node features have 3 channels, the layer expects "
                                         r"in_features=4"):
        layer_cls(4, 2)(torch.randn(5, 3), torch.ones(5, 5))


def test_graded_graph_attention_names_grades_that_are_not_one_per_node():
    layer = GradedGraphAttention(4, 2)
    with pytest.raises(ValueError, match=r"grades must have shape \(5,\) \(one per node\), "
                                         r"got \(4,\)"):
        layer(torch.randn(5, 4), torch.ones(5, 5), grades=torch.ones(4))
    with pytest.raises(ValueError, match=r"grades must have shape \(5,\) or \(2, 5\) \(one per "
                                         r"node\), got \(3, 5\)"):
        layer(torch.randn(2, 5, 4), torch.ones(5, 5), grades=torch.ones(3, 5))
    # shared (N,) grades on a batch act as the same (B, N) grades on every graph
    x, adj, q = torch.randn(2, 5, 4), (torch.rand(5, 5) < 0.5).float(), torch.rand(5)
    assert torch.allclose(layer(x, adj, grades=q), layer(x, adj, grades=q.expand(2, 5)))


def test_graded_graph_attention_takes_grades_as_a_sequence_and_refuses_non_finite_ones():
    # a list raised AttributeError ('list' object has no attribute 'shape'); a NaN grade made
    # every output NaN
    torch.manual_seed(0)
    layer = GradedGraphAttention(4, 2, base=3.0)
    x, adj = torch.randn(5, 4), random_graph(5, 0.6, seed=11)
    q = [0.0, 1.0, 2.0, 0.5, 1.5]
    # α_ij ∝ λ^{q_j} exp(e_ij): the plain layer's weights re-weighted by hand
    _, alpha = layer.layer(x, adj, need_weights=True)
    expected = alpha * 3.0 ** torch.tensor(q)
    expected = expected / expected.sum(-1, keepdim=True)
    _, got = layer(x, adj, grades=q, need_weights=True)
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="grades must be finite, got nan at index 1"):
        layer(x, adj, grades=torch.tensor([0.0, math.nan, 1.0, 1.0, 1.0]))


# --- centrality -----------------------------------------------------------------------------


def reference_centrality(adj: torch.Tensor, kind: str) -> torch.Tensor:
    """networkx for degree and closeness; a dense eigensolver and a linear solve otherwise."""
    a = adj.numpy()
    n = a.shape[0]
    if kind in ("degree", "closeness"):
        g = nx.from_numpy_array(a)
        values = (nx.degree_centrality if kind == "degree" else nx.closeness_centrality)(g)
        return torch.tensor([values[v] for v in range(n)], dtype=torch.float64)
    if kind == "eigenvector":  # Perron vector of A, unit norm, positive
        _, vecs = np.linalg.eigh(a)
        return torch.tensor(np.abs(vecs[:, -1]))
    # PageRank: x = d Pᵀ x + (1 - d)/N with dangling rows of P uniform, solved exactly
    deg = a.sum(1)
    p = np.where(deg[:, None] > 0, a / np.maximum(deg, 1)[:, None], 1.0 / n)
    x = np.linalg.solve(np.eye(n) - 0.85 * p.T, np.full(n, 0.15 / n))
    return torch.tensor(x)


@pytest.mark.parametrize("kind", ["degree", "closeness", "eigenvector", "pagerank"])
def test_centrality_matches_an_independent_reference(kind):
    adj = random_graph(12, 0.3, seed=4).double()
    if kind != "eigenvector":  # eigenvector centrality needs a connected graph to be unique
        adj[10] = adj[:, 10] = 0
    else:
        for i in range(11):
            adj[i, i + 1] = adj[i + 1, i] = 1
    got = centrality(adj, kind, max_iter=5000, tol=1e-15)
    torch.testing.assert_close(got, reference_centrality(adj, kind), rtol=1e-6, atol=1e-8)
    batched = centrality(torch.stack([adj, adj]), kind, max_iter=5000, tol=1e-15)
    torch.testing.assert_close(batched[1], got)


@pytest.mark.parametrize("kind", ["degree", "closeness"])
def test_centrality_of_a_one_node_graph_is_that_of_networkx(kind):
    # degree gave 0/max(N - 1, 1) = 0 where networkx gives 1
    expected = reference_centrality(torch.zeros(1, 1, dtype=torch.float64), kind)
    torch.testing.assert_close(centrality(torch.zeros(1, 1, dtype=torch.float64), kind), expected)
    torch.testing.assert_close(centrality(torch.zeros(2, 1, 1, dtype=torch.float64), kind),
                               expected.expand(2, 1))


def test_closeness_matches_a_breadth_first_search_loop():
    adj = random_graph(10, 0.25, seed=5)
    n = 10
    expected = []
    for v in range(n):  # plain BFS
        dist = {v: 0}
        queue = [v]
        while queue:
            u = queue.pop(0)
            for w in range(n):
                if adj[u, w] and w not in dist:
                    dist[w] = dist[u] + 1
                    queue.append(w)
        r, total = len(dist), sum(dist.values())
        expected.append(0.0 if total == 0 else (r - 1) / total * (r - 1) / (n - 1))
    torch.testing.assert_close(centrality(adj, "closeness"), torch.tensor(expected))


def directed_graph(n: int, p: float, seed: int) -> torch.Tensor:
    """A random 0/1 adjacency with one-way edges (no self-loops)."""
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(n, n, generator=g) < p) & ~torch.eye(n, dtype=torch.bool)).double()


def first_one_way_entry(adj: torch.Tensor) -> tuple[int, int]:
    """The first (i, j) in row-major order with adj[i, j] != 0 and adj[j, i] == 0: a loop."""
    n = adj.shape[-1]
    return next((i, j) for i in range(n) for j in range(n)
                if i != j and adj[i, j] != 0 and adj[j, i] == 0)


@pytest.mark.parametrize("kind", ["degree", "closeness", "eigenvector", "pagerank"])
def test_centrality_refuses_a_directed_graph_naming_the_first_one_way_entry(kind):
    # the centralities are those of an undirected graph; a directed one was taken silently
    # (degree counted out-edges, networkx's directed degree counts both)
    adj = directed_graph(9, 0.3, seed=12)
    i, j = first_one_way_entry(adj)
    with pytest.raises(ValueError, match=rf"undirected graph \(a symmetric adjacency\), but "
                                         rf"adj\[{i}, {j}\] = 1\.0 is an edge and "
                                         rf"adj\[{j}, {i}\] = 0\.0 is not"):
        centrality(adj, kind)
    symmetric = random_graph(9, 0.3, seed=13).double()
    with pytest.raises(ValueError, match=rf"adj\[1, {i}, {j}\] = 1\.0 is an edge"):
        centrality(torch.stack([symmetric, adj]), kind)  # the graph of the batch is named


@pytest.mark.parametrize("kind", ["degree", "closeness"])
def test_the_symmetrised_directed_graph_has_the_centrality_of_networkx_undirected_graph(kind):
    # the fix the error suggests: networkx's Graph of the same array keeps each edge both ways
    adj = directed_graph(10, 0.25, seed=14)
    undirected = ((adj != 0) | (adj != 0).mT).double()
    torch.testing.assert_close(centrality(undirected, kind), reference_centrality(adj, kind))


@pytest.mark.parametrize("kind", ["degree", "closeness", "eigenvector", "pagerank"])
def test_centrality_ignores_the_weights_of_a_symmetric_pattern(kind):
    # unequal weights both ways are an undirected edge all the same: only adj != 0 counts
    adj = random_graph(8, 0.4, seed=15).double()
    weighted = adj * torch.rand(8, 8, generator=torch.Generator().manual_seed(16)).add(0.5)
    torch.testing.assert_close(centrality(weighted, kind), centrality(adj, kind))


def test_graded_graph_attention_refuses_a_directed_graph_without_grades():
    layer = GradedGraphAttention(4, 2)
    x, adj = torch.randn(9, 4), directed_graph(9, 0.3, seed=12).float()
    with pytest.raises(ValueError, match="undirected graph"):
        layer(x, adj)
    assert layer(x, adj, grades=torch.rand(9)).shape == (9, 2)  # own grades: any graph


# --- graded graph attention -------------------------------------------------------------------


@pytest.mark.parametrize("apply_to", ["logits", "features"])
@pytest.mark.parametrize("version", [1, 2])
def test_graded_graph_attention_with_zero_grades_equals_the_plain_layer(apply_to, version):
    torch.manual_seed(0)
    graded = GradedGraphAttention(
        4, 3, heads=2, grade_scale=0.0, apply_to=apply_to, version=version, centrality="pagerank"
    )
    adj, x = random_graph(8, 0.4, seed=6), torch.randn(8, 4)
    assert torch.equal(graded(x, adj), graded.layer(x, adj))


@pytest.mark.parametrize("grading", ["exponential", "linear"])
def test_graded_logits_reweight_attention_by_the_neighbour_grade(grading):
    """α^graded_ij = w_j α_ij / Σ_k w_k α_ik with w = λ^q (EGT) or 1 + q (LGT)."""
    torch.manual_seed(0)
    graded = GradedGraphAttention(
        4, 3, heads=2, grading=grading, base=3.0, grade_scale=2.0, centrality="degree"
    )
    adj, x = random_graph(8, 0.4, seed=7), torch.randn(8, 4)
    _, alpha = graded.layer(x, adj, need_weights=True)
    deg = adj.sum(-1)
    q = 2.0 * deg / deg.max()
    w = 3.0**q if grading == "exponential" else 1.0 + q
    expected = alpha * w
    expected = expected / expected.sum(-1, keepdim=True)
    _, got = graded(x, adj, need_weights=True)
    torch.testing.assert_close(got, expected)
    assert torch.all(got[:, (adj == 0) & ~torch.eye(8, dtype=torch.bool)] == 0)


def test_graded_features_scale_each_node_by_its_grade_weight():
    torch.manual_seed(0)
    graded = GradedGraphAttention(4, 3, apply_to="features", centrality="closeness", base=2.0)
    adj, x = random_graph(8, 0.4, seed=8), torch.randn(2, 8, 4)
    c = centrality(adj, "closeness")
    scaled = x * (2.0 ** (c / c.max())).unsqueeze(-1)
    torch.testing.assert_close(graded(x, adj), graded.layer(scaled, adj))


def test_learnable_grade_scale_receives_a_gradient():
    graded = GradedGraphAttention(4, 3, learn_scale=True, centrality="eigenvector")
    adj, x = random_graph(8, 0.5, seed=9), torch.randn(8, 4)
    graded(x, adj).square().sum().backward()
    assert graded.grade_scale.grad is not None and graded.grade_scale.grad != 0


# --- node classification ----------------------------------------------------------------------


def stochastic_block_model(sizes, p_in, p_out, feature_noise, seed):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    n = labels.size
    prob = np.where(labels[:, None] == labels[None, :], p_in, p_out)
    upper = np.triu(rng.random((n, n)) < prob, 1)
    adj = (upper | upper.T).astype(np.float32)
    means = rng.normal(size=(len(sizes), 8))
    x = means[labels] + feature_noise * rng.normal(size=(n, 8))
    return torch.tensor(adj), torch.tensor(x, dtype=torch.float32), torch.tensor(labels)


@pytest.mark.parametrize("layer_cls", [GATLayer, GATv2Layer])
def test_two_layer_gat_classifies_a_noisy_stochastic_block_model(layer_cls):
    """Features alone separate the blocks poorly (noise 2 around unit-scale means); averaging
    over neighbours, which are mostly in the same block, recovers the labels."""
    torch.manual_seed(0)
    adj, x, y = stochastic_block_model([40, 40, 40], 0.3, 0.01, feature_noise=2.0, seed=0)
    train = torch.zeros(120, dtype=torch.bool)
    train[torch.randperm(120)[:36]] = True
    first, second = layer_cls(8, 8, heads=4), layer_cls(32, 3, heads=1)
    opt = torch.optim.Adam([*first.parameters(), *second.parameters()], lr=0.01, weight_decay=5e-4)
    for _ in range(60):
        logits = second(F.elu(first(x, adj)), adj)
        loss = F.cross_entropy(logits[train], y[train])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = second(F.elu(first(x, adj)), adj).argmax(-1)
    accuracy = (pred[~train] == y[~train]).float().mean().item()
    assert accuracy >= 0.9, accuracy


def test_node_classification_example_runs(capsys, monkeypatch):
    import runpy
    import sys
    from pathlib import Path

    script = Path(__file__).parents[2] / "examples" / "gat_node_classification.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--model", "gat", "--epochs", "2"])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "features only" in out and "gat: test accuracy" in out


def test_gatv2_projection_biases_enter_logits_and_messages_as_written():
    import torch.nn.functional as F

    from graded.nn.graph import GATv2Layer

    torch.manual_seed(0)
    layer = GATv2Layer(3, 2, heads=1, projection_bias=True, add_self_loops=False,
                       bias=False).double()
    with torch.no_grad():
        layer.lin_l.bias.normal_()
        layer.lin_r.bias.normal_()
    x = torch.randn(4, 3, dtype=torch.float64)
    adj = torch.ones(4, 4, dtype=torch.bool)
    wl, bl = layer.lin_l.weight, layer.lin_l.bias
    wr, br = layer.lin_r.weight, layer.lin_r.bias
    a = layer.att[0]
    out = torch.zeros(4, 2, dtype=torch.float64)
    for i in range(4):  # naive loop over nodes and neighbours
        e = torch.stack([a @ F.leaky_relu(wr @ x[i] + br + wl @ x[j] + bl, 0.2)
                         for j in range(4)])
        alpha = torch.softmax(e, 0)
        out[i] = sum(alpha[j] * (wl @ x[j] + bl) for j in range(4))
    assert torch.allclose(layer(x, adj), out, atol=1e-12)


@pytest.mark.parametrize("damping", [-0.1, 1.5])
def test_pagerank_refuses_a_damping_factor_outside_0_1(damping):
    with pytest.raises(ValueError, match=rf"damping factor in \[0, 1\], got {damping}"):
        centrality(torch.ones(3, 3), "pagerank", damping=damping)


@pytest.mark.parametrize("layer_cls", [GATLayer, GATv2Layer])
def test_layers_built_in_float64_hold_float64_parameters_and_equal_the_loop(layer_cls):
    # torch.nn's factory arguments: every parameter and buffer in the dtype asked for, and the
    # layer equal to the node-by-node loop in that dtype
    torch.manual_seed(0)
    layer = layer_cls(3, 2, heads=2, dtype=torch.float64, device="cpu")
    assert {p.dtype for p in layer.parameters()} == {torch.float64}
    x, adj = torch.randn(5, 3, dtype=torch.float64), random_graph(5, 0.5, seed=3)
    torch.testing.assert_close(layer(x, adj), naive_gat(layer, x, adj), rtol=1e-12, atol=1e-12)
    graded = GradedGraphAttention(3, 2, heads=2, version=1 if layer_cls is GATLayer else 2,
                                  learn_scale=True, dtype=torch.float64)
    assert {t.dtype for t in [*graded.parameters(), *graded.buffers()]} == {torch.float64}
    assert graded(x, adj).dtype == torch.float64


@pytest.mark.parametrize("kind", ["degree", "closeness", "eigenvector", "pagerank"])
def test_a_graph_with_no_nodes_has_no_centralities_and_graded_attention_returns_no_rows(kind):
    # PageRank's start 1/N raised ZeroDivisionError and the graded layer's max_k c_k raised
    # IndexError for N = 0, where the plain layers return an empty (B?, 0, H·F') result
    assert centrality(torch.zeros(0, 0), kind).shape == (0,)
    assert centrality(torch.zeros(2, 0, 0), kind).shape == (2, 0)
    layer = GradedGraphAttention(4, 3, heads=2, centrality=kind)
    for x, adj in ((torch.zeros(0, 4), torch.zeros(0, 0)),
                   (torch.zeros(2, 0, 4), torch.zeros(2, 0, 0))):
        assert layer(x, adj).shape == layer.layer(x, adj).shape == (*x.shape[:-1], 6)
    with pytest.raises(ValueError, match="unknown centrality 'betweenness'"):
        centrality(torch.zeros(0, 0), "betweenness")  # the kind is checked for N = 0 too


@pytest.mark.parametrize("apply_to", ["logits", "features"])
def test_graded_attention_keeps_the_plain_layers_shapes_for_one_graph_with_a_batched_adjacency(
        apply_to):
    # features (N, F) with an adjacency (1, N, N): the plain layer returns (N, H·F'); the
    # feature grading returned (1, N, H·F'), and with an adjacency (2, N, N) it scaled x into
    # two graphs where the plain layer refuses the batch mismatch
    torch.manual_seed(0)
    layer = GradedGraphAttention(4, 3, heads=2, apply_to=apply_to)
    x, adj = torch.randn(5, 4), random_graph(5, 0.6, seed=1)
    expected = layer(x, adj)
    got = layer(x, adj.unsqueeze(0))
    assert got.shape == layer.layer(x, adj.unsqueeze(0)).shape == (5, 6)
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="adjacency batch 2 does not match features batch 1"):
        layer(x, torch.stack([adj, adj]))


@pytest.mark.parametrize("kind", ["degree", "eigenvector", "pagerank"])
def test_graded_attention_in_float64_passes_gradcheck_in_its_grade_scale_with_a_bool_graph(kind):
    # a bool adjacency gave float32 centralities, and s·c with a 0-d float64 s stays float32:
    # a float64 layer had float32 grades, and finite differences in s disagreed with autograd
    torch.manual_seed(0)
    layer = GradedGraphAttention(4, 3, heads=2, centrality=kind, learn_scale=True,
                                 dtype=torch.float64)
    adj = random_graph(6, 0.5, seed=2).bool()
    x = torch.randn(6, 4, dtype=torch.float64)
    assert layer.node_grades(adj).dtype == torch.float64

    def run(scale):
        return torch.func.functional_call(layer, {"grade_scale": scale}, (x, adj))

    assert torch.autograd.gradcheck(run, (layer.grade_scale.detach().clone().requires_grad_(),))
    assert centrality(adj, kind, dtype=torch.float64).dtype == torch.float64
    with pytest.raises(TypeError, match=r"floating-point dtype, got dtype=torch\.int64"):
        centrality(adj, kind, dtype=torch.int64)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), "1.0", None])
def test_graded_graph_attention_refuses_a_grade_scale_that_is_not_a_finite_number(bad):
    # a NaN scale was accepted and gave NaN features for every node
    with pytest.raises(ValueError, match=r"grade_scale must be a finite number, got "):
        GradedGraphAttention(4, 3, grade_scale=bad)
    assert float(GradedGraphAttention(4, 3, grade_scale=torch.tensor(0.5)).grade_scale) == 0.5
