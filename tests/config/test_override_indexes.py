"""``--set`` with an index (``train.betas.0=0.8``): an item of a list the config holds is set
by its index; an index into a key that is absent, or that holds no list, is refused naming
the key, what it holds and the whole list to give instead. An absent ``betas`` used to be
started as the mapping ``{'0': 0.8}``, which the config then refused as a bad ``betas`` (or,
in a free-form section such as ``task.options``, kept as an option named ``'0'``)."""

from __future__ import annotations

import pytest
import yaml

from graded.cli import main
from graded.config import ConfigError, apply_overrides

TINY = {"name": "tiny",
        "task": {"name": "dyck", "options": {"max_length": 8, "max_depth": 3},
                 "n_train": 64, "n_eval": 32},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32,
                  "positional": "learned"},
        "train": {"steps": 2, "batch_size": 16, "warmup_steps": 1, "progress": False,
                  "tensorboard": False}}


def _refusal(data: dict, override: str) -> str:
    with pytest.raises(ConfigError) as exc:
        apply_overrides(data, [override])
    return str(exc.value)


def test_an_index_into_an_absent_list_is_refused_with_the_default_list_to_give():
    # TrainOptions' betas default to (0.9, 0.98): item 0 set to 0.8 is [0.8, 0.98]
    assert _refusal({"train": {"lr": 1e-3}}, "train.betas.0=0.8") == (
        "--set 'train.betas.0=0.8': train.betas is not in the config: there is no list to "
        "set item 0 of; give the whole list, e.g. --set train.betas=[0.8, 0.98]")
    assert _refusal({}, "train.betas.1=0.95").endswith("--set train.betas=[0.9, 0.95]")


def test_an_index_into_a_value_or_section_that_is_no_list_is_refused_naming_it():
    assert _refusal({"train": {"betas": 0.9}}, "train.betas.0=0.8") == (
        "--set 'train.betas.0=0.8': train.betas is 0.9, not a list, so it has no item 0; "
        "give the whole list, e.g. --set train.betas=[0.8, 0.98]")
    assert _refusal({"task": {"options": {"depth": 2}}}, "task.options.0=x") == (
        "--set 'task.options.0=x': task.options is a section (keys: depth), not a list, so "
        "it has no item 0; expected a key of it, or a list given whole: "
        "--set task.options=[x, ...]")
    # an item of a list that is itself no list; a key past the index is shown in the item
    layers = {"model": {"morphic": {"layers": [{"block": "ffn"}]}}}
    assert _refusal(layers, "model.morphic.layers.0.1.rank=4") == (
        "--set 'model.morphic.layers.0.1.rank=4': model.morphic.layers.0 is a section (keys: "
        "block), not a list, so it has no item 1; expected a key of it, or a list given "
        "whole: --set model.morphic.layers.0=[..., {rank: 4}, ...]")


def test_a_list_is_indexed_and_a_mapping_holding_the_digits_as_a_key_is_named_by_them():
    data = {"train": {"betas": [0.9, 0.98]}, "task": {"options": {"0": {"depth": 1}}}}
    out = apply_overrides(data, ["train.betas.0=0.8", "task.options.0.depth=3"])
    assert out == {"train": {"betas": [0.8, 0.98]}, "task": {"options": {"0": {"depth": 3}}}}
    assert _refusal(data, "train.betas.2=0.8") == (
        "--set 'train.betas.2=0.8': train.betas is a list of 2 item(s); expected an index 0 "
        "to 1, got '2'")


def test_the_command_line_gives_the_refusal_in_one_line_and_writes_nothing(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "output": {"dir": str(tmp_path / "runs")}}))
    assert main(["train", str(config), "--set", "train.betas.0=0.8"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        "graded: error: --set 'train.betas.0=0.8': train.betas is not in the config: there "
        "is no list to set item 0 of; give the whole list, e.g. "
        "--set train.betas=[0.8, 0.98]"]
    assert not (tmp_path / "runs").exists()
    # the list given whole, as the message says, is taken
    from graded.config import load_config

    cfg = load_config(config, ["train.betas=[0.8, 0.98]"])
    assert cfg.train.betas == (0.8, 0.98)
