"""Checkpoint tensor files: the corrupt-file and wrong-state errors, and JSON conversion of
optimiser scalars (numpy values, one-element tensors) through a save/load round trip."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from graded.train.state_tensors import (
    CheckpointError,
    jsonable,
    load_model_state,
    load_optimizer_state,
    optimizer_from_flat,
    optimizer_to_flat,
    read_tensors,
)


def test_a_missing_file_is_named(tmp_path):
    path = tmp_path / "nope.safetensors"
    with pytest.raises(CheckpointError, match=rf"checkpoint file {path}: missing"):
        read_tensors(path)


def test_jsonable_converts_numpy_and_one_element_tensors():
    value = {1: (np.int64(3), np.float32(0.5)), "a": np.arange(3), "t": torch.tensor([2.5]),
             "n": None}
    out = jsonable(value)
    assert out == {"1": [3, 0.5], "a": [0, 1, 2], "t": 2.5, "n": None}
    assert type(out["1"][0]) is int and type(out["a"][0]) is int
    json.dumps(out)  # plain JSON types only


def test_jsonable_refuses_what_json_cannot_hold():
    with pytest.raises(TypeError, match=r"cannot store Tensor value tensor\(\[1\., 2\.\]\) in a "
                                        r"JSON checkpoint"):
        jsonable(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"cannot store set value \{1\}"):
        jsonable({1})


@pytest.mark.parametrize("aliases", ["not json", json.dumps({"b": "absent"}), json.dumps([1])])
def test_corrupt_alias_metadata_is_named(tmp_path, aliases):
    path = tmp_path / "m.safetensors"
    save_file({"weight": torch.ones(2, 2)}, str(path), metadata={"aliases": aliases})
    with pytest.raises(CheckpointError, match=rf"checkpoint file {path}: corrupt alias metadata"):
        load_model_state(torch.nn.Linear(2, 2, bias=False), path)


def test_optimizer_scalar_state_round_trips_through_json():
    p = torch.nn.Parameter(torch.ones(3))
    state_dict = {"state": {0: {"momentum_buffer": torch.arange(3.0), "steps": np.int64(4),
                                "scale": torch.tensor(0.25)}},
                  "param_groups": [{"params": [0], "lr": 0.1, "betas": (0.9, 0.99)}]}
    tensors, rest = optimizer_to_flat(state_dict)
    assert set(tensors) == {"state.0.momentum_buffer", "state.0.scale"}
    assert rest["scalars"] == {"0": {"steps": 4}}
    back = optimizer_from_flat(tensors, json.loads(json.dumps(rest)))
    assert back["state"][0]["steps"] == 4
    assert torch.equal(back["state"][0]["momentum_buffer"], torch.arange(3.0))
    assert back["param_groups"][0]["betas"] == (0.9, 0.99)  # the JSON list is a tuple again
    del p


def _sgd():
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1, momentum=0.9)


def test_load_optimizer_state_refuses_a_missing_rest(tmp_path):
    with pytest.raises(CheckpointError, match=r"state.json: holds no optimizer state"):
        load_optimizer_state(_sgd(), {}, None, path=tmp_path / "o.safetensors",
                             state_path=tmp_path / "state.json")


def test_load_optimizer_state_refuses_a_corrupt_rest(tmp_path):
    with pytest.raises(CheckpointError,
                       match=r"state.json: corrupt optimizer state \(KeyError\('scalars'\)\)"):
        load_optimizer_state(_sgd(), {}, {"param_groups": []}, path=tmp_path / "o.safetensors",
                             state_path=tmp_path / "state.json")


def test_load_optimizer_state_refuses_a_state_tensor_of_another_shape(tmp_path):
    opt = _sgd()
    tensors, rest = optimizer_to_flat(opt.state_dict())
    tensors["state.0.momentum_buffer"] = torch.zeros(4)
    before = opt.state_dict()
    with pytest.raises(CheckpointError, match=r"o.safetensors: optimizer state "
                                              r"state.0.momentum_buffer is \(4,\), its parameter "
                                              r"is \(3,\)"):
        load_optimizer_state(opt, tensors, rest, path=tmp_path / "o.safetensors",
                             state_path=tmp_path / "state.json")
    assert opt.state_dict() == before  # nothing loaded
