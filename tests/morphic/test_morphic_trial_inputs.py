"""Morphic models used at their limits: configs whose integer lists hold bools or floats, the
``sample_one`` refusal, and ``torch.compile`` over grades of different dimensions and hard
routers (no graph break)."""

import pytest
import torch
import torch._dynamo

from graded.morphic.config import build_morphic_model
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.state import Grade, GradedStateSpace
from graded.morphic.update import apply_update

GRADES = [{"label": "g0", "dim": 4, "index": 0}, {"label": "g1", "dim": 6, "index": 1}]
LAYER = {"banded": [0, 1], "block": "ffn", "block_options": {"hidden": 5}, "router": {"rank": 3}}


def config(layer=None, **changes):
    return {"vocab_size": 11, "max_len": 8, "grades": GRADES, "layers": [layer or LAYER],
            **changes}


@pytest.mark.parametrize("changes, message", [
    ({"layers": [{**LAYER, "banded": [True]}]},
     r"layers\.0\.banded=\[True\] is invalid: expected None or a list of ints"),
    ({"layers": [{**LAYER, "banded": [0, 1.0]}]},
     r"layers\.0\.banded=\[0, 1\.0\] is invalid: expected None or a list of ints"),
    ({"grades": [{**GRADES[0], "index": 0.0}, GRADES[1]]},
     r"grades\.0\.index=0\.0 is invalid: expected None or an int"),
    ({"layers": [{**LAYER, "router": {"rank": 3, "input_type": "operator",
                                      "operator_tokens": [True]}}]},
     r"router\.operator_tokens=\[True\] is invalid: expected a list of ints"),
    ({"layers": [{**LAYER, "router": {"rank": 3, "input_type": "operator",
                                      "operator_tokens": [2.0]}}]},
     r"router\.operator_tokens=\[2\.0\] is invalid: expected a list of ints"),
])
def test_a_config_refuses_bools_and_floats_where_it_expects_ints_naming_them(changes, message):
    # pydantic's lax list[int] used to read True as 1 and 1.0 as 1: [True] built shift 1
    with pytest.raises(ValueError, match=message):
        build_morphic_model(config(**changes))


@pytest.mark.parametrize("shifts", [[True, 2], [1.0, 2]])
def test_the_adder_preset_refuses_shifts_that_are_not_ints_naming_them(shifts):
    # the task refuses them when called directly; the config coerced them to [1, 2] before
    with pytest.raises(ValueError, match=r"(?s)preset_options=.*shifts.*a list of ints"):
        build_morphic_model({"preset": "variable_addition", "preset_options": {"shifts": shifts}})


def test_sample_one_names_the_normalization_and_mode_it_was_given():
    space = GradedStateSpace([Grade("a", 2, 0), Grade("b", 2, 1)])
    edges = EdgeSet.banded(space, [1])
    blocks = [torch.nn.Linear(2, 2)]
    # a soft, per-destination router with top_k=1: the message used to name only top_k=1
    with pytest.raises(ValueError, match=r"got top_k=1, normalization='dest', mode='soft'"):
        MorphicLayer(space, edges, blocks, update="sample_one")


def _graph_breaks(fn, *args) -> list[str]:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    return [str(reason.reason).splitlines()[0] for reason in explained.break_reasons]


def test_grades_of_different_dimensions_compile_without_a_graph_break():
    # the update's column map came from repeat_interleave by a tensor of counts: a shape that
    # depends on data, one graph break per layer call
    model = build_morphic_model(config()).eval()
    ids = torch.randint(0, 11, (2, 5))
    assert _graph_breaks(model, ids) == []


@pytest.mark.slow  # torch.compile, 4 s on 2 cores: `pytest -m slow`
def test_a_hard_router_trained_by_utilities_compiles_without_a_graph_break():
    # training_terms runs a gradient-free context pass, which "auto" executed sparsely (nonzero,
    # a data-dependent shape) even under torch.compile
    layer = {**LAYER, "router": {"rank": 3, "mode": "hard"}, "train_routing": "utility"}
    model = build_morphic_model(config(layer)).train()
    ids = torch.randint(0, 11, (2, 5))
    assert _graph_breaks(lambda a, b: model.training_terms(a, b)[0], ids, ids) == []
    model.eval()
    assert _graph_breaks(model, ids) == []


def test_the_update_over_grades_of_different_dimensions_equals_its_per_grade_formula():
    torch.manual_seed(0)
    space = GradedStateSpace([Grade("a", 3, 0), Grade("b", 5, 1), Grade("c", 2, 2)])
    edges = EdgeSet.explicit(space, [("b", "a", "x"), ("a", "b", "y"), ("b", "b", "w")])
    z = torch.randn(2, 3, space.total_dim, dtype=torch.float64)
    alpha = torch.rand(2, 3, len(edges), dtype=torch.float64) * 0.4
    cands = [torch.randn(2, 3, space.dim(e.dest), dtype=torch.float64) for e in edges]
    eta = 0.3
    out = apply_update("eta_step", z, cands, alpha, edges, space, eta=eta)
    expected = z.clone()
    for i, e in enumerate(edges):  # z^(h) + η Σ_{e→h} α_e (φ_e − z^(h)), edge by edge
        s = space.slices[e.dest]
        expected[..., s] += eta * alpha[..., i : i + 1] * (cands[i] - z[..., s])
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("label", ["values", "keys", "training", "type"])
def test_a_grade_label_that_a_module_dict_cannot_hold_is_refused_naming_it(label):
    # the router's and the norm's per-grade nn.ModuleDicts raised a bare KeyError
    # ("attribute 'values' already exists") when the layer was built
    grades = [{"label": label, "dim": 2, "index": 0}, {"label": "x", "dim": 3, "index": 1}]
    with pytest.raises(ValueError, match=rf"grade label '{label}' is the name of an attribute "
                                         r"of nn\.ModuleDict.*expected another label"):
        build_morphic_model({"vocab_size": 5, "grades": grades, "layers": [{"banded": [0, 1]}]})


def test_masked_pair_softmax_refuses_a_bool_temperature_naming_it():
    from graded.morphic.edges import masked_pair_softmax

    mask = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"temperature must be a finite number > 0, got True"):
        masked_pair_softmax(torch.zeros(2, 2), mask, temperature=True)


@pytest.mark.parametrize("options, message", [
    ({"num_heads": True}, r"num_heads must be a positive int, got True"),
    ({"head_dim": True}, r"head_dim must be a positive int, got True"),
    ({"identity_values": 1}, r"identity_values must be True or False, got 1"),
])
def test_grade_typed_attention_refuses_bools_for_sizes_and_ints_for_flags(options, message):
    from graded.morphic.attention_block import GradeTypedAttention

    # True passed as one head of size 1; identity_values=1 dropped the value projection
    with pytest.raises(ValueError, match=message):
        GradeTypedAttention(4, 4, **options)


def test_calibration_refuses_a_bool_bin_count_naming_it():
    from graded.morphic.diagnostics import calibration

    # True was read as one bin
    with pytest.raises(ValueError, match=r"bins must be a positive int, got True"):
        calibration(torch.rand(8), torch.rand(8) > 0.5, bins=True)
