"""A second Ctrl-C aborts a run at once, without a checkpoint of its step: ``metrics.json`` says
so in ``status`` (``aborted``), the word of ``history.jsonl``'s ``end`` event; it used to read
as ``"error": null, "interrupted": true`` alone, where the history said ``aborted``."""

from __future__ import annotations

import json
import os
import signal

import pytest
from tiny_training import make_trainer

from graded.train.checkpoint import CheckpointManager


def _signalled_twice_in_step(trainer, at: int):
    """The trainer's step, with two SIGINTs sent to this process during step ``at`` (counted
    from 1): the first asks for a stop after the step, the second aborts."""
    train_step = trainer._train_step

    def step(s):
        if s + 1 == at:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return train_step(s)

    return step


def test_a_second_ctrl_c_leaves_metrics_json_saying_aborted_as_the_history_does(tmp_path):
    run = tmp_path / "run"
    trainer = make_trainer(run, steps=12, checkpoint_every=2)
    trainer._train_step = _signalled_twice_in_step(trainer, at=5)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    summary = json.loads((run / "metrics.json").read_text())
    end = trainer.run.history()[-1]
    assert end["event"] == "end" and end["status"] == "aborted"
    assert summary["status"] == end["status"] == "aborted"
    assert summary["interrupted"] is True and summary["error"] is None
    assert summary["step"] == 4  # steps 1 to 4 ran; the fifth was aborted
    # no checkpoint of the aborted step: the last one is step 4's (checkpoint_every=2)
    assert CheckpointManager(run / "checkpoints").latest().name == "step_000000004"


@pytest.mark.parametrize(("options", "pause_after", "status"), [
    ({"steps": 4}, None, "finished"),
    ({"steps": 12}, 4, "paused"),
])
def test_metrics_json_status_of_a_run_that_ends_without_an_exception_is_the_historys(
        tmp_path, options, pause_after, status):
    run = tmp_path / "run"
    trainer = make_trainer(run, **options)
    trainer.fit(pause_after=pause_after)
    assert json.loads((run / "metrics.json").read_text())["status"] == status
    assert trainer.run.history()[-1]["status"] == status


def test_metrics_json_status_of_a_failed_run_is_failed_with_its_error(tmp_path):
    run = tmp_path / "run"
    trainer = make_trainer(run)
    trainer.evaluate = lambda: (_ for _ in ()).throw(RuntimeError("disk on fire"))
    with pytest.raises(RuntimeError, match="disk on fire"):
        trainer.fit()
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["status"] == trainer.run.history()[-1]["status"] == "failed"
    assert summary["error"] == "RuntimeError: disk on fire" and not summary["interrupted"]


def test_the_run_report_marks_an_aborted_run_aborted(tmp_path):
    from graded.train.report import write_runs_report

    run = tmp_path / "cut"
    trainer = make_trainer(run, steps=12)
    trainer._train_step = _signalled_twice_in_step(trainer, at=3)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    text = write_runs_report([run], tmp_path / "rep").read_text()
    assert "| cut | 2 (aborted) |" in text
    assert "- cut was aborted at step 2 of 12" in text


def _paused_run(run, steps=12, at=4):
    trainer = make_trainer(run, steps=steps)
    trainer.fit(pause_after=at)
    return json.loads((run / "metrics.json").read_text())


def test_a_resume_aborted_before_its_first_step_says_aborted_and_keeps_the_figures(tmp_path):
    """A resume that a second Ctrl-C stops before its first step wrote no new figures, and its
    metrics.json kept the paused session's ``status: paused`` while the history said
    ``aborted``."""
    run = tmp_path / "run"
    paused = _paused_run(run)
    resumed = make_trainer(run, steps=12)
    resumed._train_step = _signalled_twice_in_step(resumed, at=5)  # the resume's first step
    with pytest.raises(KeyboardInterrupt):
        resumed.fit(resume_from=run)
    summary = json.loads((run / "metrics.json").read_text())
    assert resumed.run.history()[-1]["status"] == summary["status"] == "aborted"
    assert summary["interrupted"] is True and summary["error"] is None
    kept = {k: v for k, v in summary.items() if k not in ("status", "error", "interrupted")}
    assert kept == {k: v for k, v in paused.items()
                    if k not in ("status", "error", "interrupted")}


def test_a_resume_that_fails_before_its_first_step_says_failed_with_its_error(tmp_path):
    run = tmp_path / "run"
    paused = _paused_run(run)
    resumed = make_trainer(run, steps=12)
    resumed._train_step = lambda s: (_ for _ in ()).throw(RuntimeError("device lost"))
    with pytest.raises(RuntimeError, match="device lost"):
        resumed.fit(resume_from=run)
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["status"] == resumed.run.history()[-1]["status"] == "failed"
    assert summary["error"] == "RuntimeError: device lost"
    assert summary["step"] == paused["step"] == 4


def test_a_resume_of_a_finished_run_keeps_its_summary(tmp_path):
    run = tmp_path / "run"
    trainer = make_trainer(run, steps=4)
    trainer.fit()
    before = json.loads((run / "metrics.json").read_text())
    again = make_trainer(run, steps=4)
    again.fit(resume_from=run)
    assert json.loads((run / "metrics.json").read_text()) == before
