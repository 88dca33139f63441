import inspect
from pathlib import Path

import pytest
import torch

from graded.morphic import MorphicConfig, MorphicTransformer, build_morphic_model

CONFIG = {
    "vocab_size": 12,
    "grades": [{"label": "g0", "dim": 8, "index": 0}, {"label": "g1", "dim": 8, "index": 1}],
    "layers": [
        {"banded": [0, 1], "block": "ffn", "block_options": {"hidden": 16}, "router": {"rank": 4}},
        {"edges": [["g0", "g1", "att"]], "block": "attention",
         "block_options": {"num_heads": 2, "head_dim": 4}, "update": "residual_typed"},
    ],
    "max_len": 16,
    "objective": {"omega": "entropy_bonus"},
}


def test_config_round_trips_and_builds_a_working_model():
    cfg = MorphicConfig.from_dict(CONFIG)
    assert MorphicConfig.from_dict(cfg.to_dict()) == cfg
    model = build_morphic_model(cfg)
    assert isinstance(model, MorphicTransformer)
    ids = torch.randint(0, 12, (2, 5))
    assert model(ids).shape == (2, 5, 12)
    loss, _ = model.training_loss(ids, ids)
    loss.backward()
    assert len(model.layers[0].edges) == 3  # g0←g0, g1←g0, g1←g1


def test_variable_addition_preset_builds_the_task_model():
    model = build_morphic_model({"preset": "variable_addition",
                                 "preset_options": {"p": 7, "shifts": [1, 3], "tool": "external"}})
    assert [e.name for e in model.layers[1].edges] == ["add_1", "add_3"]


def test_unknown_keys_are_rejected_with_their_names():
    with pytest.raises(ValueError, match="'colour'"):
        MorphicConfig.from_dict({**CONFIG, "colour": 1})
    bad = {**CONFIG, "layers": [{"banded": [0], "speed": 2}]}
    with pytest.raises(ValueError, match="'speed'"):
        MorphicConfig.from_dict(bad)


# --------------------------------------------------------------------------- typed layers


def test_a_typo_in_block_options_is_a_validation_error_naming_the_key_and_the_allowed_ones():
    bad = {**CONFIG, "layers": [{**CONFIG["layers"][0], "block_options": {"hiden": 16}}]}
    with pytest.raises(ValueError, match=r"layers\.0\.block_options=.* is invalid: expected "
                                         r"options of a 'ffn' block, not 'hiden' \(did you mean "
                                         r"'hidden'\?\); allowed keys: activation, bias, hidden"):
        MorphicConfig.from_dict(bad)
    attention = {**CONFIG["layers"][1], "block_options": {"hidden": 16}}
    with pytest.raises(ValueError, match=r"'attention' block, not 'hidden'.*head_dim"):
        MorphicConfig.from_dict({**CONFIG, "layers": [attention]})
    with pytest.raises(ValueError, match=r"router: unknown key 'rnak'"):
        MorphicConfig.from_dict({**CONFIG, "layers": [{"banded": [0], "router": {"rnak": 4}}]})


def _keywords(fn, skip):
    params = inspect.signature(fn).parameters
    return {n: p.default for n, p in params.items() if n not in ("self", *skip)}


def test_option_models_have_exactly_the_constructor_keywords_and_defaults():
    from graded.morphic import FFNBlock, GradeTypedAttention, LinearBlock, MorphicLayer, Router
    from graded.morphic.config import (
        BLOCK_OPTIONS,
        MorphicLayerSpec,
        RouterOptions,
    )

    constructors = {"linear": LinearBlock, "ffn": FFNBlock, "attention": GradeTypedAttention}
    assert set(BLOCK_OPTIONS) == set(constructors)
    for kind, options in BLOCK_OPTIONS.items():
        expected = _keywords(constructors[kind], ("d_in", "d_out", "d_src", "d_dst"))
        if kind == "ffn":  # the constructor requires hidden; the config defaults it
            assert expected.pop("hidden") is inspect.Parameter.empty
            expected["hidden"] = None
        assert options().model_dump() == expected, kind
    assert RouterOptions().model_dump() == _keywords(Router, ("space", "edges"))
    layer = _keywords(MorphicLayer, ("space", "edges", "blocks"))
    spec = MorphicLayerSpec(banded=[0]).model_dump(exclude={"edges", "banded", "dag", "block",
                                                            "block_options"})
    assert layer.pop("pre_norm") is None and spec.pop("pre_norm") == "layer"  # documented
    assert spec == {**layer, "router": None}


