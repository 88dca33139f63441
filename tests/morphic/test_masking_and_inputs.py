"""Disabled (masked) edges in the routing entropy and the objective, and inputs that used to run
silently or fail with an unclear error: each is refused naming the bad value and what was
expected."""

import math

import pytest
import torch
from torch.nn import functional as F

from graded.morphic import EdgeSet, GradedStateSpace, LinearBlock, MorphicLayer, Router
from graded.morphic.config import build_morphic_model
from graded.morphic.model import MorphicObjective, MorphicTransformer
from graded.morphic.tasks import VariableAdditionTask, build_adder_model


def tiny_model(normalization: str = "dest", **objective) -> MorphicTransformer:
    torch.manual_seed(0)
    space = GradedStateSpace({"a": 4, "b": 4})
    edges = EdgeSet.explicit(space, [("a", "a", "aa"), ("a", "b", "ab"), ("b", "b", "bb")])
    blocks = [LinearBlock(4, 4) for _ in edges]
    layer = MorphicLayer(space, edges, blocks, router={"rank": 4,
                                                       "normalization": normalization})
    return MorphicTransformer(space, [layer], 7, max_len=8,
                              objective=MorphicObjective(**objective))


def naive_entropy(logits: torch.Tensor, groups: list[list[int]], disabled: set[int]
                  ) -> torch.Tensor:
    """Σ over groups of H(softmax([ℓ_e for enabled e in the group] + [0 for stay])), by hand;
    a group left with the stay option alone has entropy 0."""
    total = torch.zeros(logits.shape[:-1], dtype=logits.dtype)
    for group in groups:
        live = [e for e in group if e not in disabled]
        x = torch.cat([logits[..., live], logits.new_zeros(*logits.shape[:-1], 1)], -1)
        p = torch.softmax(x, -1)
        total = total - (p * p.log()).sum(-1)
    return total


@pytest.mark.parametrize("disabled", [set(), {1}, {0, 2}, {0, 1, 2}])
def test_routing_entropy_is_that_of_the_distribution_left_after_disabling_edges(disabled):
    """Before, ``Router.entropy`` ignored ``layer.disabled``: with every edge disabled (only the
    stay options left, entropy 0) the model reported routing_entropy = log 2 + log 3 and
    trained the entropy penalty on edges that could not be chosen."""
    model = tiny_model(omega="entropy_penalty", omega_weight=1.0, utility_weight=0.0)
    layer = model.layers[0]
    layer.disabled = set(disabled)
    ids = torch.randint(0, 7, (3, 5), generator=torch.Generator().manual_seed(1))
    targets = ids.roll(-1, 1)
    _, traces = model.utility_routing(ids, targets)
    ell = traces[0].routing_logits.detach().double()
    groups = [[0], [1, 2]]  # destinations a: {aa}, b: {ab, bb}, each with its stay option
    want = naive_entropy(ell, groups, disabled)
    got = layer.router.entropy(ell, layer.disabled)
    torch.testing.assert_close(got, want)
    _, metrics = model.training_loss(ids, targets)
    assert metrics["routing_entropy"] == pytest.approx(float(want.mean()), abs=1e-5)
    assert metrics["omega"] == pytest.approx(float(want.mean()), abs=1e-5)
    if disabled == {0, 1, 2}:
        assert metrics["routing_entropy"] == 0.0


def test_a_disabled_gate_adds_no_bernoulli_entropy():
    model = tiny_model("logistic")
    router = model.layers[0].router
    ell = torch.randn(2, 3, 3, dtype=torch.float64)
    p = torch.sigmoid(ell)
    per_gate = -(p * p.log() + (1 - p) * (1 - p).log())
    torch.testing.assert_close(router.entropy(ell, {1}), per_gate[..., [0, 2]].sum(-1))


@pytest.mark.parametrize("bad", [3, -1, "ab"])
def test_a_disabled_edge_that_is_not_an_edge_position_is_refused_by_name(bad):
    """Before: 3 gave "IndexError: index 3 is out of bounds", -1 silently disabled the last
    edge."""
    model = tiny_model()
    model.layers[0].disabled = {bad}
    with pytest.raises(ValueError, match=r"disabled edges must be edge positions in \[0, 3\).*"
                                         r"\['aa', 'ab', 'bb'\].*got \[" + repr(bad)):
        model(torch.zeros(1, 2, dtype=torch.long))


