"""TransformerConfig on the shared schema: serialisation, validation and assignment."""

from __future__ import annotations

import math

import pytest

from graded.transformer.config import TransformerConfig


def test_config_round_trips_through_dict_and_json_and_replace_validates():
    cfg = TransformerConfig(d_model=16, n_heads=2, grading="linear", input_dim=3,
                            vocab_size=None, input_grades=[1.0, 2.0, 3.0])
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    assert TransformerConfig.from_json(cfg.to_json()) == cfg
    assert cfg.replace(d_model=32).d_model == 32 and cfg.d_model == 16
    assert (cfg.head_dim, cfg.ff_dim) == (8, 64)
    with pytest.raises(ValueError, match=r"TransformerConfig\.d_model=18 is invalid: expected a "
                                         r"multiple of n_heads=4"):
        cfg.replace(d_model=18, n_heads=4)


def test_a_bad_assignment_raises_naming_the_field_and_keeps_the_old_value():
    cfg = TransformerConfig(d_model=16, n_heads=2)
    cfg.grading = "exponential"  # assignments are validated, good ones kept
    assert cfg.grading == "exponential"
    with pytest.raises(ValueError, match=r"TransformerConfig\.d_model=16 is invalid: expected a "
                                         r"multiple of n_heads=3"):
        cfg.n_heads = 3
    with pytest.raises(ValueError, match=r"TransformerConfig\.norm='batch' is invalid"):
        cfg.norm = "batch"
    assert (cfg.n_heads, cfg.norm) == (2, "layer")
    cfg.validate()


@pytest.mark.parametrize("field, value", [("n_layers", True), ("d_model", 16.0),
                                          ("max_len", "8"), ("dropout", True),
                                          # pad_id took True as token 1 and "3" as 3
                                          ("pad_id", True), ("pad_id", "3"), ("pad_id", 1.0)])
def test_numbers_of_the_wrong_type_are_rejected_like_the_dataclass_did(field, value):
    with pytest.raises(ValueError, match=rf"TransformerConfig\.{field}={value!r} is invalid"):
        TransformerConfig(**{field: value})


@pytest.mark.parametrize(("fields", "pattern"), [
    # a token model used to drop input_dim (and input_grades over it) without a word
    (dict(input_dim=3), r"input_dim=3 is invalid: expected None for a token model "
                        r"\(vocab_size=256\): set vocab_size=None"),
    (dict(vocab_size=10, input_dim=2, grading="linear", input_grades=[1.0, 2.0]),
     r"input_dim=2 is invalid: expected None for a token model \(vocab_size=10\)"),
    # an ungraded model has no input grading to start at these grades
    (dict(vocab_size=None, input_dim=2, input_grades=[1.0, 2.0]),
     r"input_grades=\[1.0, 2.0\] is invalid: expected None on an ungraded model"),
    # a NaN grade passed the config and failed only when a model was built; True became 1.0
    (dict(vocab_size=None, input_dim=2, grading="linear", input_grades=[math.nan, 1.0]),
     r"input_grades=\[nan, 1.0\] is invalid: expected None or a list of finite grades"),
    (dict(vocab_size=None, input_dim=1, grading="linear", input_grades=[True]),
     r"input_grades=\[True\] is invalid: expected None or a list of finite grades"),
])
def test_inputs_a_model_would_ignore_or_misread_are_refused_naming_the_field(fields, pattern):
    with pytest.raises(ValueError, match=rf"TransformerConfig\.{pattern}"):
        TransformerConfig(**fields)


def test_unknown_keys_name_themselves_the_closest_field_and_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown TransformerConfig key\(s\) \['n_head'\] "
                                         r"\(did you mean 'n_heads'\?\); known keys are \[.*"
                                         r"'n_heads'"):
        TransformerConfig.from_dict({"n_head": 2})


_SWITCHES = [name for name, field in TransformerConfig.model_fields.items()
             if field.annotation in (bool, bool | None)]


@pytest.mark.parametrize("value", [1, 0, "yes", "false", 1.0])
@pytest.mark.parametrize("field", _SWITCHES)
def test_a_switch_takes_true_or_false_only_not_a_number_or_a_word(field, value):
    # 0 for tie_embeddings or "false" for grade_ffn would be read as a boolean without a word
    with pytest.raises(ValueError, match=rf"TransformerConfig\.{field}=.* expected .*True or "
                                         "False"):
        TransformerConfig(**{field: value})
    config = TransformerConfig()
    before = getattr(config, field)
    with pytest.raises(ValueError, match=rf"TransformerConfig\.{field}="):
        setattr(config, field, value)
    assert getattr(config, field) is before


def test_the_switches_are_every_boolean_field_and_take_true_and_false():
    assert {"norm_first", "bias", "tie_embeddings", "fold_grading", "final_norm",
            "qkv_bias", "grade_ffn", "token_grading"} <= set(_SWITCHES)
    assert TransformerConfig(norm_first=False, final_norm=True).final_norm is True
    assert TransformerConfig(qkv_bias=None).qkv_bias is None


@pytest.mark.parametrize("positional", ["rope", "alibi", "none"])
def test_graded_positions_without_position_vectors_are_refused_not_ignored(positional):
    # 000 Def 5.21 scales the added Pe(t); these encodings add none, so alpha changed nothing
    with pytest.raises(ValueError, match=rf"grade_position_alpha=0.1 is invalid: expected 0 "
                                         rf"with positional='{positional}'"):
        TransformerConfig(grading="exponential", positional=positional,
                          grade_position_alpha=0.1)
    # without graded positions, or on an ungraded model, alpha has nothing to act on anyway
    TransformerConfig(grading="exponential", positional=positional, grade_position_alpha=0.1,
                      grade_positions=False)
    TransformerConfig(positional=positional, grade_position_alpha=0.1)
    for table in ("sinusoidal", "sinusoidal1", "learned"):
        TransformerConfig(grading="exponential", positional=table, grade_position_alpha=0.1)
