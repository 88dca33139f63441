"""Morphic configs: the cross-field and preset checks no other test reaches, each naming the
field, its value and what is expected."""

import pytest

from graded.morphic import MorphicConfig
from graded.morphic.config import FFNBlockOptions, LinearBlockOptions, MorphicLayerSpec

CONFIG = {
    "vocab_size": 12,
    "grades": [{"label": "g0", "dim": 8, "index": 0}, {"label": "g1", "dim": 8, "index": 1}],
    "layers": [{"banded": [0, 1], "block": "ffn", "block_options": {"hidden": 16},
                "router": {"rank": 4}}],
    "max_len": 16,
}
LAYER = CONFIG["layers"][0]
NO_BANDED = {k: v for k, v in LAYER.items() if k != "banded"}


@pytest.mark.parametrize("changes, message", [
    ({"layers": [{**LAYER, "router": {"rank": 4, "input_type": "context",
                                      "operator_tokens": [1]}}]},
     r"layers\.0\.router\.operator_tokens=\(1,\) is invalid: expected no operator_tokens with "
     r"input_type 'context'"),
    ({"layers": [{**LAYER, "block_options": [1]}]},
     r"layers\.0\.block_options=\[1\] is invalid: expected a mapping of 'ffn' block options"),
    ({"layers": [{**LAYER, "edges": [["g0", "g1", "x"]]}]},
     r"layers\.0\.edges=\[\['g0', 'g1', 'x'\]\] is invalid: expected exactly one of 'edges' or "
     r"'banded'"),
    ({"layers": [NO_BANDED]},
     r"layers\.0\.edges=None is invalid: expected exactly one of 'edges' or 'banded'"),
    ({"layers": [{**NO_BANDED, "edges": [["g0", "g1"]]}]},
     r"layers\.0\.edges=\[\['g0', 'g1'\]\] is invalid: expected \[source, dest, name\] triples"),
    ({"layers": [5]},  # not a mapping: left to pydantic, which names the value
     r"layers\.0=5 is invalid: expected a valid dictionary or instance of MorphicLayerSpec"),
    ({"objective": 3}, r"objective=3 is invalid: expected a mapping of MorphicObjective fields"),
    ({"objective": {"omegaa": 1}},
     r"objective=\{'omegaa': 1\} is invalid: expected MorphicObjective fields, not 'omegaa' "
     r"\(did you mean 'omega'\?\)"),
    ({"layers": []}, r"MorphicConfig\.layers is invalid: expected grades and layers \(or a "
                     r"preset\)"),
    ({"vocab_size": None}, r"vocab_size=None is invalid: expected a positive integer \(required "
                           r"without a preset\)"),
    ({"preset_options": {"p": 7}},
     r"preset_options=\{'p': 7\} is invalid: expected \{\} without a preset"),
    ({"preset": "variable_addition"},
     r"MorphicConfig\.layers is invalid: expected no grades or layers with preset "
     r"'variable_addition'"),
])
def test_a_bad_config_is_named(changes, message):
    with pytest.raises(ValueError, match=message):
        MorphicConfig.from_dict({**CONFIG, **changes})


def test_preset_options_the_preset_refuses_are_named():
    with pytest.raises(ValueError, match=r"(?s)preset_options=\{'p': 1\} is invalid: expected "
                                         r"options the preset accepts \(.*an int >= 2"):
        MorphicConfig.from_dict({"preset": "variable_addition", "preset_options": {"p": 1}})


def test_options_of_another_block_kind_are_checked_as_this_kind():
    with pytest.raises(ValueError, match=r"options of a 'ffn' block, not 'init'; allowed keys: "
                                         r"activation, bias, hidden"):
        MorphicLayerSpec(banded=[0, 1], block="ffn", block_options=LinearBlockOptions())
    spec = MorphicLayerSpec(banded=[0, 1], block="ffn", block_options=FFNBlockOptions(hidden=4))
    assert spec.block_options == FFNBlockOptions(hidden=4)