def test_generate_refuses_an_empty_prompt_naming_its_shape():
    """Before: "IndexError: index -1 is out of bounds for dimension 1 with size 0"."""
    with pytest.raises(ValueError, match=r"prompt is empty \(input_ids of shape \(2, 0\)\)"):
        tiny_model().generate(torch.zeros(2, 0, dtype=torch.long), 3)


def test_generate_fills_max_len_exactly_and_refuses_one_token_more():
    model = tiny_model()
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 5)
    assert out.shape == (1, 8) and torch.equal(out[:, :3], prompt)
    # greedy: each new token is the argmax of the model on the sequence so far
    for t in range(3, 8):
        assert out[0, t] == model(out[:, :t])[0, -1].argmax()
    with pytest.raises(ValueError, match="max_new_tokens 6 exceeds the model's max_len=8"):
        model.generate(prompt, 6)


def test_a_layer_refuses_a_state_that_is_not_batch_time_features():
    """Before: "ValueError: not enough values to unpack (expected 3, got 2)"."""
    layer = tiny_model().layers[0]
    with pytest.raises(ValueError, match=r"\(B, T, D\) tensor with D = Σ d_g = 8, got shape "
                                         r"\(5, 8\)"):
        layer(torch.randn(5, 8))


@pytest.mark.parametrize("bad", [math.nan, -0.1, math.inf])
def test_a_router_refuses_an_init_std_that_is_not_a_finite_number_at_least_0(bad):
    """Before: NaN filled the bilinear weights with NaN (every logit NaN); -0.1 was accepted."""
    space = GradedStateSpace({"a": 2})
    edges = EdgeSet.explicit(space, [("a", "a", "aa")])
    with pytest.raises(ValueError, match="init_std must be"):
        Router(space, edges, init_std=bad)


@pytest.mark.parametrize("bad", [math.nan, 0.0, -4.0])
def test_the_adder_model_refuses_a_readout_scale_that_is_not_finite_and_positive(bad):
    """Before: NaN built a model whose logits were all NaN; 0 or below is no decoder c·I_p."""
    with pytest.raises(ValueError, match=r"readout_scale must be a finite number > 0.*got"):
        build_adder_model(VariableAdditionTask(5, (1, 2)), readout_scale=bad)
    with pytest.raises(ValueError, match="readout_scale"):
        build_morphic_model({"preset": "variable_addition",
                             "preset_options": {"readout_scale": bad}})


def naive_group_kl(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """KL over one global group [edges | stay] per token, with torch.nn.functional.kl_div."""
    ext = lambda x: torch.cat([x, x.new_zeros(*x.shape[:-1], 1)], -1)  # noqa: E731
    return F.kl_div(torch.log_softmax(ext(student), -1), torch.log_softmax(ext(teacher), -1),
                    log_target=True, reduction="none").sum(-1)


@pytest.mark.parametrize("teacher", ["utility", "full"])
def test_distillation_teacher_is_the_utility_part_or_the_whole_utility_augmented_logits(teacher):
    model = tiny_model("global", utility_weight=0.0, omega="none", distill_teacher=teacher)
    layer = model.layers[0]
    layer.train_routing = "utility"
    ids = torch.randint(0, 7, (2, 6), generator=torch.Generator().manual_seed(2))
    targets = ids.roll(-1, 1)
    _, traces = model.utility_routing(ids, targets)
    tr = traces[0]
    part = layer.beta * (tr.utilities - layer.thresholds.float())
    t_logits = part if teacher == "utility" else tr.context_logits + part
    want = naive_group_kl(t_logits.detach(), tr.context_logits.detach()).mean()
    _, metrics = model.training_loss(ids, targets)
    assert metrics["distill"] == pytest.approx(float(want), rel=1e-5)


def test_an_unknown_distillation_teacher_is_refused_by_name():
    with pytest.raises(ValueError, match=r"distill_teacher must be one of \('utility', 'full'\), "
                                         r"got 'ell'"):
        MorphicObjective(distill_teacher="ell")


DYCK_LIKE = {"vocab_size": 9, "max_len": 12,
             "grades": [{"label": "g0", "dim": 8, "index": 0},
                        {"label": "g1", "dim": 8, "index": 1}],
             "layers": [{"edges": [["g0", "g1", "att"]], "block": "attention",
                         "block_options": {"num_heads": 2, "head_dim": 4}, "router": {"rank": 4}},
                        {"banded": [0, 1], "block": "ffn", "block_options": {"hidden": 16},
                         "router": {"rank": 4}}]}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_a_model_built_with_a_dtype_equals_the_float32_model_cast_and_runs_finite(dtype):
    torch.manual_seed(0)
    built = build_morphic_model(DYCK_LIKE, device="cpu", dtype=dtype)
    torch.manual_seed(0)
    cast = build_morphic_model(DYCK_LIKE).to(dtype)
    assert {p.dtype for p in built.parameters()} == {dtype}
    # the thresholds τ stay float64 whatever the cast (test_threshold_precision.py)
    assert {b.dtype for n, b in built.named_buffers()
            if b.is_floating_point() and not n.endswith(".thresholds")} == {dtype}
    assert {layer.thresholds.dtype for layer in built.layers} == {torch.float64}
    ids = torch.randint(0, 9, (2, 10), generator=torch.Generator().manual_seed(3))
    logits = built(ids)
    assert logits.dtype == dtype and bool(torch.isfinite(logits).all())
    torch.testing.assert_close(logits, cast(ids), rtol=0, atol=0)
    loss, metrics = built.training_loss(ids, ids.roll(-1, 1))
    assert math.isfinite(metrics["loss"])
    loss.backward()
    assert all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in built.parameters())
    assert built.generate(ids[:, :3], 4).shape == (2, 7)


