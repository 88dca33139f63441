"""Bad inputs to the morphic objective, utilities, router, tools and layer thresholds are refused
up front with an error naming the value and what was expected, instead of a NaN result, a
silent broadcast, a torch shape error or a failure at the first forward pass."""

from __future__ import annotations

import math

import pytest
import torch

from graded.morphic import (
    ArgmaxDecoder,
    EdgeSet,
    ExternalTool,
    GradedStateSpace,
    MorphicLayer,
    OneHotEncoder,
    Router,
    UtilityProbe,
    calculator_adder,
    threshold_gradient,
    utility_augmented_logits,
    utility_penalty,
)
from graded.morphic.blocks import LinearBlock


def _space_edges():
    space = GradedStateSpace({"a": 3, "b": 2})
    return space, EdgeSet(space, [("a", "b", "tool"), ("b", "a", "back")])


U = torch.tensor([[[0.5, -1.0], [2.0, 0.0]]])  # (B=1, T=2, |E|=2)
VALID = torch.tensor([[True, True]])


def test_a_nan_beta_is_refused_by_the_penalty_and_the_threshold_gradient():
    """NaN passed ``beta <= 0`` and made the penalty NaN; a negative β gave the closed-form
    ∂L_GT/∂τ a negative value, against its stated sign (≥ 0)."""
    with pytest.raises(ValueError, match="beta must be a finite number, got nan"):
        utility_penalty(U, torch.zeros(2), float("nan"), VALID)
    with pytest.raises(ValueError, match=r"beta must be > 0, got -1\.0"):
        threshold_gradient(U, torch.zeros(2), beta=-1.0, lam=1.0, valid=VALID)
    with pytest.raises(ValueError, match=r"lam must be >= 0, got -0\.5"):
        threshold_gradient(U, torch.zeros(2), beta=1.0, lam=-0.5, valid=VALID)
    # the values still follow the formula: λβ mean_t σ(β(τ − ΔL))
    got = threshold_gradient(U, torch.zeros(2), beta=2.0, lam=0.5, valid=VALID)
    sig = [[1 / (1 + math.exp(2.0 * u)) for u in row] for row in ([0.5, -1.0], [2.0, 0.0])]
    want = [0.5 * 2.0 * (sig[0][k] + sig[1][k]) / 2 for k in range(2)]
    assert got.tolist() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("call", ["penalty", "augmented", "gradient"])
def test_thresholds_that_are_not_one_per_edge_are_refused_naming_the_shapes(call):
    """A (|E|+1,) τ broadcast against (…, 1) utilities silently; a (3,) τ against (…, 2) gave
    torch's "size of tensor a (3) must match the size of tensor b (2)"."""
    tau = torch.zeros(3)
    with pytest.raises(ValueError, match=r"thresholds must hold one τ_e per edge, shape \(2,\).*"
                                         r"got shape \(3,\)"):
        if call == "penalty":
            utility_penalty(U, tau, 1.0, VALID)
        elif call == "augmented":
            utility_augmented_logits(torch.zeros_like(U), U, 1.0, tau)
        else:
            threshold_gradient(U, tau, beta=1.0, lam=1.0, valid=VALID)
    with pytest.raises(ValueError, match=r"thresholds must hold one τ_e per edge, shape \(1,\)"):
        utility_penalty(U[..., :1], tau, 1.0, VALID)  # used to broadcast to 3 edges


def test_valid_and_context_logits_of_other_shapes_are_refused():
    with pytest.raises(ValueError, match=r"valid must mark the utilities' tokens, shape "
                                         r"\(1, 2\); got shape \(2, 1\)"):
        utility_penalty(U, torch.zeros(2), 1.0, VALID.T)  # used to broadcast to (2, 2) tokens
    with pytest.raises(ValueError, match=r"context_logits must have the utilities' shape "
                                         r"\(1, 2, 2\).*got \(1, 1, 2\)"):
        utility_augmented_logits(torch.zeros(1, 1, 2), U, 1.0, torch.zeros(2))


