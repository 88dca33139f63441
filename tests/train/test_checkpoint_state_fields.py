"""``state.json`` is read with its fields checked: a ``step`` that is not an integer >= 0
(``true`` read as 1) and a ``sha256`` record that is not a map of digests (which skipped the
check of the tensor files it is there for) are refused by name, before any tensor is read."""

import json

import pytest
import torch

from graded.train import checkpoint as ck


def _checkpoint(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    path = ck.save_checkpoint(tmp_path / "step_000000001", model, opt, {"step": 1})
    return path, model, opt


def _edit(path, **fields):
    state = json.loads((path / ck.STATE_FILE).read_text())
    state.update(fields)
    (path / ck.STATE_FILE).write_text(json.dumps(state))


@pytest.mark.parametrize("step", [True, -1, 1.0, "1", None])
def test_a_step_that_is_not_an_integer_of_zero_or_more_is_refused_naming_it(tmp_path, step):
    path, model, opt = _checkpoint(tmp_path)
    _edit(path, step=step)
    with pytest.raises(ck.CheckpointError, match=r"'step' is .*expected an integer >= 0"):
        ck.load_checkpoint(path, model, opt)


@pytest.mark.parametrize("sums", [[], "abc", {"model.safetensors": 5},
                                  {"model.safetensors": "0" * 63}])
def test_a_sha256_record_that_is_not_a_map_of_digests_is_refused_not_skipped(tmp_path, sums):
    path, model, opt = _checkpoint(tmp_path)
    _edit(path, sha256=sums)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ck.CheckpointError, match="'sha256' is"):
        ck.load_checkpoint(path, model, opt)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())


def test_a_damaged_file_under_a_valid_record_is_still_caught_and_no_record_is_taken(tmp_path):
    path, model, opt = _checkpoint(tmp_path)
    data = (path / ck.MODEL_FILE).read_bytes()
    (path / ck.MODEL_FILE).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ck.CheckpointError, match=r"model\.safetensors"):
        ck.load_checkpoint(path, model, opt)
    path2, model2, opt2 = _checkpoint(tmp_path / "other")
    state = json.loads((path2 / ck.STATE_FILE).read_text())
    del state["sha256"]  # a record absent (not damaged): the files are read unchecked
    (path2 / ck.STATE_FILE).write_text(json.dumps(state))
    assert ck.load_checkpoint(path2, model2, opt2)["step"] == 1
