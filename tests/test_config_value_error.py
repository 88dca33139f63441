"""A refused config is a ConfigValueError (a ValueError) whose ``fields`` name the fields
blamed, in the order of its lines: callers (the Hugging Face converters) read the field from
it rather than from the message's text."""

import pytest

from graded import TransformerConfig
from graded._schema import ConfigValueError


@pytest.mark.parametrize("changes, fields", [
    ({"norm_eps": 0.0}, ("norm_eps",)),                    # a field's own check
    ({"n_heads": 3}, ("d_model",)),                        # a check across fields blames one
    ({"norm_eps": 0.0, "dropout": 2.0}, ("dropout", "norm_eps")),
    ({"no_such_key": 1}, ("no_such_key",)),                # an unknown key
])
def test_a_refused_config_names_the_fields_it_blames(changes, fields):
    with pytest.raises(ConfigValueError) as info:
        TransformerConfig(**{"vocab_size": 11, "d_model": 8, "n_heads": 2, "n_layers": 1,
                             **changes})
    assert sorted(info.value.fields) == sorted(fields)
    lines = str(info.value).splitlines()
    assert len(lines) == len(info.value.fields)
    for field, line in zip(info.value.fields, lines, strict=True):
        assert f"TransformerConfig.{field}" in line or f"unknown key {field!r}" in line


def test_an_assignment_refused_names_its_field_and_keeps_the_value():
    config = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1)
    with pytest.raises(ConfigValueError) as info:
        config.norm_eps = -1.0
    assert info.value.fields == ("norm_eps",) and config.norm_eps > 0