def test_a_readout_bias_of_the_wrong_length_is_named():
    space, edges = _space_edges()
    layer = MorphicLayer(space, edges, [LinearBlock(3, 2), LinearBlock(2, 3)])
    probe = UtilityProbe(torch.randn(4, 5), torch.zeros(3), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"readout bias has shape \(3,\); expected \(4,\)"):
        layer(torch.randn(1, 2, 5), probe)


def test_router_refuses_a_state_that_is_not_batch_time_features():
    space, edges = _space_edges()
    with pytest.raises(ValueError, match=r"state must be a \(B, T, D\) tensor with D = Σ d_g = "
                                         r"5, got shape \(2, 5\)"):
        Router(space, edges).context_logits(torch.randn(2, 5))


@pytest.mark.parametrize(("k", "p", "error", "message"), [
    (1.5, 5, TypeError, r"k must be an int, got 1.5"),
    (1, 0, ValueError, r"p must be >= 1, got 0"),
])
def test_calculator_adder_checks_its_shift_and_modulus_when_built(k, p, error, message):
    """A float k was written into "(x + 1.5) % 5" and refused only at the first call."""
    with pytest.raises(error, match=message):
        calculator_adder(k, p)


def test_thresholds_by_edge_name_and_unknown_names_refused():
    """{edge name: τ_e} sets those edges' thresholds (the rest keep 0); a name that is no edge
    of the layer is named with the layer's edges. A dict used to fail in torch with "must be
    real number, not dict"."""
    space, edges = _space_edges()
    blocks = [LinearBlock(3, 2), LinearBlock(2, 3)]
    layer = MorphicLayer(space, edges, blocks, thresholds={"back": 0.1})
    assert layer.thresholds.tolist() == [0.0, 0.1]
    with pytest.raises(ValueError, match=r"thresholds name unknown edges \['calc'\]; expected "
                                         r"names of the layer's edges \['tool', 'back'\]"):
        MorphicLayer(space, edges, blocks, thresholds={"calc": 0.1})
    with pytest.raises(ValueError, match=r"thresholds must be finite and >= 0, got \[0.0, -0.1\]"):
        MorphicLayer(space, edges, blocks, thresholds={"back": -0.1})
    with pytest.raises(ValueError, match=r"thresholds must be a float, 2 floats .* got 'high'"):
        MorphicLayer(space, edges, blocks, thresholds="high")


def test_a_state_dict_with_a_negative_threshold_is_refused_and_the_model_is_left_as_it_was():
    """The constructor refuses τ_e < 0 and NaN; a state dict carrying them was loaded as it
    was, so the layer routed with a margin that favours edges raising the loss."""
    space, edges = _space_edges()
    layer = MorphicLayer(space, edges, [LinearBlock(3, 2), LinearBlock(2, 3)],
                         thresholds=[0.2, 0.3])
    state = layer.state_dict()
    state["thresholds"] = torch.tensor([0.1, float("nan")], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"thresholds must be finite and >= 0, got \[0.1, nan\] "
                                         r"in the state dict at thresholds"):
        layer.load_state_dict(state)
    assert layer.thresholds.tolist() == [0.2, 0.3]
    state["thresholds"] = torch.tensor([0.1, 0.0], dtype=torch.float64)
    layer.load_state_dict(state)  # a valid τ still loads
    assert layer.thresholds.tolist() == [0.1, 0.0]


def test_a_tool_result_outside_the_encoders_domain_names_the_tool_and_its_inputs():
    """x ↦ x + 2 on {0, 1, 2} leaves the one-hot domain {0, 1, 2} at x = 2; the error was the
    encoder's "values must lie in [0, 3)", naming neither the tool nor the input."""
    tool = ExternalTool(lambda x: x + 2, decode=ArgmaxDecoder(), encode=OneHotEncoder(3),
                        name="add2")
    inputs = torch.eye(3, dtype=torch.float64)[[0, 2]].unsqueeze(0)  # decodes to 0 and 2
    with pytest.raises(ValueError, match=r"tool 'add2': encode refused its results "
                                         r"\{0: 2, 2: 4\} .*must lie in \[0, 3\)"):
        tool(inputs)
    ok = tool(torch.eye(3, dtype=torch.float64)[[0]].unsqueeze(0))  # 0 ↦ 2 fits
    assert ok.dtype == torch.float64 and ok[0, 0].tolist() == [0.0, 0.0, 1.0]
