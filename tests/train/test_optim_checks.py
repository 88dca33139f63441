"""Optimiser groups and clipping: frozen parameters stay out of every group, and a model
without gradients has norm 0."""

import math

import pytest
import torch
from torch import nn

from graded.train.optim import clip_gradients, param_groups


def test_frozen_parameters_are_in_no_group():
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    groups = param_groups(model, 0.1)
    grouped = [id(p) for g in groups for p in g["params"]]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert sorted(grouped) == sorted(trainable) and id(model[0].weight) not in grouped
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(model[2].weight)}  # the one trainable matrix


def test_clipping_without_gradients_is_a_zero_norm_no_op():
    model = nn.Linear(3, 2)
    assert clip_gradients(model, 1.0) == 0.0
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("max_norm", [-1.0, 0.0, math.nan, math.inf, True])
def test_clipping_refuses_a_max_norm_that_is_not_positive_and_finite(max_norm):
    # -1 multiplied the gradients by -1/‖g‖ (an ascent step), nan made them nan; the
    # gradients are left as they were
    model = nn.Linear(2, 1)
    model.weight.grad = torch.tensor([[3.0, 4.0]])
    with pytest.raises(ValueError, match=r"max_norm \(None for no clipping\) must be"):
        clip_gradients(model, max_norm)
    assert model.weight.grad.tolist() == [[3.0, 4.0]]


def test_clipping_scales_the_gradients_to_max_norm():
    # g = (3, 4), ‖g‖ = 5: clipped to 1 it is g/5; the norm before is returned
    model = nn.Linear(2, 1, bias=False)
    model.weight.grad = torch.tensor([[3.0, 4.0]])
    assert clip_gradients(model, 1.0) == pytest.approx(5.0)
    torch.testing.assert_close(model.weight.grad, torch.tensor([[0.6, 0.8]]), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("attention", ["torch", "graded"])
def test_the_key_and_value_biases_of_add_bias_kv_take_no_weight_decay(attention):
    """bias_k and bias_v, (1, 1, E), were decayed as matrices though they are biases."""
    from graded.attention.multihead import MultiheadAttention

    cls = nn.MultiheadAttention if attention == "torch" else MultiheadAttention
    model = cls(8, 2, add_bias_kv=True)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g["name"]: sorted(names[id(p)] for p in g["params"])
              for g in param_groups(model, 0.1)}
    assert groups["decay"] == ["in_proj_weight", "out_proj.weight"]
    assert groups["no_decay"] == ["bias_k", "bias_v", "in_proj_bias", "out_proj.bias"]
