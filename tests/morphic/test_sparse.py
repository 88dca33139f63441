"""Sparse execution of routed morphic layers (each block runs on its routed rows only), and
top-k hard routing, whose sparse cost grows with the selected edges."""

import copy

import pytest
import torch

from graded.morphic import (
    ArgmaxDecoder,
    EdgeSet,
    ExternalTool,
    FFNBlock,
    FixedLinearBlock,
    GradedStateSpace,
    GradeTypedAttention,
    LinearBlock,
    MorphicConfig,
    MorphicLayer,
    OneHotEncoder,
    Router,
    UtilityProbe,
    apply_update,
)

PAIRS = [("a", "a", "aa"), ("a", "b", "ab"), ("b", "b", "bb"), ("c", "b", "cb"),
         ("b", "c", "bc"), ("a", "c", "ac"), ("c", "c", "cc")]


def make_layer(normalization: str, update: str = "gated_replace", mode: str = "hard", *,
               execution: str = "dense", pre_norm: str | None = None,
               top_k: int = 1) -> MorphicLayer:
    torch.manual_seed(0)
    space = GradedStateSpace({"a": 4, "b": 3, "c": 5})
    edges = EdgeSet.explicit(space, PAIRS)
    blocks = [LinearBlock(4, 4), FFNBlock(4, 3, 6), LinearBlock(3, 3, bias=True),
              GradeTypedAttention(5, 3, num_heads=2, head_dim=4), FFNBlock(3, 5, 7),
              LinearBlock(4, 5), FixedLinearBlock(torch.randn(5, 5))]
    layer = MorphicLayer(space, edges, blocks, update=update, pre_norm=pre_norm,
                         execution=execution,
                         router={"normalization": normalization, "mode": mode, "rank": 4,
                                 "init_std": 1.0, "top_k": top_k})
    return layer.double()


def sparse_twin(layer: MorphicLayer) -> MorphicLayer:
    twin = copy.deepcopy(layer)
    twin.execution = "sparse"
    return twin


def cases() -> list[tuple[str, str]]:
    modes = ["gated_replace", "residual_typed", "convex_identity", "eta_step", "simplex_dest",
             "routed_LN"]
    out = [(n, u) for n in ("global", "dest", "logistic") for u in modes
           if u != "convex_identity" or n == "global"]  # the layer refuses the others
    return [*out, ("global", "sample_one")]


def step(layer: MorphicLayer, z: torch.Tensor, w: torch.Tensor, **kw):
    z = z.clone().requires_grad_(True)
    layer.zero_grad()
    out, tr = layer(z, **kw)
    (out * w).sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    return out.detach(), z.grad.clone(), grads, tr


def masked_dense_reference(layer: MorphicLayer, z: torch.Tensor, w: torch.Tensor):
    """The independent computation sparse execution must equal: every φ_e on every token,
    zeroed where the routed α_e = 0, mixed by the layer's update with the same α. Returns the
    output, ∂/∂z and the parameter gradients of (out · w).sum()."""
    zz = z.clone().requires_grad_(True)
    layer.zero_grad()
    alpha = layer.router.route(layer.router.context_logits(zz)).weights
    keep = alpha.detach() != 0
    cands = [c * keep[..., i : i + 1] for i, c in enumerate(layer.candidates(zz))]
    ref = apply_update(layer.update, zz, cands, alpha, layer.edges, layer.space,
                       norm=layer.norm, eta=layer.eta)
    (ref * w).sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    return ref.detach(), zz.grad.clone(), grads


