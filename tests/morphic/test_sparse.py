"""Sparse execution of routed morphic layers: each block runs on its routed rows only."""

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
    MorphicLayer,
    OneHotEncoder,
    UtilityProbe,
    apply_update,
)

PAIRS = [("a", "a", "aa"), ("a", "b", "ab"), ("b", "b", "bb"), ("c", "b", "cb"),
         ("b", "c", "bc"), ("a", "c", "ac"), ("c", "c", "cc")]


def make_layer(normalization: str, update: str = "gated_replace", mode: str = "hard", *,
               execution: str = "dense", pre_norm: str | None = None) -> MorphicLayer:
    torch.manual_seed(0)
    space = GradedStateSpace({"a": 4, "b": 3, "c": 5})
    edges = EdgeSet.explicit(space, PAIRS)
    blocks = [LinearBlock(4, 4), FFNBlock(4, 3, 6), LinearBlock(3, 3, bias=True),
              GradeTypedAttention(5, 3, num_heads=2, head_dim=4), FFNBlock(3, 5, 7),
              LinearBlock(4, 5), FixedLinearBlock(torch.randn(5, 5))]
    layer = MorphicLayer(space, edges, blocks, update=update, pre_norm=pre_norm,
                         execution=execution,
                         router={"normalization": normalization, "mode": mode, "rank": 4,
                                 "init_std": 1.0})
    return layer.double()


def sparse_twin(layer: MorphicLayer) -> MorphicLayer:
    twin = copy.deepcopy(layer)
    twin.execution = "sparse"
    return twin


def cases() -> list[tuple[str, str]]:
    modes = ["gated_replace", "residual_typed", "convex_identity", "eta_step", "simplex_dest",
             "routed_LN"]
    out = [(n, u) for n in ("global", "dest", "logistic") for u in modes]
    return [*out, ("global", "sample_one")]


def step(layer: MorphicLayer, z: torch.Tensor, w: torch.Tensor, **kw):
    z = z.clone().requires_grad_(True)
    layer.zero_grad()
    out, tr = layer(z, **kw)
    (out * w).sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    return out.detach(), z.grad.clone(), grads, tr


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
    # independent: every φ_e on every token, zeroed where α_e = 0, mixed by the same update
    zz = z.clone().requires_grad_(True)
    layer.zero_grad()
    ell = layer.router.context_logits(zz)
    alpha = layer.router.route(ell).weights
    keep = alpha.detach() != 0
    cands = [c * keep[..., i : i + 1] for i, c in enumerate(layer.candidates(zz))]
    ref = apply_update("gated_replace", zz, cands, alpha, layer.edges, layer.space)
    (ref * w).sum().backward()
    torch.testing.assert_close(out_s, ref.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(dz_s, zz.grad, atol=1e-6, rtol=0)
    for name, p in layer.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(gr_s.get(name, torch.zeros_like(p.grad)), p.grad,
                                       atol=1e-6, rtol=0, msg=name)
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
