"""TransformerConfig on the shared schema: serialisation, validation and assignment."""

from __future__ import annotations

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
                                          ("max_len", "8"), ("dropout", True)])
def test_numbers_of_the_wrong_type_are_rejected_like_the_dataclass_did(field, value):
    with pytest.raises(ValueError, match=rf"TransformerConfig\.{field}={value!r} is invalid"):
        TransformerConfig(**{field: value})


def test_unknown_keys_name_themselves_the_closest_field_and_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown TransformerConfig key\(s\) \['n_head'\] "
                                         r"\(did you mean 'n_heads'\?\); known keys are \[.*"
                                         r"'n_heads'"):
        TransformerConfig.from_dict({"n_head": 2})
