"""A newest checkpoint whose state cannot be used (its fp16 gradient scaler, scheduler or
stopper state damaged) is skipped for the newest older checkpoint that can, as one with a
damaged tensor file is: named in a warning and in the ``resume`` event of ``history.jsonl``.
The resume used to be refused at once, older checkpoints unread. It is refused only when no
checkpoint can be used, naming each one's problem."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
from tiny_training import make_trainer

from graded.train.checkpoint import CheckpointManager
from graded.train.runs import RunFolder
from graded.train.state_tensors import CheckpointError

FP16 = {"steps": 4, "warmup_steps": 0, "precision": "fp16", "eval_every": 100,
        "checkpoint_every": 2}
DAMAGE = {"grad_scaler": ("scale", "x", r"no usable grad_scaler state \(scale is 'x', "
                                        r"expected a finite number > 0\)"),
          "scheduler": ("last_epoch", "x", r"no usable scheduler state \(TypeError"),
          "stopper": (None, "junk", r"no usable stopper state \(AttributeError")}


def _fp16_trainer(run):
    """An fp16 trainer whose first backward pass gives infinite gradients: the scaler skips
    step 1 and halves its scale to 2^15, a state only a checkpoint's scaler state restores."""
    trainer = make_trainer(run, **FP16)
    calls = []

    def hook(grad):
        calls.append(None)
        return torch.full_like(grad, math.inf) if len(calls) == 1 else grad

    trainer.model.out.weight.register_hook(hook)
    return trainer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run's losses and scaler state, and a run paused after step 3
    (checkpoints 2 and 3)."""
    root = tmp_path_factory.mktemp("fp16")
    whole = _fp16_trainer(root / "whole")
    losses = whole.fit().losses
    _fp16_trainer(root / "paused").fit(pause_after=3)
    assert CheckpointManager(root / "paused" / "checkpoints").steps() == [2, 3]
    return (losses, whole.scaler.state_dict()), root / "paused"


def _damaged(source, tmp_path, part: str, steps: tuple[int, ...]):
    run = tmp_path / "run"
    shutil.copytree(source, run)
    field, value, _ = DAMAGE[part]
    for step in steps:
        path = CheckpointManager(run / "checkpoints").path_for(step) / "state.json"
        meta = json.loads(path.read_text())
        if field is None:
            meta[part] = value
        else:
            meta[part][field] = value
        path.write_text(json.dumps(meta))
    return run


@pytest.mark.parametrize("part", list(DAMAGE))
def test_a_newest_checkpoint_with_an_unusable_state_falls_back_to_the_one_before(
        runs, tmp_path, capsys, part):
    (whole, scaler), paused = runs
    run = _damaged(paused, tmp_path, part, (3,))
    step3 = CheckpointManager(run / "checkpoints").path_for(3)
    capsys.readouterr()
    trainer = make_trainer(run, **FP16)
    rest = trainer.fit(resume_from=run).losses
    assert rest == whole[2:]  # bitwise: steps 3 and 4 from checkpoint 2, its scaler included
    # step 1's halving to 2^15 kept (a fresh scaler starts at 2^16), three steps taken since
    assert trainer.scaler.state_dict() == scaler
    assert (scaler["scale"], scaler["_growth_tracker"]) == (2.0**15, 3)
    _, _, problem = DAMAGE[part]
    said = rf"checkpoint file {re.escape(str(step3 / 'state.json'))}: {problem}"
    err = capsys.readouterr().err
    assert re.search(rf"warning: skipped damaged checkpoint {re.escape(str(step3))}: {said}",
                     err), err
    resume = [e for e in RunFolder(run).history() if e["event"] == "resume"]
    assert [(e["step"], [p for p, _ in e["skipped"]]) for e in resume] == [(2, [str(step3)])]
    assert re.match(said, resume[0]["skipped"][0][1])


def test_a_resume_whose_checkpoints_all_have_an_unusable_scaler_is_refused_naming_each(
        runs, tmp_path):
    _, paused = runs
    run = _damaged(paused, tmp_path, "grad_scaler", (2, 3))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError) as exc:
        make_trainer(run, **FP16).fit(resume_from=run)
    message = str(exc.value)
    for step in (3, 2):
        state = CheckpointManager(run / "checkpoints").path_for(step) / "state.json"
        assert f"checkpoint file {state}: no usable grad_scaler state (scale is 'x'" in message
    assert message.startswith(f"{run / 'checkpoints'} holds no intact checkpoint: ")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