def test_a_model_dtype_that_is_not_floating_point_is_refused_by_name():
    with pytest.raises(ValueError, match=r"dtype must be a floating-point torch.dtype, got "
                                         r"torch.int64"):
        build_morphic_model(DYCK_LIKE, dtype=torch.int64)


def test_a_state_dict_round_trip_restores_every_output_of_a_built_model(tmp_path):
    torch.manual_seed(0)
    model = build_morphic_model(DYCK_LIKE)
    torch.save(model.state_dict(), tmp_path / "m.pt")
    torch.manual_seed(1)  # a different initialisation, overwritten by the load
    fresh = build_morphic_model(DYCK_LIKE)
    fresh.load_state_dict(torch.load(tmp_path / "m.pt"))
    ids = torch.randint(0, 9, (2, 10), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(fresh(ids), model(ids), rtol=0, atol=0)
    torch.testing.assert_close(fresh.training_loss(ids, ids.roll(-1, 1))[0],
                               model.training_loss(ids, ids.roll(-1, 1))[0], rtol=0, atol=0)


@pytest.mark.parametrize("stay", [True, False])
@pytest.mark.parametrize("disabled", [{1}, {0, 1, 2}])
def test_the_entropy_gradient_with_disabled_edges_is_that_of_the_hand_written_entropy(
        stay, disabled):
    """A first version of the masked entropy multiplied 0 by log 0 = −∞ in the backward pass:
    NaN gradients for every logit as soon as one edge was disabled."""
    model = tiny_model()
    space, edges = model.space, model.layers[0].edges
    router = Router(space, edges, rank=2, stay=stay)
    x = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    router.entropy(x, disabled).sum().backward()
    want = torch.zeros_like(x)
    if stay:
        y = x.detach().clone().requires_grad_(True)
        naive_entropy(y, [[0], [1, 2]], disabled).sum().backward()
        want = y.grad
    else:  # without stay options: group b keeps edge 2 alone (no choice) or nothing
        assert float(router.entropy(x.detach(), disabled).abs().max()) == 0.0
    torch.testing.assert_close(x.grad, want)
    # and through a whole training step
    model.layers[0].disabled = set(disabled)
    ids = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(5))
    model.training_loss(ids, ids.roll(-1, 1))[0].backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()
               if p.grad is not None)


@pytest.mark.parametrize(("bad", "error", "message"), [
    (0, ValueError, "max_len must be >= 1, got 0"),
    (-1, ValueError, "max_len must be >= 1, got -1"),
    (2.5, TypeError, r"max_len must be an int, got 2.5 \(float\)"),
    (True, TypeError, r"max_len must be an int, got True \(bool\)")])
def test_a_max_len_that_is_not_a_positive_int_is_refused_by_name(bad, error, message):
    """Before: -1 and 2.5 failed inside nn.Embedding ("negative dimension", "argument 'size'"),
    0 built a model that could read no token."""
    space = GradedStateSpace({"a": 2})
    layer = MorphicLayer(space, EdgeSet.explicit(space, [("a", "a", "aa")]), [LinearBlock(2, 2)])
    with pytest.raises(error, match=message):
        MorphicTransformer(space, [layer], 5, max_len=bad)


def test_a_model_without_layers_is_refused_when_built():
    """Before: it was built, and training_loss failed with "stack expects a non-empty
    TensorList"."""
    with pytest.raises(ValueError, match="needs at least one MorphicLayer, got none"):
        MorphicTransformer(GradedStateSpace({"a": 2}), [], 5)
