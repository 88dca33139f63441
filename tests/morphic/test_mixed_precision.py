"""Routed layers run under autocast (mixed precision): a block's output in bf16 / fp16 and a
float32 state are combined as in float32, the results compared with the update rule written out
from the paper's formulas (004 §3.2, router module doc)."""

import pytest
import torch

from graded.morphic import EdgeSet, GradedStateSpace, LinearBlock, MorphicLayer

DTYPES = [torch.bfloat16, torch.float16]


def layer_with_constant_logits(normalization: str, mode: str) -> MorphicLayer:
    """Two edges into ``b`` and one into ``a``; the router's bilinear weights are 0, so every
    context logit is exactly 0 in any dtype (gates σ(0) = 1/2, ties broken by the first option)."""
    torch.manual_seed(0)
    space = GradedStateSpace({"a": 3, "b": 2})
    edges = EdgeSet.explicit(space, [("a", "b", "ab"), ("b", "b", "bb"), ("b", "a", "ba")])
    blocks = [LinearBlock(space.dim(e.source), space.dim(e.dest)) for e in edges]
    layer = MorphicLayer(space, edges, blocks, router={"rank": 3, "normalization": normalization,
                                                       "mode": mode})
    with torch.no_grad():
        layer.router.bilinear.zero_()
    return layer


def phi(layer: MorphicLayer, i: int, z: torch.Tensor) -> torch.Tensor:
    """φ_e(z^{(g)}) = A_e z^{(g)} in float64, from the block's weight."""
    e = layer.edges[i]
    src = z.double()[..., layer.space.slices[e.source]]
    return src @ layer.blocks[i].proj.weight.double().T


@pytest.mark.parametrize("dtype", DTYPES)
def test_logistic_gates_with_a_stay_option_route_under_autocast(dtype):
    """α_e = g_e / (Σ_{e'→h} g_{e'} + Π_{e'→h}(1 − g_{e'})) with g = σ(0) = 1/2, and
    z^{(h)} + Σ_{e→h} α_e (φ_e − z^{(h)}). Before, autocast ran the product in float32 and the
    weights' index_put refused the mix of dtypes."""
    layer = layer_with_constant_logits("logistic", "soft")
    z = torch.randn(2, 4, 5)
    with torch.autocast("cpu", dtype=dtype):
        out, _ = layer(z)
    zd = z.double()
    a, b = zd[..., :3], zd[..., 3:]
    alpha_b = 0.5 / (2 * 0.5 + 0.25)  # two gates into b
    alpha_a = 0.5 / (0.5 + 0.5)  # one gate into a: α = g
    want_b = b + alpha_b * (phi(layer, 0, z) - b) + alpha_b * (phi(layer, 1, z) - b)
    want_a = a + alpha_a * (phi(layer, 2, z) - a)
    torch.testing.assert_close(out.double(), torch.cat([want_a, want_b], -1), atol=3e-2,
                               rtol=3e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["hard", "gumbel", "reinforce"])
def test_sparse_execution_of_hard_routing_runs_under_autocast(dtype, mode):
    """Evaluation of a hard (or sampled-at-training) router picks the argmax option of each
    destination: all logits are 0, so the first edge into each grade wins, and slot h becomes
    φ_e(z^{(g)}). Before, the sparse mix (float32, the state's dtype) refused the blocks' bf16 /
    fp16 rows in index_add_."""
    layer = layer_with_constant_logits("dest", mode).eval()
    z = torch.randn(2, 4, 5)
    with torch.autocast("cpu", dtype=dtype), torch.no_grad():
        out, trace = layer(z)
    assert trace.execution == "sparse"
    want = torch.cat([phi(layer, 2, z), phi(layer, 0, z)], -1)  # a <- ba, b <- ab
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=3e-2)
