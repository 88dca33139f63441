"""Resuming from one checkpoint folder (not a run folder): its scheduler state is loaded, the
peak learning rate now configured is used, and a state without a scheduler is named."""

import math

import pytest
import torch

from graded.train.checkpoint import STATE_FILE, save_checkpoint
from graded.train.resume import plan_resume
from graded.train.runs import run_view
from graded.train.schedules import make_scheduler
from graded.train.state_tensors import CheckpointError


def _parts(lr):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return model, opt, make_scheduler(opt, "cosine", warmup_steps=2, total_steps=10)


def _now():
    return run_view({}, options={}, seed=None, kind=None)


def test_a_checkpoint_folder_resumes_at_its_step_with_the_new_peak(tmp_path):
    model, opt, sched = _parts(0.1)
    for _ in range(4):
        opt.step()
        sched.step()
    ck = save_checkpoint(tmp_path / "ck", model, opt,
                         {"step": 4, "scheduler": sched.state_dict()})
    model2, opt2, sched2 = _parts(0.5)
    plan = plan_resume(ck, model2, opt2, sched2, _now())
    assert plan.step == 4 and plan.checkpoint == ck and plan.skipped == []
    assert sched2.last_epoch == 4
    # the new peak times the cosine multiplier at step 4: progress (4 − 2) / (10 − 2)
    expected = 0.5 * 0.5 * (1 + math.cos(math.pi * 0.25))
    assert opt2.param_groups[0]["lr"] == pytest.approx(expected)


def test_a_checkpoint_without_scheduler_state_is_named(tmp_path):
    model, opt, _ = _parts(0.1)
    ck = save_checkpoint(tmp_path / "ck", model, opt, {"step": 1})
    with pytest.raises(CheckpointError, match=rf"{STATE_FILE}: no usable scheduler state "
                                              r"\(KeyError\('scheduler'\)\)"):
        plan_resume(ck, *_parts(0.1), _now())
