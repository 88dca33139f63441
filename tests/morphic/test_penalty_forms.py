"""The utility penalty's two forms: Σ_e ψ(τ_e − ΔL_e) over the edges (SPEC, the default) and the
expectation Σ_e p_e ψ(τ_e − ΔL_e) under the routing kernel (004 Prop 4.16's proof), each
against a hand computation in float64."""

import math

import pytest
import torch

from graded.morphic import (
    EdgeSet,
    GradedStateSpace,
    LinearBlock,
    MorphicLayer,
    threshold_gradient,
    utility_penalty,
)
from graded.morphic.config import build_morphic_model
from graded.morphic.model import MorphicObjective, MorphicTransformer

F64 = torch.float64


def _case():
    gen = torch.Generator().manual_seed(3)
    util = torch.randn(2, 3, 4, generator=gen, dtype=F64)
    tau = torch.rand(4, generator=gen, dtype=F64)
    probs = torch.softmax(torch.randn(2, 3, 4, generator=gen, dtype=F64), -1)
    valid = torch.tensor([[True, True, False], [True, False, True]])
    return util, tau, probs, valid


@pytest.mark.parametrize("disabled", [(), (1,), (0, 3)])
def test_the_expectation_form_weights_each_edge_by_its_kernel_probability(disabled):
    util, tau, probs, valid = _case()
    beta = 2.5
    got = float(utility_penalty(util, tau, beta, valid, disabled=disabled, weights=probs))
    rows = [(b, t) for b in range(2) for t in range(3) if valid[b, t]]
    edges = [e for e in range(4) if e not in disabled]
    want = sum(float(probs[b, t, e]) * math.log1p(math.exp(beta * float(tau[e] - util[b, t, e])))
               for b, t in rows for e in edges) / len(rows)
    assert math.isclose(got, want, rel_tol=1e-12)
    plain = float(utility_penalty(util, tau, beta, valid, disabled=disabled))
    assert got < plain  # the weights are probabilities below 1: the sum bounds it


def test_the_threshold_gradient_of_the_expectation_form_is_autograds():
    util, tau, probs, valid = _case()
    tau = tau.clone().requires_grad_(True)
    lam, beta = 0.3, 1.5
    (lam * utility_penalty(util, tau, beta, valid, disabled=(2,), weights=probs)).backward()
    closed = threshold_gradient(util, tau.detach(), beta=beta, lam=lam, valid=valid,
                                disabled=(2,), weights=probs)
    torch.testing.assert_close(closed, tau.grad, rtol=1e-12, atol=1e-15)
    assert float(closed[2]) == 0.0 and bool((closed >= 0).all())


def test_the_expectation_form_moves_probability_away_from_edges_below_threshold():
    # ∂/∂p_e of Σ_e p_e ψ_e is ψ_e > 0, largest where ΔL_e is furthest below τ_e
    util, tau, probs, valid = _case()
    probs = probs.clone().requires_grad_(True)
    utility_penalty(util, tau, 2.0, valid, weights=probs).backward()
    psi = torch.nn.functional.softplus(2.0 * (tau - util)) / valid.sum()
    torch.testing.assert_close(probs.grad, psi * valid.unsqueeze(-1), rtol=1e-12, atol=0.0)


def test_weights_of_another_shape_are_refused_naming_both_shapes():
    util, tau, probs, valid = _case()
    with pytest.raises(ValueError, match=r"utilities' shape \(2, 3, 4\).*got \(2, 3\)"):
        utility_penalty(util, tau, 1.0, valid, weights=probs[..., 0])


def _model(penalty: str) -> MorphicTransformer:
    torch.manual_seed(0)
    space = GradedStateSpace({"a": 4, "b": 4})
    edges = EdgeSet.explicit(space, [("a", "a", "aa"), ("a", "b", "ab"), ("b", "b", "bb")])
    layer = MorphicLayer(space, edges, [LinearBlock(4, 4) for _ in edges],
                         router={"rank": 4}, beta=2.0, thresholds=[0.1, 0.0, 0.3])
    return MorphicTransformer(space, [layer], 7, max_len=8,
                              objective=MorphicObjective(penalty=penalty)).double()


@pytest.mark.parametrize("penalty", ["sum", "expectation"])
def test_the_model_trains_on_the_penalty_form_it_is_given(penalty):
    model = _model(penalty)
    ids = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(2))
    _, terms = model.training_terms(ids, targets)
    _, (trace,) = model._run(ids, targets, stochastic=False)
    layer = model.layers[0]
    psi = torch.nn.functional.softplus(layer.beta * (layer.thresholds - trace.utilities))
    weights = trace.probs if penalty == "expectation" else torch.ones_like(psi)
    want = (weights * psi).sum(-1).mean()  # every token is scored
    torch.testing.assert_close(terms["utility_penalty"], want, rtol=1e-12, atol=0.0)


def test_an_unknown_penalty_form_is_refused_in_python_and_in_a_config():
    with pytest.raises(ValueError, match=r"penalty must be one of \('sum', 'expectation'\), "
                                         r"got 'mean'"):
        MorphicObjective(penalty="mean")
    with pytest.raises(ValueError, match="penalty must be one of"):
        build_morphic_model({"preset": "variable_addition", "objective": {"penalty": "mean"}})
