"""A config that sets the grading's fields but leaves ``grading`` out builds an ungraded model
that reads none of them: it is refused, naming the fields, rather than trained as if graded.
``grading=None`` given explicitly (the ungraded twin of a graded config, ``--set
model.grading=null``) keeps them; a field at its default value is not "set"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import graded.transformer.config as config_module
from graded import TransformerConfig, TransformerLM
from graded.config.schema import load_config
from graded.transformer.graded import gradings

# a value other than its default for each grading field, valid for a graded config
AWAY = {"grading_f": "softplus", "grading_base": 3.0, "learnable_grades": True,
        "grades_per_head": True, "grade_init": "constant", "grade_init_value": 0.5,
        "grade_attention_variant": "queries_keys", "grade_input": False,
        "grade_positions": False, "grade_attention": False, "grade_ffn": False,
        "grade_output": False, "grade_normalize": True, "grade_position_alpha": 0.001,
        "fold_grading": False, "token_grade_stages": ["input"]}


def test_every_grading_field_has_a_value_away_from_its_default():
    assert set(AWAY) == set(config_module.GRADING_FIELDS)
    for name, value in AWAY.items():
        assert value != TransformerConfig.model_fields[name].get_default(
            call_default_factory=True), name


@pytest.mark.parametrize("name", sorted(AWAY))
def test_a_grading_field_without_grading_is_refused_naming_it(name):
    value = AWAY[name]
    with pytest.raises(ValueError, match=(
            r"TransformerConfig\.grading=None is invalid: expected 'linear' or 'exponential' "
            rf"for the grading settings {re.escape(f'{name}={value!r}')} to have effect")):
        TransformerConfig(**{name: value})


def test_the_error_names_every_field_set_and_only_those():
    with pytest.raises(ValueError) as info:
        TransformerConfig(learnable_grades=True, grade_init="warm_start",
                          grade_init_value=0.25, grade_ffn=True)  # grade_ffn: its default
    message = str(info.value)
    assert ("learnable_grades=True, grade_init='warm_start', grade_init_value=0.25 to have "
            "effect") in message
    assert "grade_ffn" not in message
    assert info.value.fields == ("grading",)


def test_an_assignment_that_forgets_grading_is_refused_and_undone():
    config = TransformerConfig()
    with pytest.raises(ValueError, match=r"grading settings learnable_grades=True"):
        config.learnable_grades = True
    assert config.learnable_grades is False


def test_default_values_given_explicitly_are_not_counted_as_set():
    defaults = {name: TransformerConfig.model_fields[name].get_default(
        call_default_factory=True) for name in AWAY}
    assert TransformerConfig(**defaults).grading is None


def test_grading_none_given_explicitly_keeps_the_fields_and_builds_the_ungraded_model():
    fields = dict(vocab_size=11, d_model=8, n_heads=2, n_layers=1, max_len=8)
    twin = TransformerConfig(grading=None, learnable_grades=True, grade_init="constant",
                             grade_init_value=0.5, **fields)
    assert (twin.learnable_grades, twin.grade_init_value) == (True, 0.5)
    assert gradings(TransformerLM(twin)) == {}
    graded = TransformerConfig(grading="exponential", learnable_grades=True, **fields)
    graded.grading = None  # assigned: the twin of a graded config
    assert graded.learnable_grades is True
    # and the graded config the fields were meant for builds its learnable grades
    model = TransformerLM(twin.replace(grading="linear"))
    assert all(isinstance(g.grades, torch.nn.Parameter) and bool((g.grades == 0.5).all())
               for g in gradings(model).values())


CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_and_their_documented_variants_still_load(path):
    """Each shipped config, and each ``--set`` variant its comments suggest (the ungraded
    twins ``--set model.grading=null`` among them)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    variants = [[]] + [re.findall(r"--set (\S+)", line) for line in text.splitlines()
                       if line.lstrip().startswith("#") and "--set" in line]
    for overrides in variants:
        load_config(path, overrides)
