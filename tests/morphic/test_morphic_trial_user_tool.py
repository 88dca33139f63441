"""A researcher's own block (a typed morphism written outside the library) in a morphic layer."""

import pytest
import torch
from torch import nn

from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.model import MorphicTransformer
from graded.morphic.state import Grade, GradedStateSpace


class Float64Tool(nn.Module):
    """A token-local map a → b computed in float64 (as a NumPy-backed tool would): x ↦ x Mᵀ."""

    token_local = True
    reads_dest = False

    def __init__(self, matrix: torch.Tensor) -> None:
        super().__init__()
        self.matrix = matrix.double()
        self.d_out, self.d_in = matrix.shape

    def forward(self, x: torch.Tensor, dst: torch.Tensor | None = None) -> torch.Tensor:
        return x.double() @ self.matrix.T


def _space_edges():
    space = GradedStateSpace([Grade("a", 3, 0), Grade("b", 3, 1)])
    return space, EdgeSet.explicit(space, [("a", "b", "tool")])


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_a_float64_block_output_enters_a_float32_state_in_the_states_dtype(mode):
    """gated_replace with the stay option: z_b ← s z_b + α φ, α = e^ℓ/(1 + e^ℓ) (soft) or the
    argmax of {edge, stay} (hard), written out by hand. Dense execution used to promote the
    state to float64 (the next layer and the readout then refused it) while sparse execution
    cast the same block's output to float32."""
    torch.manual_seed(0)
    space, edges = _space_edges()
    matrix = torch.randn(3, 3, dtype=torch.float64)
    z = torch.randn(2, 4, 6)
    outs = []
    for execution in (["dense"] if mode == "soft" else ["dense", "sparse"]):
        layer = MorphicLayer(space, edges, [Float64Tool(matrix)], execution=execution,
                             router={"mode": mode, "init_std": 1.0})
        torch.manual_seed(1)
        layer.router.load_state_dict({k: torch.randn_like(v)
                                      for k, v in layer.router.state_dict().items()})
        with torch.no_grad():
            out, trace = layer(z)
        assert out.dtype == torch.float32
        ell = trace.context_logits[..., 0].double()
        alpha = (torch.sigmoid(ell) if mode == "soft" else (ell >= 0).double()).unsqueeze(-1)
        phi = z[..., :3].double() @ matrix.T
        expected_b = (1 - alpha) * z[..., 3:].double() + alpha * phi
        torch.testing.assert_close(out[..., :3], z[..., :3], rtol=0, atol=0)
        torch.testing.assert_close(out[..., 3:].double(), expected_b, rtol=1e-5, atol=1e-6)
        outs.append(out)
    if len(outs) == 2:
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_a_model_with_a_float64_tool_runs_forward_and_its_training_loss_in_float32():
    """Two layers with the float64 tool: the second layer and the readout get a float32 state
    (they raised 'expected m1 and m2 to have the same dtype' before), and the loss is finite."""
    torch.manual_seed(0)
    space, edges = _space_edges()
    layers = [MorphicLayer(space, edges, [Float64Tool(torch.randn(3, 3))]) for _ in range(2)]
    model = MorphicTransformer(space, layers, 7, max_len=5)
    ids = torch.randint(0, 7, (2, 5))
    logits = model(ids)
    loss, metrics = model.training_loss(ids, ids.roll(-1, 1))
    assert logits.dtype == torch.float32 and loss.dtype == torch.float32
    assert torch.isfinite(loss) and metrics["lm_loss"] > 0


@pytest.mark.parametrize("mode", ["gumbel", "reinforce"])
def test_loss_context_of_a_sampling_router_in_training_is_the_evaluation_routing_loss(mode):
    """A Gumbel or REINFORCE router samples its route in training and takes the argmax in
    evaluation: ``loss_context`` is the cross-entropy of ``model(ids)``, recomputed here, not
    the sampled pass's ``lm_loss`` (which it used to repeat: 1.94509 against 1.94451)."""
    from graded.morphic.blocks import LinearBlock

    torch.manual_seed(0)
    space = GradedStateSpace([Grade("a", 4, 0), Grade("b", 4, 1)])
    edges = EdgeSet.explicit(space, [("a", "b", "x"), ("b", "b", "y")])
    layer = MorphicLayer(space, edges, [LinearBlock(4, 4), LinearBlock(4, 4)],
                         router={"mode": mode, "init_std": 1.0})
    model = MorphicTransformer(space, [layer], 7, max_len=8).train()
    ids = torch.randint(0, 7, (8, 8))
    targets = ids.roll(-1, 1)
    _, metrics = model.training_loss(ids, targets)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
    assert metrics["loss_context"] == pytest.approx(float(want), rel=1e-6)
    assert metrics["lm_loss"] != pytest.approx(float(want), rel=1e-6)  # the route was sampled


@pytest.mark.parametrize("block", [nn.Linear(3, 3), nn.Sequential(nn.Linear(3, 3), nn.ReLU())],
                         ids=["Linear", "Sequential"])
def test_a_block_that_cannot_take_x_src_and_x_dst_is_refused_naming_the_edge(block):
    """Every block is called as block(x_src, x_dst) (graded.morphic.blocks); a one-input module
    is refused when the layer is built, naming the edge, its grades and the expected call
    (it failed on the first forward pass with "forward() takes 2 positional arguments but 3
    were given")."""
    space, edges = _space_edges()
    with pytest.raises(ValueError, match=r"edge 'tool' \(b <- a\): block "
                                         f"{type(block).__name__} has forward\\(input.*; "
                                         r"expected a block called as block\(x_src, x_dst\)"):
        MorphicLayer(space, edges, [block])


def test_a_block_with_an_optional_or_variadic_second_input_is_accepted():
    """forward(x, dst=None) and forward(*inputs) both take (x_src, x_dst); the layer runs them
    and writes φ into the routed slot (gated_replace, stay option: z_b ← s z_b + α φ)."""

    class Optional(nn.Module):
        def forward(self, x, dst=None):
            return 2 * x

    class Variadic(nn.Module):
        def forward(self, *inputs):
            return 2 * inputs[0]

    space, edges = _space_edges()
    z = torch.randn(1, 3, 6)
    for block in (Optional(), Variadic()):
        out, trace = MorphicLayer(space, edges, [block])(z)
        alpha = torch.sigmoid(trace.context_logits[..., :1])
        torch.testing.assert_close(out[..., 3:], (1 - alpha) * z[..., 3:] + alpha * 2 * z[..., :3])
