"""A config key YAML 1.1 reads as a boolean or null (``on:``, ``yes:``, ``off:``, ``null:``) is
refused naming what was typed and how to quote it; it used to reach the key checks as True
("True: unknown key"), a name the user never wrote. Quoted, it is the name; as a value, the
boolean, as before."""

import pytest

from graded.config import read_config_file
from graded.config.sections import ConfigError


@pytest.mark.parametrize("typed, read", [("on", True), ("yes", True), ("off", False),
                                         ("null", None)])
def test_a_key_yaml_reads_as_a_boolean_or_null_is_refused_naming_what_was_typed(tmp_path, typed,
                                                                                read):
    path = tmp_path / "c.yaml"
    path.write_text(f"name: x\ntrain:\n  {typed}: 3\n")
    with pytest.raises(ConfigError) as info:
        read_config_file(path)
    message = str(info.value)
    assert f"the key '{typed}' is read by YAML as {read!r}" in message
    assert f"quote it ('{typed}')" in message and "line 3" in message


def test_a_quoted_key_is_the_name_and_a_value_stays_a_boolean(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nflags:\n  'on': 3\n  x: on\n")
    assert read_config_file(path)["flags"] == {"on": 3, "x": True}
