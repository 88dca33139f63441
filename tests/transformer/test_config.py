"""TransformerConfig on the shared schema: serialisation, validation and assignment."""

from __future__ import annotations

import math
import re

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
    # without graded positions alpha acts on nothing either: refused too (it was taken and
    # ignored); on an ungraded model it stays the setting of the grading it would have
    with pytest.raises(ValueError, match=r"grade_position_alpha=0.1 is invalid: expected its "
                                         r"default 0.0 \(or left out\): grade_positions=False"):
        TransformerConfig(grading="exponential", positional=positional,
                          grade_position_alpha=0.1, grade_positions=False)
    TransformerConfig(grading=None, positional=positional, grade_position_alpha=0.1)
    for table in ("sinusoidal", "sinusoidal1", "learned"):
        TransformerConfig(grading="exponential", positional=table, grade_position_alpha=0.1)


@pytest.mark.parametrize(("fields", "field", "backend", "options"), [
    ({"attn_backend": "sliding_window", "attn_backend_options": {"window": 0}},
     "attn_backend_options", "sliding_window", {"window": 0}),
    ({"attn_backend": "sliding_window", "attn_backend_options": {"window": True}},
     "attn_backend_options", "sliding_window", {"window": True}),
    ({"attn_backend": "sliding_window", "attn_backend_options": {"windw": 8}},
     "attn_backend_options", "sliding_window", {"windw": 8}),
    ({"attn_backend": "full", "attn_backend_options": {"window": 8}},
     "attn_backend_options", "full", {"window": 8}),
    ({"attn_backend": "linformer"}, "attn_backend_options", "linformer", {}),
    ({"attn_backend": "performer", "attn_backend_options": {"feature_type": "gaussian"}},
     "attn_backend_options", "performer", {"feature_type": "gaussian"}),
    ({"cross_attn_backend": "chunked", "cross_attn_backend_options": {"query_chunk": -1}},
     "cross_attn_backend_options", "chunked", {"query_chunk": -1}),
    ({"cross_attn_backend_options": {"scale": 0.0}},
     "cross_attn_backend_options", "full", {"scale": 0.0}),
])
def test_backend_options_the_backend_refuses_are_refused_when_the_config_is_made(
        fields, field, backend, options):
    """The options of ``attn_backend`` and ``cross_attn_backend`` meet the backend's own
    checks (``get_backend``) when the config is made, not first when a model is built: the
    message names the field, the backend and the backend's own error (the option and what it
    expects), which is the reference here."""
    from graded.attention.backends import get_backend
    from graded.config import ConfigError, validate_config

    with pytest.raises(ValueError) as reference:
        get_backend(backend, **options)
    expected = (f"TransformerConfig.{field}={options!r} is invalid: expected options that "
                f"backend {backend!r} accepts ({reference.value})")
    with pytest.raises(ValueError) as refused:
        TransformerConfig(**fields)
    assert str(refused.value).endswith(expected)
    cfg = TransformerConfig()
    with pytest.raises(ValueError, match=re.escape(expected)):  # assignments too
        for key, value in fields.items():
            setattr(cfg, key, value)
    with pytest.raises(ConfigError, match=re.escape(expected)):  # and a run config
        validate_config({"task": {"name": "dyck"}, "model": fields})


def test_backend_options_the_backend_takes_are_kept():
    cfg = TransformerConfig(attn_backend="sliding_window", attn_backend_options={"window": 8},
                            cross_attn_backend="chunked",
                            cross_attn_backend_options={"query_chunk": 4})
    assert cfg.attn_backend_options == {"window": 8}
    assert cfg.cross_attn_backend_options == {"query_chunk": 4}


FEATURES = dict(vocab_size=None, input_dim=3, d_model=8, n_heads=2, n_layers=1, max_len=8,
                d_ff=16, positional="learned")
WARM = dict(grade_init="warm_start", grade_init_value=0.3)  # grades away from neutral
# (the fields of a config that leaves one unread, the field, a value other than its default,
# the setting the message names)
UNREAD = [
    (dict(FEATURES, grading="linear", grade_input=False, **WARM), "input_grades",
     [0.0, 1.0, 2.0], "grade_input=False"),
    (FEATURES, "rope_base", 500.0, "positional='learned'"),
    (dict(FEATURES, grading="exponential"), "grade_init_value", 0.5, "grade_init='neutral'"),
    (dict(FEATURES, grading="exponential", grade_init="zeros"), "grade_init_value", 0.5,
     "grade_init='zeros'"),
    (dict(FEATURES, grading="linear", grade_positions=False, **WARM), "grade_position_alpha",
     0.01, "grade_positions=False"),
    (dict(FEATURES, grading="exponential", grade_attention=False, **WARM), "grades_per_head",
     True, "grade_attention=False"),
    (dict(FEATURES, grading="exponential", grade_attention=False, **WARM),
     "grade_attention_variant", "values", "grade_attention=False"),
    (dict(FEATURES, grading="exponential", **WARM), "token_grade_stages", ["ffn"],
     "token_grading=False"),
    (dict(FEATURES, grading="linear", grade_input=False, grade_ffn=False, **WARM),
     "grade_normalize", True, "grade_input=False and grade_ffn=False"),
]


@pytest.mark.parametrize(("fields", "field", "value", "setting"), UNREAD,
                         ids=[f"{f}-{s}" for _, f, _, s in UNREAD])
def test_a_field_the_config_leaves_unread_is_refused_naming_it_and_the_setting(
        fields, field, value, setting):
    """Each was taken and changed nothing (``input_grades`` with ``grade_input=False``, ...):
    refused away from its default, naming the field, its value and the setting that leaves it
    unread; its default stays accepted. The independent side: a model built with the field
    changed (the check bypassed) computes what one built without it computes."""
    import torch

    from graded.transformer import TransformerClassifier

    with pytest.raises(ValueError, match=rf"TransformerConfig\.{field}="
                                         rf"{re.escape(repr(value))} is invalid: expected its "
                                         rf"default .* \(or left out\): {re.escape(setting)}"):
        TransformerConfig(**fields, **{field: value})
    config = TransformerConfig(**fields)
    default = TransformerConfig.model_fields[field].get_default(call_default_factory=True)
    assert getattr(config.replace(**{field: default}), field) == default
    changed = config.model_copy(update={field: value})  # unchecked, as before the refusal
    x = torch.randn(2, 5, 3)
    models = []
    for cfg in (config, changed):
        torch.manual_seed(0)
        models.append(TransformerClassifier(cfg, num_outputs=2).eval())
    assert torch.equal(models[0](x), models[1](x))


def test_on_an_ungraded_config_the_gradings_fields_stay_its_settings():
    """``grading=None`` given alone turns grading off (the shipped configs' ungraded twins):
    the fields of the grading it would have are kept, and so are the other kind's f and base.
    (With ``grading`` left out they are refused: tests/transformer/
    test_config_trial_forgotten_grading.py.)"""
    TransformerConfig(grading=None, learnable_grades=True, grade_init_value=0.5,
                      grade_position_alpha=0.01, grade_positions=False, grades_per_head=True,
                      grade_attention=False)
    TransformerConfig(grading="linear", grading_base=3.0)
    TransformerConfig(grading="exponential", grading_f="softplus")
