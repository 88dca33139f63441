"""A change of the config made at one resume is recorded in ``history.jsonl`` once: each
resume compares the new config against the config the run last ran with (the checkpoint's,
with the changes the history recorded since), not against the checkpoint's alone. A resume
from a checkpoint saved before the change (the resumed run stopped, paused or failed before
its next checkpoint) recorded the change again at every later resume, and a change undone
(back to the checkpoint's value) was not recorded at all."""

from __future__ import annotations

import pytest
from tiny_training import OPTIONS, make_trainer

from graded.train.runs import RunFolder

STEPS = {"steps": 12, "eval_every": 100}  # checkpoints at a pause, a stop and the end only


def _overrides(run) -> list[tuple]:
    return [(e["key"], e["old"], e["new"], e["step"]) for e in RunFolder(run).history()
            if e["event"] == "override"]


def _fail_at(trainer, failing_step: int):
    step = trainer._train_step

    def failing(s):
        if s == failing_step:
            raise RuntimeError("device lost")
        return step(s)

    trainer._train_step = failing
    return trainer


def test_a_change_made_at_a_resume_that_saved_no_checkpoint_is_recorded_once(tmp_path):
    run = tmp_path / "run"
    make_trainer(run, **STEPS).fit(pause_after=4)  # the checkpoint of step 4, lr 3e-3
    lr = 1e-2
    make_trainer(run, **STEPS, lr=lr).fit(resume_from=run, pause_after=4)  # no step, no save
    with pytest.raises(RuntimeError, match="device lost"):  # fails before its next save
        _fail_at(make_trainer(run, **STEPS, lr=lr), 6).fit(resume_from=run)
    assert make_trainer(run, **STEPS, lr=lr).fit(resume_from=run, pause_after=6).step == 6
    resumes = [e["step"] for e in RunFolder(run).history() if e["event"] == "resume"]
    assert resumes == [4, 4, 4]  # each from the checkpoint saved before the change
    assert _overrides(run) == [("train.lr", OPTIONS["lr"], lr, 4)]


def test_a_history_line_cut_short_is_no_event_and_the_next_event_gets_its_own_line(tmp_path):
    """The resume reads the history: a last line cut short by a writer killed mid-line
    is skipped (it failed the resume with a JSONDecodeError), and the events appended after
    it start on a line of their own (the resume event was glued to it and lost)."""
    run = tmp_path / "run"
    make_trainer(run, **STEPS).fit(pause_after=4)
    with (run / "history.jsonl").open("a") as fh:
        fh.write('{"event": "override", "key": "train.l')
    make_trainer(run, **STEPS, lr=1e-2).fit(resume_from=run, pause_after=4)
    events = [(e["event"], e["step"]) for e in RunFolder(run).history()]
    assert events == [("start", 0), ("end", 4), ("resume", 4), ("override", 4), ("end", 4)]
    assert _overrides(run) == [("train.lr", OPTIONS["lr"], 1e-2, 4)]


def test_a_change_undone_at_a_later_resume_is_recorded_as_undone(tmp_path):
    run = tmp_path / "run"
    make_trainer(run, **STEPS).fit(pause_after=4)
    make_trainer(run, **{**STEPS, "eval_every": 3}).fit(resume_from=run, pause_after=4)
    make_trainer(run, **STEPS).fit(resume_from=run, pause_after=5)  # back to 100
    assert _overrides(run) == [("train.eval_every", 100, 3, 4), ("train.eval_every", 3, 100, 4)]
    # the checkpoint of step 5 holds eval_every 100: a resume without a change records none
    make_trainer(run, **STEPS).fit(resume_from=run, pause_after=6)
    assert len(_overrides(run)) == 2


def test_a_new_run_in_the_folder_does_not_take_the_changes_of_the_run_before_it(tmp_path):
    """Changes recorded before the last ``start`` belong to an earlier run of the folder (one
    that ended before its first checkpoint, after which a new run may start there)."""
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="device lost"):
        _fail_at(make_trainer(run, **STEPS), 2).fit()
    folder = RunFolder(run)
    folder.append_history("override", key="train.lr", old=OPTIONS["lr"], new=1e-2, step=0)
    make_trainer(run, **STEPS).fit(pause_after=4)  # a new run: its own start
    make_trainer(run, **STEPS).fit(resume_from=run, pause_after=4)
    assert _overrides(run) == [("train.lr", OPTIONS["lr"], 1e-2, 0)]  # none recorded anew
