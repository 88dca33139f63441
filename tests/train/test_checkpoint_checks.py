"""Checkpoint folders: the errors no other test reaches, each naming the file or value, and
best.json rewinding past a damaged best.json and a damaged checkpoint."""

import json

import pytest
import torch
from safetensors.torch import save_file

from graded.train.checkpoint import (
    OPTIM_FILE,
    STATE_FILE,
    CheckpointManager,
    read_checkpoint_state,
    read_rng_state,
    save_checkpoint,
)
from graded.train.state_tensors import CheckpointError


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 2)


def test_saving_over_an_existing_folder_is_refused(tmp_path):
    (tmp_path / "ck").mkdir()
    with pytest.raises(FileExistsError, match=rf"checkpoint folder {tmp_path / 'ck'} already "
                                              r"exists"):
        save_checkpoint(tmp_path / "ck", _model(), None, {"step": 1})


def test_a_folder_without_state_is_no_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match=rf"{STATE_FILE}: missing \({tmp_path} is not a "
                                              r"checkpoint folder\)"):
        read_checkpoint_state(tmp_path)


def test_rng_state_errors_name_the_file(tmp_path):
    ck = save_checkpoint(tmp_path / "ck", _model(), None, {"step": 1})
    optim = ck / OPTIM_FILE
    good = optim.read_bytes()
    optim.write_bytes(good[:20])
    with pytest.raises(CheckpointError, match=rf"{OPTIM_FILE}: truncated, corrupt or unreadable"):
        read_rng_state(ck)
    save_file({"state.0.x": torch.ones(1)}, str(optim))
    with pytest.raises(CheckpointError, match=rf"{OPTIM_FILE}: holds no RNG state"):
        read_rng_state(ck)
    optim.write_bytes(good)
    state = json.loads((ck / STATE_FILE).read_text())
    del state["rng"]
    (ck / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=rf"{STATE_FILE}: holds no RNG state"):
        read_rng_state(ck)


def test_keep_last_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match=r"keep_last must be >= 1, got 0"):
        CheckpointManager(tmp_path, keep_last=0)


def test_a_missing_root_has_no_steps_and_no_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path / "absent")
    assert manager.steps() == [] and manager.latest() is None
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'absent'} holds no checkpoint$"):
        manager.find_intact(_model())


def test_rewinding_a_damaged_best_json_skips_damaged_checkpoints_and_removes_it(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=5)
    model = _model()
    for step in (1, 2):
        manager.save(step, model, None, {"stopper": {"bad_evals": 0, "best": 0.5}})
    (manager.path_for(2) / STATE_FILE).write_text("{not json")  # step 2 damaged
    (tmp_path / "best.json").write_text("garbage")  # no readable step: rewind from scratch
    manager.rewind_best(2, 0.5)
    assert json.loads((tmp_path / "best.json").read_text()) == {
        "checkpoint": manager.path_for(1).name, "step": 1, "metric": 0.5}
    (tmp_path / "best.json").write_text("garbage")
    manager.rewind_best(2, 0.25)  # no intact checkpoint set this best: best.json goes
    assert not (tmp_path / "best.json").exists()


def test_rng_states_of_ranks_without_their_tensors_are_named(tmp_path):
    states = [({"rng.torch": torch.get_rng_state()}, {"python": [], "numpy": []})] * 2
    ck = save_checkpoint(tmp_path / "ck", _model(), None, {"step": 1}, rng=states)
    state = json.loads((ck / STATE_FILE).read_text())
    state["rng"]["ranks"]["2"] = {}  # a rank whose tensors optimizer.safetensors lacks
    (ck / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=rf"{STATE_FILE}: RNG state of rank 2: expected a "
                                              rf"JSON object here and rng.rank<r>.torch in "
                                              rf"{OPTIM_FILE}$"):
        read_rng_state(ck)
    state["rng"]["ranks"] = [1]
    (ck / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=rf"{STATE_FILE}: rng.ranks is a list; expected a "
                                              r"map of ranks to RNG states"):
        read_rng_state(ck)
