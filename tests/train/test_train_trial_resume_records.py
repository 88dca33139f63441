"""What a run records when it resumes from damaged or leftover state: ``metrics.json`` of a run
that runs no step holds its own figures, not those of a summary of another step it finds, and a
``best.json`` that does not read as written is rewound on resume, not an AttributeError nor a
CheckpointError at a later save's rotation."""

from __future__ import annotations

import json
import shutil
import signal

import pytest
from tiny_training import make_trainer

from graded.train.checkpoint import CheckpointManager


def _summary(run):
    return json.loads((run / "metrics.json").read_text())


def test_a_new_run_that_runs_no_step_does_not_report_the_figures_of_a_failed_one(tmp_path):
    """A run that failed at step 3, before its first checkpoint, leaves its metrics.json; a new
    run there (allowed: no checkpoint) paused before its first step reported step 3 and the
    failed run's training loss under its own status."""
    run = tmp_path / "run"
    failing = make_trainer(run, steps=12, eval_every=100)
    train_step = failing._train_step

    def step(s):
        if s == 3:
            raise RuntimeError("device lost")
        return train_step(s)

    failing._train_step = step
    with pytest.raises(RuntimeError):
        failing.fit()
    assert _summary(run)["step"] == 3
    make_trainer(run, steps=12, eval_every=100).fit(pause_after=0)
    summary = _summary(run)
    assert summary["status"] == "paused"
    assert summary["step"] == 0 and summary["train_loss"] is None and summary["error"] is None


def test_a_resume_past_a_damaged_checkpoint_that_runs_no_step_reports_its_own_step(tmp_path,
                                                                                checkpointed_run):
    """The summary found is of step 8, whose checkpoint is damaged; the resume from step 4
    that pauses at once is at step 4, and its best checkpoint is the one best.json names after
    the rewind, not the damaged step 8."""
    run = tmp_path / "run"
    shutil.copytree(checkpointed_run, run)
    assert _summary(run)["step"] == 8
    (run / "checkpoints" / "step_000000008" / "state.json").write_text("{")
    result = make_trainer(run, steps=12).fit(resume_from=run, pause_after=4)
    summary = _summary(run)
    assert result.step == summary["step"] == 4 and summary["status"] == "paused"
    best = CheckpointManager(run / "checkpoints").best()
    assert summary["best_checkpoint"] == str(best) == str(result.best_checkpoint)
    assert best.name == "step_000000004"


@pytest.mark.parametrize("text", ["[1, 2]", "null", '{"step": 4}',
                                  '{"step": 4, "checkpoint": "elsewhere"}'])
def test_a_best_json_that_does_not_read_as_written_is_rewound_on_resume(tmp_path,
                                                                        checkpointed_run, text):
    """best.json of another shape failed the resume with AttributeError; one without a
    checkpoint name was kept and failed the first save that was not a new best (its rotation
    reads best.json). The rewind names the checkpoint that set the best, as for a stale one."""
    run = tmp_path / "run"
    shutil.copytree(checkpointed_run, run)
    info = run / "checkpoints" / "best.json"
    before = json.loads(info.read_text())
    info.write_text(text)
    # checkpoints at 9, 10, 11 are not new bests (no evaluation there): each save rotates
    result = make_trainer(run, steps=12, checkpoint_every=1).fit(resume_from=run,
                                                                 pause_after=11)
    assert result.step == 11
    rewound = json.loads(info.read_text())
    assert rewound == before
    assert CheckpointManager(run / "checkpoints").best().name == before["checkpoint"]


def test_a_resume_from_the_checkpoint_of_step_0_logs_the_first_grades_once(tmp_path):
    """A run paused (or stopped by Ctrl-C) before its first step saves a checkpoint of step 0;
    its resume logged the step-0 grades a second time, so grades.jsonl held two step-0 lines
    where the uninterrupted run holds one."""
    from tiny_training import make_lm_trainer

    from graded.train.logging import read_grades

    graded = {"grading": "linear", "learnable_grades": True}
    make_lm_trainer(tmp_path / "full", "dyck", config=graded, steps=6).fit()
    run = tmp_path / "run"
    make_lm_trainer(run, "dyck", config=graded, steps=6).fit(pause_after=0)
    make_lm_trainer(run, "dyck", config=graded, steps=6).fit(resume_from=run)
    full = read_grades(tmp_path / "full")
    assert [r["step"] for r in full] == [0, 2, 4, 6]
    assert read_grades(run) == full


