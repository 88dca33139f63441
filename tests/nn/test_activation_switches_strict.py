"""The switches of the graded activations (``odd``, ``validate``, ``learnable``), of the graph
attention calls (``need_weights``), of :class:`GradedMLP` and of the graded space's normal forms
(``closure``) take True or False only: read truthily, ``validate=0`` skipped the checks of the
grades, ``learnable="no"`` made them learnable, ``need_weights="no"`` returned the weights and
``closure="no"`` identified points over ℂ. A bool (a NumPy one too) computes what it always
computed: the formulas written out (|x|^p, sgn(x)|x|^p, exp(x/q) − 1, the worked normal forms)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from graded.algebra import GradedSpace
from graded.nn import (
    GATLayer,
    GATv2Layer,
    GradedExp,
    GradedGraphAttention,
    GradedMLP,
    GradedReLU,
    graded_exp,
    graded_relu,
    signed_power,
)

BAD = ["no", 1, 0, None, torch.tensor(True)]
F64 = torch.float64


def _message(where: str, value: object) -> str:
    return (rf"^{where} must be True or False, got {re.escape(repr(value))} "
            rf"\({type(value).__name__}\)$")


def _x() -> torch.Tensor:
    return torch.tensor([[-2.0, -0.5, 0.0, 0.25, 3.0]], dtype=F64)


def _graph() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    adj = torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0]])
    return torch.randn(4, 3, generator=g), adj


def _graph_layers():
    torch.manual_seed(0)
    return {"GATLayer": GATLayer(3, 2, heads=2), "GATv2Layer": GATv2Layer(3, 2, heads=2),
            "GradedGraphAttention": GradedGraphAttention(3, 2, heads=2)}


GRADES = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.5], dtype=F64)
CALLS = {  # (message prefix, call taking the switch's value)
    "signed_power: odd": lambda b: signed_power(_x(), 0.5, odd=b),
    "graded_relu: validate": lambda b: graded_relu(_x(), GRADES, validate=b),
    "graded_exp: validate": lambda b: graded_exp(_x(), GRADES, validate=b),
    "learnable": lambda b: GradedReLU([1.0, 2.0], learnable=b),
    "learnable (GradedExp)": lambda b: GradedExp([1.0, 2.0], learnable=b),
    "learnable_grades": lambda b: GradedMLP(2, 3, 1, learnable_grades=b),
    "bias": lambda b: GradedMLP(2, 3, 1, bias=b),
    "closure": lambda b: GradedSpace([2, 4, 6, 10]).normal_form(
        torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=F64), closure=b),
    "closure (same_point)": lambda b: GradedSpace([2, 4]).same_point(
        torch.tensor([-1.0, 1.0], dtype=F64), torch.tensor([1.0, 1.0], dtype=F64), closure=b),
    "closure (normal_form_exact)": lambda b: GradedSpace([2, 4]).normal_form_exact(
        [-1, 1], closure=b),
}


@pytest.mark.parametrize("where", sorted(CALLS))
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_activation_and_normal_form_switches_refuse_what_is_not_a_bool(where, value):
    with pytest.raises(TypeError, match=_message(where.split(" (")[0], value)):
        CALLS[where](value)


@pytest.mark.parametrize("layer", sorted(_graph_layers()))
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_graph_attention_refuses_a_need_weights_that_is_not_a_bool(layer, value):
    x, adj = _graph()
    with pytest.raises(TypeError, match=_message("need_weights", value)):
        _graph_layers()[layer](x, adj, need_weights=value)


# -- bools compute what they computed ------------------------------------------------------

@pytest.mark.parametrize("flag", [True, False, np.True_, np.False_], ids=repr)
def test_signed_power_and_activations_agree_with_the_formulas(flag):
    x = _x()
    odd = bool(flag)
    expected = torch.sign(x) * x.abs() ** 0.5 if odd else x.abs() ** 0.5
    torch.testing.assert_close(signed_power(x, 0.5, odd=flag), expected)
    # the graded ReLU |x_i|^{1/q_i} and the exponential exp(x_i/q_i) − 1 (000 §3.1, Eq. 1),
    # validated or not
    torch.testing.assert_close(graded_relu(x, GRADES, validate=flag), x.abs() ** (1 / GRADES))
    torch.testing.assert_close(graded_exp(x, GRADES, validate=flag), torch.exp(x / GRADES) - 1)


def test_validate_false_still_skips_the_check_and_true_still_makes_it():
    bad = torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0], dtype=F64)
    for flag in (True, np.True_):
        with pytest.raises(ValueError, match="needs grades q > 0"):
            graded_relu(_x(), bad, validate=flag)
    for flag in (False, np.False_):
        graded_relu(_x(), bad, validate=flag)  # trusted, as the modules trust theirs


@pytest.mark.parametrize("module", [GradedReLU, GradedExp])
@pytest.mark.parametrize("flag", [True, False, np.True_, np.False_], ids=repr)
def test_learnable_grades_are_a_parameter_exactly_when_asked(module, flag):
    m = module([1.0, 2.0], learnable=flag)
    assert isinstance(m.grades, torch.nn.Parameter) == bool(flag)
    assert m.learnable_grades is bool(flag)  # a Python bool, as given or converted
    assert ("grades" in dict(m.named_buffers())) == (not flag)


@pytest.mark.parametrize("flag", [True, np.True_, False, np.False_], ids=repr)
def test_graded_mlp_reads_its_switches_as_given(flag):
    m = GradedMLP(2, 3, 1, learnable_grades=flag, bias=flag)
    assert m.layers[1].learnable_grades is bool(flag)
    assert (m.layers[0].bias is not None) == bool(flag)
    assert len(m.hidden_grade_parameters()) == (1 if flag else 0)


@pytest.mark.parametrize("layer", sorted(_graph_layers()))
def test_graph_attention_need_weights_returns_the_weights_exactly_when_asked(layer):
    x, adj = _graph()
    m = _graph_layers()[layer]
    out = m(x, adj)
    for flag in (True, np.True_):
        got, alpha = m(x, adj, need_weights=flag)
        torch.testing.assert_close(got, out)
        assert alpha.shape == (2, 4, 4)
        # α_ij = 0 outside N(i) ∪ {i}, and every row sums to 1
        keep = (adj != 0) | torch.eye(4, dtype=torch.bool)
        assert bool((alpha[:, ~keep] == 0).all())
        torch.testing.assert_close(alpha.sum(-1), torch.ones(2, 4))
    for flag in (False, np.False_):
        torch.testing.assert_close(m(x, adj, need_weights=flag), out)


@pytest.mark.parametrize("flag", [True, False, np.True_, np.False_], ids=repr)
def test_normal_forms_with_bools_agree_with_the_worked_example(flag):
    """P(2, 4), x = (−1, 1): over ℝ no grade is odd, so x is its own sign class; over ℂ
    (closure) the grades on the support divided by their gcd 2 are (1, 2), and the first
    coordinate, of odd grade 1, is made positive: (1, 1)."""
    space = GradedSpace([2, 4])
    x = torch.tensor([-1.0, 1.0], dtype=F64)
    y = space.normalize(x)
    expected = y * torch.tensor([-1.0, 1.0], dtype=F64) if flag else y
    torch.testing.assert_close(space.normal_form(x, closure=flag), expected)
    assert space.normal_form_exact([-1, 1], closure=flag) == ((1, 1) if flag else (-1, 1))
    same = space.same_point(x, torch.tensor([1.0, 1.0], dtype=F64), closure=flag)
    assert bool(same) == bool(flag)
