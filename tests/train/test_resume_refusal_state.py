"""A refused resume is all or nothing: every check that can refuse it (the config, train.steps,
the checkpoints' stopper and scheduler states) runs before the first tensor is loaded, so the
model, optimizer and scheduler are left bit for bit as they were, and a trainer as built still
trains a new run with a plain ``fit()``. A resume that fails while torch loads the tensors
leaves them part loaded: that trainer refuses a plain ``fit()``."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from tiny_training import make_trainer

from graded.train import checkpoint as ck
from graded.train.runs import RunError
from graded.train.state_tensors import CheckpointError, read_tensors

STEP8 = "step_000000008"


@pytest.fixture
def run(checkpointed_run, tmp_path) -> Path:
    """A copy of the run (conftest) with checkpoints at steps 4 and 8."""
    shutil.copytree(checkpointed_run, tmp_path / "run")
    return tmp_path / "run"


def _snapshot(trainer) -> dict:
    """Everything a resume could change: weights, optimizer and scheduler states (copies)."""
    return {"model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
            "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
            "scheduler": copy.deepcopy(trainer.scheduler.state_dict())}


def _assert_unchanged(trainer, before: dict) -> None:
    weights = trainer.model.state_dict()
    assert weights.keys() == before["model"].keys()
    assert all(torch.equal(before["model"][k], v) for k, v in weights.items())
    optimizer = trainer.optimizer.state_dict()
    assert optimizer["state"] == {} == before["optimizer"]["state"]  # no step: no moments
    assert optimizer["param_groups"] == before["optimizer"]["param_groups"]  # lrs included
    assert trainer.scheduler.state_dict() == before["scheduler"]


@pytest.mark.parametrize(("options", "error", "message"), [
    # train.steps is checked against the checkpoint's step: was checked after loading it
    ({"steps": 6}, RunError, r"train\.steps=6: its checkpoint .*step_000000008 is at step 8"),
    # a key a resume may not change: refused before loading, but a fit was refused after it
    ({"steps": 6, "batch_size": 8}, RunError, r"train\.batch_size was 16, now 8"),
], ids=["train.steps", "config"])
def test_a_refused_resume_leaves_the_trainer_as_built_for_a_new_run(run, tmp_path, options,
                                                                    error, message):
    fresh = make_trainer(tmp_path / "fresh", eval_every=4, **options).fit()
    trainer = make_trainer(tmp_path / "new", eval_every=4, **options)
    before = _snapshot(trainer)
    with pytest.raises(error, match=message):
        trainer.prepare_resume(run)
    _assert_unchanged(trainer, before)
    with pytest.raises(error, match=message):  # fit's own resume, refused the same way
        trainer.fit(resume_from=run)
    _assert_unchanged(trainer, before)
    again = trainer.fit()  # a new run of the trainer as built, as the fresh trainer's
    assert again.step == fresh.step == 6 and again.losses == fresh.losses


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("stopper", "junk", r"no usable stopper state \(AttributeError"),
    # loaded as it was, the multiplier at step "x" failed after the weights were loaded
    ("scheduler", "last_epoch", r"no usable scheduler state \(TypeError\(\"last_epoch is 'x'"),
], ids=["stopper", "scheduler"])
def test_a_checkpoint_state_that_cannot_be_used_refuses_before_anything_loads(
        run, tmp_path, key, value, problem):
    """Every checkpoint's state damaged (one older checkpoint that passes is resumed from:
    tests/train/test_resume_damaged_state_falls_back.py)."""
    for step in (4, 8):
        _damage_state(run / "checkpoints" / f"step_{step:09d}" / ck.STATE_FILE, key, value)
    state_file = run / "checkpoints" / STEP8 / ck.STATE_FILE
    trainer = make_trainer(tmp_path / "new", steps=8, eval_every=4)
    before = _snapshot(trainer)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(state_file))}: {problem}"):
        trainer.prepare_resume(run)
    _assert_unchanged(trainer, before)
    assert trainer._holds is None and trainer._plan is None  # a plain fit() may start


def _damage_state(state_file: Path, key: str, value) -> None:
    """Set ``key`` of a checkpoint's state to ``value`` (of the scheduler state: its ``value``
    to "x"); state.json carries no checksum of its own."""
    state = json.loads(state_file.read_text())
    if key == "scheduler":
        state["scheduler"][value] = "x"
    else:
        state[key] = value
    state_file.write_text(json.dumps(state))


def test_a_refused_resume_keeps_the_plan_prepared_before_it(run, tmp_path):
    shutil.copytree(run, tmp_path / "other")
    for step in (4, 8):
        _damage_state(tmp_path / "other" / "checkpoints" / f"step_{step:09d}" / ck.STATE_FILE,
                      "stopper", ["not", "a", "stopper"])
    trainer = make_trainer(tmp_path / "new", steps=8, eval_every=4)
    plan = trainer.prepare_resume(run)
    loaded = _snapshot(trainer)
    with pytest.raises(CheckpointError, match="no usable stopper state"):
        trainer.prepare_resume(tmp_path / "other")
    _assert_loaded_as(trainer, loaded)
    assert trainer._plan is plan  # fit(resume_from=run) starts from it, loading nothing again
    with pytest.raises(RunError, match=rf"already hold checkpoint .*{STEP8} \(step 8\)"):
        trainer.fit()


def _assert_loaded_as(trainer, loaded: dict) -> None:
    weights = trainer.model.state_dict()
    assert all(torch.equal(loaded["model"][k], v) for k, v in weights.items())
    moments = trainer.optimizer.state_dict()["state"]
    assert moments.keys() == loaded["optimizer"]["state"].keys()
    assert all(torch.equal(loaded["optimizer"]["state"][p][name], value)
               for p, state in moments.items() for name, value in state.items())
    assert trainer.scheduler.state_dict() == loaded["scheduler"]


def test_a_resume_that_fails_while_loading_still_refuses_a_plain_fit(run, tmp_path):
    trainer = make_trainer(tmp_path / "new", steps=8, eval_every=4)

    def fail(state):
        raise RuntimeError("optimizer load failed")

    trainer.optimizer.load_state_dict = fail  # torch's own loading fails after the weights
    with pytest.raises(RuntimeError, match="optimizer load failed"):
        trainer.prepare_resume(run)
    stored = read_tensors(run / "checkpoints" / STEP8 / ck.MODEL_FILE)[0]
    assert all(torch.equal(stored[k], v) for k, v in trainer.model.state_dict().items())
    with pytest.raises(RunError, match=rf"already hold what a resume from "
                                       rf"{re.escape(str(run))}\S* loaded"):
        trainer.fit()
    assert not (tmp_path / "new").exists()
