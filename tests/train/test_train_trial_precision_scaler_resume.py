"""Resuming an fp16 run restores its gradient scaler exactly, and a checkpoint whose scaler
state cannot be resumed from is refused before anything is written (CheckpointError naming
its ``state.json`` and the field). Such a state used to be found only when loaded, after the
run folder's history was written (``KeyError: 'growth_factor'``, ``TypeError: string indices
must be integers``), and a state left out (null, ``{}`` or no key) resumed silently with a
fresh scaler at 2^16, no longer the interrupted run's."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from tiny_training import make_trainer

from graded.train.checkpoint import CheckpointManager
from graded.train.state_tensors import CheckpointError

FP16 = {"steps": 4, "warmup_steps": 0, "precision": "fp16", "eval_every": 100}


def _poison_first_step(trainer) -> None:
    """Infinite gradients in the first backward pass: the scaler skips step 1 and halves
    its scale to 2^15 (an independent trace of the state a resume must restore)."""
    calls = []

    def hook(grad):
        calls.append(None)
        return torch.full_like(grad, math.inf) if len(calls) == 1 else grad

    trainer.model.out.weight.register_hook(hook)


@pytest.fixture(scope="module")
def paused(tmp_path_factory):
    """An fp16 run paused after step 2, its step 1 skipped by the scaler."""
    run = tmp_path_factory.mktemp("paused") / "run"
    trainer = make_trainer(run, **FP16)
    _poison_first_step(trainer)
    first = trainer.fit(pause_after=2)
    return run, first.losses, trainer.scaler.state_dict()


def test_a_resumed_fp16_run_continues_with_the_scaler_it_paused_with(paused, tmp_path):
    run, first, at_pause = paused
    assert at_pause["scale"] == 2.0**15 and at_pause["_growth_tracker"] == 1
    whole = make_trainer(tmp_path / "whole", **FP16)
    _poison_first_step(whole)
    losses = whole.fit().losses
    resumed_run = tmp_path / "resumed"
    shutil.copytree(run, resumed_run)
    resumed = make_trainer(resumed_run, **FP16)
    rest = resumed.fit(resume_from=resumed_run).losses
    assert first + rest == losses  # bitwise
    # two taken steps after the halving, as in the uninterrupted run
    assert resumed.scaler.state_dict() == whole.scaler.state_dict()
    assert resumed.scaler.state_dict()["_growth_tracker"] == 3


@pytest.mark.parametrize(("state", "said"), [
    (None, r"it is None, expected the scaler's state \(a dict\) since train\.precision is "
           r"'fp16'"),
    ({}, r"scale is missing, expected a finite number > 0"),
    ({"scale": "x"}, r"scale is 'x', expected a finite number > 0"),
    ({"scale": float("nan")}, r"scale is nan, expected a finite number > 0"),
    ({"growth_factor": None}, r"growth_factor is None, expected a finite number > 1"),
    ({"_growth_tracker": 1.5}, r"_growth_tracker is 1\.5, expected an int >= 0"),
    ({"growth_interval": True}, r"growth_interval is True, expected an int >= 1"),
], ids=["null", "empty", "scale-str", "scale-nan", "growth-null", "tracker-float",
        "interval-bool"])
def test_an_unusable_scaler_state_is_refused_before_anything_is_written(paused, tmp_path,
                                                                         state, said):
    source, _, at_pause = paused
    run = tmp_path / "run"
    shutil.copytree(source, run)
    path = CheckpointManager(run / "checkpoints").path_for(2) / "state.json"
    meta = json.loads(path.read_text())
    meta["grad_scaler"] = state if state in (None, {}) else {**at_pause, **state}
    path.write_text(json.dumps(meta))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    trainer = make_trainer(run, **FP16)
    with pytest.raises(CheckpointError, match=rf"state\.json: no usable grad_scaler state "
                                              rf"\({said}\)"):
        trainer.fit(resume_from=run)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