def test_defaults_are_the_same_in_python_and_in_yaml():
    import yaml

    from graded.morphic.config import (
        AttentionBlockOptions,
        FFNBlockOptions,
        GradeSpec,
        MorphicLayerSpec,
        RouterOptions,
    )

    text = (Path(__file__).parents[2] / "configs" / "dyck_morphic.yaml").read_text()
    from_yaml = MorphicConfig.from_dict({**yaml.safe_load(text)["model"]["morphic"],
                                         "vocab_size": 6, "max_len": 34})
    in_python = MorphicConfig(
        vocab_size=6, max_len=34,
        grades=[GradeSpec(label="g0", dim=32, index=0), GradeSpec(label="g1", dim=32, index=1)],
        layers=[MorphicLayerSpec(edges=[["g0", "g1", "attend"]], block="attention",
                                 block_options=AttentionBlockOptions(num_heads=2, head_dim=16),
                                 router=RouterOptions(rank=8)),
                MorphicLayerSpec(banded=[0, 1], block="ffn",
                                 block_options=FFNBlockOptions(hidden=64),
                                 router=RouterOptions(rank=8))],
        objective={"utility_weight": 0.1, "omega": "entropy_penalty", "omega_weight": 1e-3})
    assert in_python == from_yaml
    models = []
    for cfg in (from_yaml, in_python):
        torch.manual_seed(0)
        models.append(build_morphic_model(cfg))
    a, b = (m.state_dict() for m in models)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(layer.pre_norm is not None for layer in models[0].layers)


def test_variable_addition_preset_takes_the_vocabulary_and_length_of_its_data():
    from graded.morphic.tasks.adder import VariableAdditionTask

    vocab = VariableAdditionTask(7, [1, 3]).vocab_size  # p + |shifts| + 1 = 10
    options = {"p": 7, "shifts": [1, 3]}
    model = build_morphic_model({"preset": "variable_addition", "preset_options": options,
                                 "vocab_size": vocab, "max_len": 5})
    assert (model.vocab_size, model.max_len, model.pos.num_embeddings) == (vocab, 5, 5)
    with pytest.raises(ValueError, match=r"vocab_size=12 is invalid: expected the vocabulary "
                                         r"of preset 'variable_addition' .*, 10 tokens"):
        MorphicConfig(preset="variable_addition", preset_options=options, vocab_size=12)
    with pytest.raises(ValueError, match=r"max_len=2 is invalid: expected at least"):
        MorphicConfig(preset="variable_addition", max_len=2)
    with pytest.raises(ValueError, match=r"preset_options=.* not 'tol' \(did you mean 'tool'"):
        MorphicConfig(preset="variable_addition", preset_options={"tol": "external"})


def test_a_dag_layer_holds_exactly_its_edges_and_refuses_a_cycle_naming_it():
    """``dag: true`` on a layer builds ``EdgeSet.dag`` of the same edges (self-loops allowed);
    the cycle g0 → g1 → g0 found by hand below is the one the error names."""
    grades = CONFIG["grades"]
    acyclic = [["g0", "g1", "up"], ["g1", "g1", "stay"]]
    model = build_morphic_model({"vocab_size": 5, "grades": grades,
                                 "layers": [{"edges": acyclic, "dag": True}]})
    edges = model.layers[0].edges
    assert edges.acyclic and [[e.source, e.dest, e.name] for e in edges] == acyclic
    cyclic = {"vocab_size": 5, "grades": grades,
              "layers": [{"edges": acyclic}, {"edges": [*acyclic, ["g1", "g0", "down"]],
                                              "dag": True}]}
    with pytest.raises(ValueError, match=r"MorphicConfig.layers.1: edge set must be acyclic "
                                         r"\(self-loops allowed\), found cycle \['g0', 'g1', "
                                         r"'g0'\]"):
        build_morphic_model(cyclic)
    cyclic["layers"][1]["dag"] = False  # the same edges without the flag: an explicit set
    assert not build_morphic_model(cyclic).layers[1].edges.acyclic


@pytest.mark.parametrize(("layer", "message"), [
    ({"banded": [7]}, r"layers.0: banded shifts \[7\] give no edge.*indices \[0, 1\]"),
    ({"banded": [0], "pre_norm": "batch"},
     r"layers.0: pre_norm must be 'layer', 'rms' or None, got 'batch'"),
    ({"edges": [["g0", "g9", "x"]]}, r"layers.0: edge 'x' uses unknown grade 'g9'; expected "
                                     r"one of \['g0', 'g1'\]"),
])
def test_values_only_the_built_layer_checks_are_reported_with_the_layer_they_belong_to(
        layer, message):
    with pytest.raises(ValueError, match=message):
        build_morphic_model({"vocab_size": 5, "grades": CONFIG["grades"], "layers": [layer]})
