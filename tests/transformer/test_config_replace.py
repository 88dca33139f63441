"""``replace`` keeps a field left out as left out: ``TransformerConfig().replace(
learnable_grades=True)`` is refused as ``TransformerConfig(learnable_grades=True)`` is (the
grading left out), while a config given ``grading=None`` (the ungraded twin of a graded config,
directly or through a dict round trip) keeps its grading fields through ``replace``. Every
config class gets the copy it got before."""

from __future__ import annotations

import pytest

from graded import TransformerConfig
from graded.morphic.config import MorphicConfig
from graded.search.patternboost import PatternBoostConfig

FORGOTTEN = r"TransformerConfig\.grading=None is invalid: expected 'linear' or 'exponential' "


@pytest.mark.parametrize("change", [{"learnable_grades": True}, {"grade_ffn": False},
                                    {"grading_base": 3.0, "d_model": 64}])
def test_replace_refuses_grading_fields_on_a_config_that_left_grading_out(change):
    with pytest.raises(ValueError, match=FORGOTTEN) as direct:
        TransformerConfig(**change)
    with pytest.raises(ValueError, match=FORGOTTEN) as replaced:
        TransformerConfig().replace(**change)
    assert str(replaced.value) == str(direct.value)
    assert "grading" not in TransformerConfig().replace(d_model=64).model_fields_set


def test_a_twin_given_grading_none_keeps_its_grading_fields_through_replace():
    twin = TransformerConfig(grading=None, learnable_grades=True, grade_init="constant",
                             grade_init_value=0.5)
    loaded = TransformerConfig.from_dict(twin.to_dict())  # a config file's round trip
    for config in (twin, loaded):
        copy = config.replace(d_model=64)
        assert (copy.d_model, copy.grading, copy.learnable_grades, copy.grade_init_value) == (
            64, None, True, 0.5)
        assert copy.replace(grading="linear").grading == "linear"


def test_replace_keeps_a_graded_configs_grading_and_its_fields():
    graded = TransformerConfig(grading="exponential", grading_base=3.0)
    copy = graded.replace(n_layers=3)
    assert (copy.grading, copy.grading_base, copy.n_layers) == ("exponential", 3.0, 3)
    assert copy.replace(grading=None).grading_base == 3.0  # the twin, given explicitly


@pytest.mark.parametrize(("config", "change"), [
    (TransformerConfig(d_model=32, n_heads=2, grading="linear", grade_ffn=False),
     {"n_layers": 3}),
    (PatternBoostConfig(problem="triangle-free", n=6, mode="local-only", rounds=3),
     {"rounds": 5, "model": {"d_model": 32, "n_heads": 2}}),
    (MorphicConfig(preset="variable_addition"), {"max_len": 300}),
], ids=["transformer", "patternboost", "morphic"])
def test_replace_gives_every_config_the_copy_a_dict_round_trip_gives(config, change):
    expected = type(config).from_dict({**config.to_dict(), **change}).to_dict()
    copy = config.replace(**change)
    assert copy.to_dict() == expected
    assert config.to_dict() != expected  # the original is unchanged


def test_replace_keeps_a_default_changed_in_place():
    config = PatternBoostConfig(n=6)
    config.model["d_model"] = 32  # the default dict, mutated: not in model_fields_set
    assert "model" not in config.model_fields_set
    assert config.replace(rounds=3).model == {"d_model": 32, "n_heads": 4, "n_layers": 2,
                                              "d_ff": 256}