@pytest.mark.parametrize("stop", ["pause", "ctrl-c"])
def test_a_resume_into_a_new_folder_stopped_before_its_first_step_saves_its_checkpoint_there(
        tmp_path, monkeypatch, capsys, stop):
    """Resumed from another run's checkpoint of step 5 into an empty folder, and paused or
    interrupted before a step ran: the trainer took the checkpoint of step 5 for one of its own
    folder and saved nothing, so the message named a checkpoint that is not there and the new
    folder did not resume ("holds no checkpoint")."""
    from graded.train.shutdown import TrainerStopSignal

    full = make_trainer(tmp_path / "full", steps=12).fit()
    make_trainer(tmp_path / "src", steps=12).fit(pause_after=5)
    new = tmp_path / "new"
    source = tmp_path / "src" / "checkpoints" / "step_000000005"
    if stop == "ctrl-c":
        enter = TrainerStopSignal.__enter__

        def signalled(self):
            entered = enter(self)
            self._handler(signal.SIGINT, None)  # the first Ctrl-C, before a step
            return entered

        monkeypatch.setattr(TrainerStopSignal, "__enter__", signalled)
    first = make_trainer(new, steps=12).fit(resume_from=source,
                                            pause_after=5 if stop == "pause" else None)
    monkeypatch.undo()
    saved = new / "checkpoints" / "step_000000005"
    assert first.step == 5 and first.interrupted == (stop == "ctrl-c")
    assert first.last_checkpoint == saved and saved.is_dir()
    if stop == "ctrl-c":
        assert f"checkpoint saved in {saved}" in capsys.readouterr().err
    rest = make_trainer(new, steps=12).fit(resume_from=new)
    assert rest.losses == full.losses[5:]


def test_a_resume_that_runs_no_step_returns_the_checkpoint_it_resumed_from(tmp_path,
                                                                        checkpointed_run):
    run = tmp_path / "run"
    shutil.copytree(checkpointed_run, run)
    result = make_trainer(run, steps=12).fit(resume_from=run, pause_after=8)
    assert result.step == 8 and result.losses == []
    assert result.last_checkpoint == run / "checkpoints" / "step_000000008"


def test_a_new_run_in_a_folder_whose_checkpoints_were_removed_has_no_best_of_the_old_run(
        tmp_path, checkpointed_run):
    """The step folders removed by hand leave best.json naming step 8; a new run there without
    evaluation reported that name as its best checkpoint once it saved its own step 8, and kept
    it from rotation as the best."""
    from tiny_training import OPTIONS, TinyClassifier, make_data

    from graded.train.options import TrainOptions
    from graded.train.trainer import Trainer

    run = tmp_path / "run"
    shutil.copytree(checkpointed_run, run)
    for folder in (run / "checkpoints").glob("step_*"):
        shutil.rmtree(folder)
    options = TrainOptions(**{**OPTIONS, "steps": 8, "checkpoint_every": 4, "keep_last": 1})
    result = Trainer(TinyClassifier(), make_data(96, 1), None, kind="classification",
                     options=options, run_dir=run).fit()
    assert result.best_checkpoint is None and _summary(run)["best_checkpoint"] is None
    assert CheckpointManager(run / "checkpoints").steps() == [8]  # keep_last 1: 4 rotated


def test_a_resume_from_a_path_that_does_not_exist_is_refused_before_the_folder_is_made(tmp_path):
    """It was refused after the new run's folder and its lock file were made."""
    trainer = make_trainer(tmp_path / "new", steps=4)
    with pytest.raises(FileNotFoundError, match=r"resume_from '.*missing': no such file or "
                                                r"folder; expected a run folder or one of its "
                                                r"checkpoints"):
        trainer.fit(resume_from=tmp_path / "missing")
    assert not (tmp_path / "new").exists()
