"""Run configs written back and read again: every shipped config, the YAML a run folder keeps,
YAML 1.1's pitfalls refused or read as YAML 1.2 reads them, and keys of the wrong case."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from graded._io import dump_yaml
from graded.config import (
    ConfigError,
    apply_overrides,
    dump_config,
    load_config,
    parse_yaml,
    validate_config,
)

SHIPPED = sorted((Path(__file__).parents[1] / "configs").glob("*.[yt]*ml"))
BASE = {
    "task": {"name": "polynomial_regression", "n_train": 64, "n_eval": 32},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "grading": "linear"},
    "train": {"steps": 10, "batch_size": 16},
}


def _write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_written_back_reads_as_the_same_typed_config(path):
    cfg = load_config(path)
    text = dump_config(cfg)
    again = validate_config(parse_yaml(text), "written back")
    assert again.model_dump() == cfg.model_dump()
    assert again.built_model_config == cfg.built_model_config
    assert dump_config(again) == text  # a fixed point: writing it again changes nothing


@pytest.mark.parametrize("name", ["1e3", "-.5", "1:30", "010", "08", "λ-run ✓", "null", "yes"])
def test_a_run_name_that_reads_as_another_type_survives_the_run_folders_yaml(tmp_path, name):
    """The run name comes from the file stem (``1e3.yaml``): written plain, ``name: 1e3`` read
    back as the float 1000.0, and the run could not be resumed or reported."""
    cfg = load_config(_write(tmp_path, yaml.safe_dump(BASE), f"{name}.yaml"))
    assert cfg.name == name
    again = validate_config(parse_yaml(dump_config(cfg)))
    assert again.name == name


def test_text_is_written_as_text_not_escapes():
    data = {"name": "régression λ 🙂", "options": {"label": "ß"}}
    text = dump_yaml(data)
    assert "régression λ 🙂" in text and "\\u" not in text and "\\U" not in text
    assert parse_yaml(text) == data


@pytest.mark.parametrize("text", ["1e3", "1E-3", "-.5", ".5e3", "+.5", "010", "-010", "08",
                                  "1:30", "1:30.5", "0x10", "0b11", "1_000", ".inf", ".nan",
                                  "on", "No", "~", "null", "2024-01-01", "0", "12", "1.5"])
def test_every_string_dump_yaml_writes_reads_back_as_that_string(text):
    assert parse_yaml(dump_yaml({"v": text})) == {"v": text}


@pytest.mark.parametrize("text, value", [("1e-3", 1e-3), ("0.001", 0.001), ("1.0e-3", 1e-3),
                                         ("-.5", -0.5), ("+.5", 0.5), (".5e3", 500.0),
                                         ("1e3", 1000.0), ("-1E+2", -100.0)])
def test_floats_read_as_yaml_1_2_reads_them(text, value):
    """``-.5`` and ``.5e3`` were the text '-.5' and '.5e3' (YAML 1.1 reads a float with a
    leading dot only unsigned, with a signed exponent)."""
    read = parse_yaml(f"v: {text}")["v"]
    assert type(read) is float and read == value


@pytest.mark.parametrize("text, readings, fix", [
    ("010", "YAML 1.1 reads it as 8 (octal), YAML 1.2 as 10", "write 10 or 8"),
    ("-010", "YAML 1.1 reads it as -8 (octal), YAML 1.2 as -10", "write -10 or -8"),
    ("08", "YAML 1.1 reads it as text, YAML 1.2 as 8", "write 8"),
    ("1:30", "YAML 1.1 reads it as 90 (base 60), YAML 1.2 as text", "write 90"),
])
def test_a_number_yaml_1_1_and_1_2_read_differently_is_refused_naming_both(tmp_path, text,
                                                                            readings, fix):
    """``seed: 010`` was silently seed 8, ``steps: 1:30`` 90 steps."""
    head = yaml.safe_dump(BASE)
    path = _write(tmp_path, head + f"seed: {text}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    message = str(exc.value)
    assert f"{text} is ambiguous: {readings}; {fix}, or quote it ('{text}') for text" in message
    assert f"(line {len(head.splitlines()) + 1}, column 7)" in message and str(path) in message
    with pytest.raises(ConfigError, match=f"--set 'seed={text}': value does not parse: {text} "
                                          "is ambiguous"):
        apply_overrides(BASE, [f"seed={text}"])


def test_numbers_both_yaml_versions_read_alike_are_kept():
    assert parse_yaml("a: 0\nb: 10\nc: 0x10\nd: 1_000\ne: 0.5\nf: '010'\ng: 0:0") == {
        "a": 0, "b": 10, "c": 16, "d": 1000, "e": 0.5, "f": "010", "g": "0:0"}


def test_yaml_1_1_booleans_and_nulls_read_as_booleans_and_none():
    read = parse_yaml("a: on\nb: off\nc: yes\nd: No\ne: ~\nf: null\ng: NULL\nh: y")
    assert read == {"a": True, "b": False, "c": True, "d": False, "e": None, "f": None,
                    "g": None, "h": "y"}
    switches = parse_yaml("unseen: off\nplots: no\noverwrite: yes")
    cfg = validate_config({**BASE, "task": {**BASE["task"], "unseen": switches["unseen"]},
                           "output": {"plots": switches["plots"],
                                      "overwrite": switches["overwrite"]}})
    assert (cfg.task.unseen, cfg.output.plots, cfg.output.overwrite) == (False, False, True)


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "1e400"])
def test_an_infinite_or_nan_learning_rate_is_refused_naming_the_key(text):
    value = parse_yaml(f"v: {text}")["v"]
    assert math.isinf(value) or math.isnan(value)
    with pytest.raises(ConfigError, match=r"train\.lr"):
        validate_config({**BASE, "train": {**BASE["train"], "lr": value}})


def test_defaults_left_out_and_given_explicitly_give_the_same_config():
    explicit = {**BASE, "seed": 0, "task": {**BASE["task"], "split": "random", "unseen": True},
                "recipe": {"name": "auto", "options": {}},
                "output": {"dir": "runs", "overwrite": False, "plots": True}}
    assert validate_config(explicit).model_dump() == validate_config(BASE).model_dump()


@pytest.mark.parametrize("section, key, meant", [
    ("train", "LR", "lr"), ("train", "Batch_Size", "batch_size"), (None, "SEED", "seed"),
    ("task", "N_TRAIN", "n_train"), ("model", "D_Model", "d_model"), (None, "Train", "train"),
])
def test_a_key_of_the_wrong_case_is_named_with_the_key_it_stands_for(section, key, meant):
    """``train: {LR: ...}`` was refused with no suggestion (difflib reads 'LR' and 'lr' as
    nothing alike)."""
    data = {k: dict(v) for k, v in BASE.items()}
    (data[section] if section else data)[key] = 1
    where = f"{section}.{key}" if section else key
    with pytest.raises(ConfigError, match=f"{where}: unknown key \\(did you mean '{meant}'\\?\\)"):
        validate_config(data)