@pytest.mark.parametrize("normalization,update", cases())
def test_sparse_equals_dense_outputs_and_gradients_when_routing_has_no_pathwise_gradient(
        normalization, update):
    # REINFORCE samples: α is an exact 0/1 selection without gradient, as at evaluation
    dense = make_layer(normalization, update, "reinforce", pre_norm="layer")
    sparse = sparse_twin(dense)
    z, w = torch.randn(2, 6, 12, dtype=torch.float64), torch.randn(2, 6, 12, dtype=torch.float64)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    out_d, dz_d, gr_d, tr_d = step(dense, z, w, stochastic=True, generator=g1)
    out_s, dz_s, gr_s, tr_s = step(sparse, z, w, stochastic=True, generator=g2)
    assert tr_d.execution == "dense" and tr_s.execution == "sparse"
    torch.testing.assert_close(tr_s.alpha, tr_d.alpha, atol=0, rtol=0)
    torch.testing.assert_close(out_s, out_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(dz_s, dz_d, atol=1e-6, rtol=0)
    assert gr_s.keys() <= gr_d.keys() and any(n.startswith("blocks.") for n in gr_s)
    for name, grad in gr_d.items():  # a block routed no token gets no gradient: zero
        torch.testing.assert_close(gr_s.get(name, torch.zeros_like(grad)), grad, atol=1e-6,
                                   rtol=0, msg=name)


@pytest.mark.parametrize("normalization", ["global", "dest", "logistic"])
def test_sparse_straight_through_gradient_is_dense_with_unselected_candidates_dropped(
        normalization):
    layer = make_layer(normalization, "gated_replace", "hard", execution="sparse")
    z, w = torch.randn(2, 6, 12, dtype=torch.float64), torch.randn(2, 6, 12, dtype=torch.float64)
    out_s, dz_s, gr_s, tr = step(layer, z, w)
    assert tr.execution == "sparse"
    ref, dz_ref, gr_ref = masked_dense_reference(layer, z, w)
    torch.testing.assert_close(out_s, ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(dz_s, dz_ref, atol=1e-6, rtol=0)
    for name, grad in gr_ref.items():
        torch.testing.assert_close(gr_s.get(name, torch.zeros_like(grad)), grad, atol=1e-6,
                                   rtol=0, msg=name)
    # block parameters get the same gradient as under dense execution
    dense = copy.deepcopy(layer)
    dense.execution = "dense"
    _, _, gr_d, _ = step(dense, z, w)
    for name, grad in gr_d.items():
        if name.startswith("blocks."):
            torch.testing.assert_close(gr_s.get(name, torch.zeros_like(grad)), grad, atol=1e-6,
                                       rtol=0, msg=name)


def test_auto_execution_is_sparse_exactly_when_it_is_exact():
    layer = make_layer("global", mode="hard", execution="auto")
    z = torch.randn(2, 5, 12, dtype=torch.float64)
    assert layer(z.requires_grad_(True))[1].execution == "dense"  # straight-through α
    with torch.no_grad():
        assert layer(z)[1].execution == "sparse"
        probe = UtilityProbe(torch.randn(7, 12, dtype=torch.float64), None,
                             torch.randint(0, 7, (2, 5)))
        assert layer(z, probe)[1].execution == "dense"  # utilities need every φ_e
    soft = make_layer("global", mode="soft", execution="auto")
    with torch.no_grad():
        assert soft(z)[1].execution == "dense"


def test_top1_sparse_runs_blocks_on_one_row_per_token_instead_of_every_edge():
    layer = make_layer("global", mode="hard", execution="auto")
    rows = [0] * len(layer.edges)

    def count(i):
        def hook(module, inputs, output):
            rows[i] += inputs[0].shape[:-1].numel()
        return hook

    for i, block in enumerate(layer.blocks):
        block.register_forward_hook(count(i))
    z = torch.randn(3, 8, 12, dtype=torch.float64)
    with torch.no_grad():
        _, tr = layer(z)
    selected = (tr.alpha != 0).sum(dim=(0, 1)).tolist()  # hand count of routed tokens per edge
    attention = layer.edges.position("cb")  # mixes tokens: runs on the whole sequence if routed
    for i in range(len(layer.edges)):
        expected = (24 if selected[i] else 0) if i == attention else selected[i]
        assert rows[i] == expected, layer.edges[i].name
    assert sum(selected) <= 24  # top-1 over 𝓔 ∪ {stay}: at most one edge per token


class RecordingDecoder(ArgmaxDecoder):
    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().reshape(-1, x.shape[-1]).clone())
        return super().__call__(x)


@pytest.mark.parametrize("execution", ["sparse", "dense"])
def test_external_tool_is_called_exactly_on_the_tokens_routed_to_it(execution):
    torch.manual_seed(1)
    p = 5
    space = GradedStateSpace({"sem": 6, "num": p})
    edges = EdgeSet.explicit(space, [("num", "num", "tool"), ("num", "num", "learned"),
                                     ("sem", "sem", "self")])
    decoder = RecordingDecoder()
    calls: list[int] = []
    tool = ExternalTool(lambda x: calls.append(x) or (x + 2) % p, decode=decoder,
                        encode=OneHotEncoder(p))
    layer = MorphicLayer(space, edges, [tool, LinearBlock(p, p), LinearBlock(6, 6)],
                         execution=execution,
                         router={"normalization": "global", "mode": "hard", "init_std": 1.0})
    z = torch.randn(4, 7, 6 + p)
    with torch.no_grad():
        out, tr = layer(z)
    routed = tr.alpha[..., 0] != 0
    assert 0 < int(routed.sum()) < 28  # the test needs both routed and unrouted tokens
    seen = torch.cat(decoder.seen)
    num = z[..., 6:]
    if execution == "sparse":
        assert tool.rows == int(routed.sum())
        torch.testing.assert_close(seen, num[routed], atol=0, rtol=0)
        assert sorted(calls) == sorted(set(num[routed].argmax(-1).tolist()))
    else:
        assert tool.rows == 28
    # the routed tokens' num slot is the tool's answer under gated_replace with α = 1
    expected = torch.nn.functional.one_hot((num[routed].argmax(-1) + 2) % p, p).float()
    torch.testing.assert_close(out[..., 6:][routed], expected)


def test_execution_option_rejects_unknown_names_and_sparse_soft_routing():
    space = GradedStateSpace({"a": 2})
    edges = EdgeSet.explicit(space, [("a", "a")])
    with pytest.raises(ValueError, match=r"execution must be one of .*'lazy'"):
        MorphicLayer(space, edges, [LinearBlock(2, 2)], execution="lazy")
    with pytest.raises(ValueError, match=r"execution='sparse' needs .*got mode 'soft'"):
        MorphicLayer(space, edges, [LinearBlock(2, 2)], execution="sparse")


# --------------------------------------------------------------------------- top-k routing

UPDATES = ["gated_replace", "residual_typed", "convex_identity", "eta_step", "simplex_dest",
           "routed_LN"]


def naive_topk(probs_ext: torch.Tensor, groups: list[list[int]], k: int) -> torch.Tensor:
    """Per token and group: the k largest options (ties to the lower column), renormalised."""
    out = torch.zeros_like(probs_ext)
    for row in range(probs_ext.shape[0]):
        for group in groups:
            ranked = sorted(group, key=lambda c: (-float(probs_ext[row, c]), c))[:k]
            total = sum(float(probs_ext[row, c]) for c in ranked)
            for c in ranked:
                out[row, c] = probs_ext[row, c] / total if total > 0 else 0.0
    return out


@pytest.mark.parametrize("normalization", ["global", "dest"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_topk_weights_are_the_renormalised_k_most_probable_options_of_each_group(
        normalization, k):
    layer = make_layer(normalization, top_k=k)
    router = layer.router
    logits = torch.randn(40, len(PAIRS), dtype=torch.float64) * 2
    disabled = {2}
    weights = router.route(logits, disabled=disabled).weights
    # independent: the softmax of each group [its edges | its stay option], by hand
    x = torch.cat([logits.masked_fill(torch.arange(len(PAIRS)) == 2, float("-inf")),
                   torch.zeros(40, router.n_stay, dtype=torch.float64)], dim=-1)
    groups = [g.tolist() for g in router.ext_groups]
    probs = torch.zeros_like(x)
    for g in groups:
        probs[:, g] = torch.softmax(x[:, g], dim=-1)
    kept = naive_topk(probs, groups, k)
    torch.testing.assert_close(weights, kept[:, : len(PAIRS)], atol=1e-12, rtol=0)
    assert (weights[:, 2] == 0).all()
    for g in groups:  # at most k options per group, stay included, and their weights sum to 1
        assert int((kept[:, g] != 0).sum(-1).max()) <= k
        torch.testing.assert_close(kept[:, g].sum(-1), torch.ones(40, dtype=torch.float64))


def test_top1_is_the_one_hot_argmax_with_a_straight_through_gradient():
    layer = make_layer("dest", top_k=1)
    logits = torch.randn(30, len(PAIRS), dtype=torch.float64, requires_grad=True)
    route = layer.router.route(logits)
    ext = torch.cat([logits.detach(), torch.zeros(30, layer.router.n_stay,
                                                  dtype=torch.float64)], -1)
    want = torch.zeros_like(ext)
    for g in layer.router.ext_groups:
        want[torch.arange(30), g[ext[:, g].argmax(-1)]] = 1.0
    torch.testing.assert_close(route.weights.detach(), want[:, : len(PAIRS)], atol=1e-12, rtol=0)
    w = torch.randn(30, len(PAIRS), dtype=torch.float64)
    alpha_grad = torch.autograd.grad((route.weights * w).sum(), logits, retain_graph=True)[0]
    probs_grad = torch.autograd.grad((route.probs * w).sum(), logits)[0]
    torch.testing.assert_close(alpha_grad, probs_grad)  # ∂α/∂K = 1 (straight-through)


@pytest.mark.parametrize("normalization", ["global", "dest"])
@pytest.mark.parametrize("update", UPDATES)
def test_topk_sparse_equals_dense_with_the_same_topk_mask_outputs_and_gradients(
        normalization, update):
    if update == "convex_identity" and normalization != "global":
        pytest.skip("the layer refuses convex_identity without global normalisation")
    layer = make_layer(normalization, update, execution="sparse", pre_norm="layer", top_k=2)
    z, w = torch.randn(2, 6, 12, dtype=torch.float64), torch.randn(2, 6, 12, dtype=torch.float64)
    out_s, dz_s, gr_s, tr = step(layer, z, w)
    assert tr.execution == "sparse"
    assert int((tr.alpha != 0).sum(-1).max()) >= 2  # some token runs two edges
    # independent: every φ_e on every token, zeroed off the top-k mask, the same α
    ref, dz_ref, gr_ref = masked_dense_reference(layer, z, w)
    torch.testing.assert_close(out_s, ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(dz_s, dz_ref, atol=1e-10, rtol=0)
    for name, grad in gr_ref.items():
        torch.testing.assert_close(gr_s.get(name, torch.zeros_like(grad)), grad, atol=1e-10,
                                   rtol=0, msg=name)
    # and the dense execution of the same top-k router gives the same outputs
    dense = copy.deepcopy(layer)
    dense.execution = "dense"
    with torch.no_grad():
        torch.testing.assert_close(dense(z)[0], layer(z)[0], atol=1e-10, rtol=0)


def test_topk_sparse_cost_grows_with_the_selected_edges():
    rows_run = {}
    for k in (1, 2, 3):
        layer = make_layer("global", execution="sparse", top_k=k)
        rows = [0] * len(layer.edges)

        def count(i, rows=rows):
            def hook(module, inputs, output):
                rows[i] += inputs[0].shape[:-1].numel()
            return hook

        for i, block in enumerate(layer.blocks):
            if layer.edges[i].name != "cb":  # token-local blocks only: attention sees all
                block.register_forward_hook(count(i))
        z = torch.randn(4, 10, 12, dtype=torch.float64)
        with torch.no_grad():
            _, tr = layer(z)
        selected = (tr.alpha != 0).sum(dim=(0, 1)).tolist()  # hand count per edge
        attention = layer.edges.position("cb")
        assert [r for i, r in enumerate(rows) if i != attention] == [
            s for i, s in enumerate(selected) if i != attention]
        assert sum(selected) <= k * 40
        rows_run[k] = sum(rows)
    assert rows_run[1] < rows_run[2] < rows_run[3]


def test_external_tool_under_top2_is_called_exactly_on_the_tokens_routed_to_it():
    torch.manual_seed(2)
    p = 5
    space = GradedStateSpace({"sem": 6, "num": p})
    edges = EdgeSet.explicit(space, [("num", "num", "tool"), ("num", "num", "learned"),
                                     ("num", "num", "other"), ("sem", "sem", "self")])
    decoder = RecordingDecoder()
    calls: list[int] = []
    tool = ExternalTool(lambda x: calls.append(x) or (x + 2) % p, decode=decoder,
                        encode=OneHotEncoder(p))
    layer = MorphicLayer(space, edges, [tool, LinearBlock(p, p), LinearBlock(p, p),
                                        LinearBlock(6, 6)], execution="sparse",
                         router={"normalization": "dest", "mode": "hard", "init_std": 1.0,
                                 "top_k": 2})
    z = torch.randn(4, 9, 6 + p)
    with torch.no_grad():
        out, tr = layer(z)
    routed = tr.alpha[..., 0] != 0
    assert 0 < int(routed.sum()) < 36
    assert int(((tr.alpha[..., :3] != 0).sum(-1) == 2).sum()) > 0  # two adders on some tokens
    num = z[..., 6:]
    assert tool.rows == int(routed.sum())
    torch.testing.assert_close(torch.cat(decoder.seen), num[routed], atol=0, rtol=0)
    assert sorted(calls) == sorted(set(num[routed].argmax(-1).tolist()))
    # the tool's share of each routed token's num slot is its answer times its weight
    dense = copy.deepcopy(layer)
    dense.execution = "dense"
    with torch.no_grad():
        torch.testing.assert_close(dense(z)[0], out)


def test_topk_is_refused_outside_hard_softmax_routing():
    space = GradedStateSpace({"a": 2})
    edges = EdgeSet.explicit(space, [("a", "a", "x"), ("a", "a", "y")])
    with pytest.raises(ValueError, match=r"top_k=2 needs mode 'hard'.*got mode 'soft'"):
        Router(space, edges, top_k=2)
    with pytest.raises(ValueError, match=r"top_k=2 needs .*normalization 'logistic'"):
        Router(space, edges, top_k=2, mode="hard", normalization="logistic")
    with pytest.raises(ValueError, match=r"top_k must be an int >= 1, got 0"):
        Router(space, edges, top_k=0)
    with pytest.raises(ValueError, match=r"sample_one .* top_k=1, got top_k=2"):
        MorphicLayer(space, edges, [LinearBlock(2, 2), LinearBlock(2, 2)], update="sample_one",
                     router={"normalization": "global", "mode": "hard", "top_k": 2})
    cfg = {"vocab_size": 4, "grades": [{"label": "a", "dim": 2}],
           "layers": [{"edges": [["a", "a", "x"], ["a", "a", "y"]],
                       "router": {"top_k": 2, "mode": "gumbel"}}]}
    with pytest.raises(ValueError, match=r"top_k=2 is invalid: expected top_k = 1 unless mode "
                                         r"is 'hard'"):
        MorphicConfig.from_dict(cfg)
