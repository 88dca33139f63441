"""Optimiser groups and clipping: frozen parameters stay out of every group, and a model
without gradients has norm 0."""

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
