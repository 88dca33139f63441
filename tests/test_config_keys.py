"""Run-config keys: ``task.unseen`` reaches the split, and ``false`` switches off a key that can
be null in YAML, TOML and ``--set`` alike (TOML has no null)."""

from __future__ import annotations

import pytest
import yaml

from graded.config import ConfigError, build_data, load_config, validate_config

TINY_MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "positional": "learned"}
# Dyck words of length <= 8: few distinct words, so a draw of 96 repeats some
DYCK = {"name": "dyck", "options": {"max_length": 8, "max_depth": 3}, "n_train": 64,
        "n_eval": 32}


def _rows(tensor) -> set[tuple]:
    return {tuple(row) for row in tensor.reshape(len(tensor), -1).tolist()}


def _dyck_config(**task) -> dict:
    return {"task": {**DYCK, **task}, "model": dict(TINY_MODEL), "train": {"steps": 2}}


# --------------------------------------------------------------------------- task.unseen


def test_task_unseen_false_keeps_evaluation_inputs_that_occur_in_training():
    unseen = validate_config(_dyck_config())
    drawn = validate_config(_dyck_config(unseen=False))
    assert unseen.task.unseen is True and drawn.task.unseen is False
    train, test = build_data(unseen, unseen.built_task)
    assert not _rows(train.inputs) & _rows(test.inputs)  # generalisation to unseen words
    train_d, test_d = build_data(drawn, drawn.built_task)
    assert torch_equal(train_d.inputs, train.inputs)  # the same training set
    assert _rows(train_d.inputs) & _rows(test_d.inputs)  # the i.i.d. draw repeats some
    assert len(test_d) == 32
    # exactly the task's own split with unseen=False
    _, expected = drawn.built_task.split("random", 64, 32, seed=0, unseen=False)
    assert torch_equal(test_d.inputs, expected.inputs)


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def test_task_unseen_is_read_from_yaml_toml_and_set(tmp_path):
    base = tmp_path / "dyck.yaml"
    base.write_text(yaml.safe_dump({**_dyck_config(), "name": "dyck"}))
    assert load_config(base).task.unseen is True  # the default
    off = tmp_path / "off.yaml"
    off.write_text(yaml.safe_dump({**_dyck_config(unseen=False), "name": "dyck"}))
    toml = tmp_path / "dyck.toml"
    toml.write_text('name = "dyck"\n[task]\nname = "dyck"\nunseen = false\nn_train = 64\n'
                    'n_eval = 32\noptions = { max_length = 8, max_depth = 3 }\n'
                    '[model]\nd_model = 16\nn_heads = 2\nn_layers = 1\nd_ff = 32\n'
                    'positional = "learned"\n[train]\nsteps = 2\n')
    by_set = load_config(base, ["task.unseen=false"])
    dumps = [c.model_dump(mode="json") for c in (load_config(off), load_config(toml), by_set)]
    assert dumps[0] == dumps[1] == dumps[2] and dumps[0]["task"]["unseen"] is False
    with pytest.raises(ConfigError, match=r"task\.unseen: got 'sometimes'"):
        load_config(base, ["task.unseen=sometimes"])


# --------------------------------------------------------------------------- false = null

BASE = {"name": "run", "task": {"name": "polynomial_regression", "n_train": 64, "n_eval": 32},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "grading": "linear"},
        "recipe": {"name": "auto"},
        "train": {"steps": 10, "batch_size": 16, "clip_norm": 0.5, "grade_lr": 1e-3,
                  "early_stopping": {"patience": 2}}}
OFF = ["train.clip_norm", "train.grade_lr", "train.early_stopping", "model.grading"]
TOML_OFF = """name = "run"
[task]
name = "polynomial_regression"
n_train = 64
n_eval = 32
[model]
d_model = 16
n_heads = 2
n_layers = 1
grading = false
[recipe]
name = "auto"
[train]
steps = 10
batch_size = 16
clip_norm = false
grade_lr = false
early_stopping = false
"""


def _yaml(tmp_path, data, name="run.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _set_off(data: dict, value) -> dict:
    data = yaml.safe_load(yaml.safe_dump(data))
    for key in OFF:
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    return data


def test_false_and_null_switch_a_key_off_alike_in_yaml_toml_and_set(tmp_path):
    """TOML has no null: ``clip_norm = false`` is how it turns gradient clipping off, and
    YAML and ``--set`` accept the same spelling; all five give one resolved config."""
    toml = tmp_path / "run.toml"
    toml.write_text(TOML_OFF)
    on = _yaml(tmp_path, BASE, "on.yaml")
    configs = [
        load_config(_yaml(tmp_path, _set_off(BASE, None), "null.yaml")),
        load_config(_yaml(tmp_path, _set_off(BASE, False), "false.yaml")),
        load_config(toml),
        load_config(on, [f"{key}=null" for key in OFF]),
        load_config(on, [f"{key}=false" for key in OFF]),
    ]
    dumps = [c.model_dump(mode="json") for c in configs]
    assert all(d == dumps[0] for d in dumps)
    train = dumps[0]["train"]
    assert train["clip_norm"] is None and train["grade_lr"] is None
    assert train["early_stopping"] is None and "grading" in dumps[0]["model"]
    assert dumps[0]["model"]["grading"] is None
    assert configs[2].built_model_config.grading is None  # ungraded
    assert configs[2].recipe_name() == "plain"
    # left out, clipping is on at its default
    assert load_config(on, ["train.clip_norm=1.0"]).train.clip_norm == 1.0


def test_false_is_kept_for_keys_that_take_booleans_and_true_is_no_number(tmp_path):
    path = _yaml(tmp_path, BASE)
    cfg = load_config(path, ["model.qkv_bias=false", "train.progress=false"])
    assert cfg.model.transformer_fields()["qkv_bias"] is False  # no bias, not the default
    assert cfg.train.progress is False
    with pytest.raises(ConfigError, match=r"train\.clip_norm: got True; expected a number, "
                                          r"not a boolean, or false or null for off"):
        load_config(path, ["train.clip_norm=true"])
    with pytest.raises(ConfigError, match=r"train\.steps: got False; expected a number, not "
                                          r"a boolean$"):
        load_config(path, ["train.steps=false"])  # steps cannot be off


def test_a_section_switched_off_with_false_is_turned_on_by_a_key_inside_it(tmp_path):
    path = _yaml(tmp_path, {**BASE, "train": {**BASE["train"], "early_stopping": False}})
    assert load_config(path).train.early_stopping is None
    cfg = load_config(path, ["train.early_stopping.patience=3"])
    assert cfg.train.early_stopping.patience == 3
