"""GradedMLP keeps one grading per hidden space (000 §3): the activation after layer l and
layer l+1 read one learnable grade vector."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from graded.nn import GradedLinear, GradedMLP
from graded.train.recipes import get_recipe

CASES = [("additive", "graded_relu"), ("additive", "graded_exp"), ("input", "graded_exp"),
         ("input", "graded_relu_threshold")]


def _next_layer_grades(model: GradedMLP, index: int) -> torch.Tensor:
    layer = model.layers[index]
    return layer.grades if isinstance(layer, GradedLinear) else layer.grading.grades


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 3, generator=gen)
    return x, (x[:, :1] * 2 - x[:, 1:2]).tanh()


@pytest.mark.parametrize(("layer", "activation"), CASES)
def test_activation_and_next_layer_hold_one_grade_parameter(layer, activation):
    torch.manual_seed(0)
    model = GradedMLP(3, [5, 4], 1, layer=layer, activation=activation,
                      hidden_grades=[[1.0, 2.0, 1.5, 0.5, 1.0], 1.5], learnable_grades=True)
    shared = model.hidden_grade_parameters()
    assert len(shared) == 2
    for (a, b), q in zip(((1, 2), (3, 4)), shared, strict=True):
        assert model.layers[a].grades is q
        assert _next_layer_grades(model, b) is q
    # parameters() and named_parameters() list each shared grade vector once
    params = list(model.parameters())
    assert len(params) == len({id(p) for p in params})
    assert sum(p is q for p in params for q in shared) == 2
    # eight more without the sharing: 3 weights + 3 biases + input grades + 2 hidden (x2)
    assert len(params) == 3 + 3 + 1 + 2


@pytest.mark.parametrize(("layer", "activation"), CASES)
def test_shared_grade_gradient_is_the_sum_of_both_uses(layer, activation):
    torch.manual_seed(1)
    model = GradedMLP(3, [5], 1, layer=layer, activation=activation,
                      hidden_grades=[[0.5, 1.0, 1.5, 2.0, 1.2]], learnable_grades=True,
                      dtype=torch.float64)
    untied = copy.deepcopy(model)
    # the untied twin: the next layer reads its own copy of the same values
    owner = untied.layers[2] if layer == "additive" else untied.layers[2].grading
    owner.grades = nn.Parameter(untied.layers[1].grades.detach().clone())
    x, y = _data()
    x, y = x.double(), y.double()
    loss = nn.functional.mse_loss(model(x), y)
    (g_shared,) = torch.autograd.grad(loss, [model.hidden_grade_parameters()[0]])
    loss_u = nn.functional.mse_loss(untied(x), y)
    g_act, g_next = torch.autograd.grad(loss_u, [untied.layers[1].grades, owner.grades])
    assert torch.allclose(loss, loss_u, rtol=0, atol=0)
    assert g_act.abs().sum() > 0 and g_next.abs().sum() > 0  # both uses contribute
    torch.testing.assert_close(g_shared, g_act + g_next, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("layer", "activation"), CASES)
def test_grades_stay_one_after_training_steps_and_conversion(layer, activation):
    torch.manual_seed(2)
    model = GradedMLP(3, [6], 1, layer=layer, activation=activation, learnable_grades=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = _data()
    start = model.layers[1].grades.detach().clone()
    for _ in range(20):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert not torch.equal(model.layers[1].grades, start)  # the grades did move
    assert _next_layer_grades(model, 2) is model.layers[1].grades
    for other in (copy.deepcopy(model), model.to(torch.float64)):
        assert _next_layer_grades(other, 2) is other.layers[1].grades


@pytest.mark.parametrize(("layer", "activation"), CASES)
def test_state_dict_round_trip_keeps_the_grades_shared(layer, activation):
    torch.manual_seed(3)
    model = GradedMLP(3, [6], 1, layer=layer, activation=activation, learnable_grades=True)
    with torch.no_grad():
        model.layers[1].grades.mul_(torch.linspace(0.5, 2.0, 6))
    state = model.state_dict()
    key_next = "layers.2.grades" if layer == "additive" else "layers.2.grading.grades"
    assert torch.equal(state["layers.1.grades"], state[key_next])  # both names, one value
    fresh = GradedMLP(3, [6], 1, layer=layer, activation=activation, learnable_grades=True)
    fresh.load_state_dict(state)
    assert _next_layer_grades(fresh, 2) is fresh.layers[1].grades
    torch.testing.assert_close(fresh.layers[1].grades, model.layers[1].grades)
    x, _ = _data()
    torch.testing.assert_close(fresh(x), model(x))
    # a state dict with one of the two names loads too (the other is filled in)
    del state[key_next]
    fresh = GradedMLP(3, [6], 1, layer=layer, activation=activation, learnable_grades=True)
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh(x), model(x))


def test_loading_a_checkpoint_with_drifted_copies_fails_naming_both_keys():
    model = GradedMLP(3, [4], 1, learnable_grades=True)
    state = model.state_dict()
    state["layers.2.grades"] = state["layers.2.grades"] + torch.tensor([0.0, 0.25, 0.0, 0.0])
    with pytest.raises(RuntimeError, match=r"'layers\.1\.grades' and 'layers\.2\.grades'.*"
                                           r"max difference 0\.25"):
        GradedMLP(3, [4], 1, learnable_grades=True).load_state_dict(state)
    wrapped = nn.Sequential(nn.Identity(), GradedMLP(3, [4], 1, learnable_grades=True))
    with pytest.raises(RuntimeError, match=r"'1\.layers\.1\.grades'"):
        wrapped.load_state_dict({f"1.{k}": v for k, v in state.items()})


def test_fixed_grades_and_plain_activations_are_not_shared():
    fixed = GradedMLP(3, [4], 1)
    assert fixed.hidden_grade_parameters() == []
    assert not fixed.layers[1].grades.requires_grad
    plain = GradedMLP(3, [4], 1, activation="relu", learnable_grades=True)
    assert plain.hidden_grade_parameters() == []
    assert plain.layers[2].grades.requires_grad


def test_egt_recipe_groups_and_bounds_the_shared_grades_once():
    torch.manual_seed(4)
    model = GradedMLP(3, [6], 1, layer="input", activation="graded_exp", learnable_grades=True)
    recipe = get_recipe("egt-alg7.1", anneal=False)
    groups = recipe.param_groups(model, lr=1e-2, weight_decay=0.0)
    (grade_group,) = [g for g in groups if g.get("name") == "grades"]
    ids = [id(p) for p in grade_group["params"]]
    assert len(ids) == len(set(ids)) == 2  # input grades and the one hidden grade vector
    assert id(model.hidden_grade_parameters()[0]) in ids
    others = [id(p) for g in groups if g is not grade_group for p in g["params"]]
    assert not set(ids) & set(others)
    opt = torch.optim.AdamW(groups)
    logged = recipe.on_step(model, opt, 0, 10)
    q_max = max(float(model.layers[0].grading.grades.detach().max()),
                float(model.hidden_grade_parameters()[0].detach().max()))
    assert logged["q_max"] == pytest.approx(q_max)
    assert opt.param_groups[groups.index(grade_group)]["lr"] <= logged["grade_lr_bound"]


def test_hidden_grades_given_as_a_tensor_of_one_grade_per_layer():
    model = GradedMLP(3, [4, 2], 1, hidden_grades=torch.tensor([2.0, 0.5]))
    assert torch.equal(model.layers[1].grades, torch.full((4,), 2.0))
    assert torch.equal(model.layers[3].grades, torch.full((2,), 0.5))
    model = GradedMLP(3, [4, 2], 1, hidden_grades=torch.tensor(1.5))
    assert torch.equal(model.layers[3].grades, torch.full((2,), 1.5))


@pytest.mark.parametrize("activation", ["graded_relu", "graded_exp"])
def test_a_graded_mlp_built_on_the_meta_device_loads_the_weights_of_a_cpu_twin(activation):
    # deferred initialisation: the grades were checked (q > 0) on the device they were put
    # on, and a meta tensor has no values to read, so construction raised "Tensor.item()
    # cannot be called on meta tensors"
    torch.manual_seed(0)
    kw = {"grades": [1.0, 2.0, 3.0], "hidden_grades": [[1.0, 2.0, 0.5, 1.0]],
          "activation": activation, "learnable_grades": True}
    reference = GradedMLP(3, 4, 2, **kw)
    meta = GradedMLP(3, 4, 2, device="meta", **kw)
    assert {p.device.type for p in meta.parameters()} == {"meta"}
    model = meta.to_empty(device="cpu")
    model.load_state_dict(reference.state_dict())
    assert model.layers[1].grades is _next_layer_grades(model, 2)  # still one hidden grading
    x = torch.randn(5, 3)
    torch.testing.assert_close(model(x), reference(x))
    with pytest.raises(ValueError, match=r"GradedReLU needs grades q > 0, got 0.0 at index 1"):
        GradedMLP(3, 4, 2, hidden_grades=[[1.0, 0.0, 1.0, 1.0]], device="meta")


@pytest.mark.parametrize("layer", ["additive", "input"])
def test_a_graded_mlp_pickles_and_computes_the_same_after_loading(layer):
    # torch.save(model) and worker processes pickle the module: the input-graded layers of
    # layer="input" held a lambda as their identity activation, which pickle refuses
    torch.manual_seed(0)
    model = GradedMLP(3, [4, 5], 2, grades=[1.0, 2.0, 3.0], layer=layer, learnable_grades=True)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    x = torch.randn(6, 3)
    torch.testing.assert_close(loaded(x), model(x))
    assert loaded.layers[1].grades is _next_layer_grades(loaded, 2)
