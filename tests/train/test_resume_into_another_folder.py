"""A resume from a checkpoint of another folder starts a new run in the trainer's folder: it is
refused over a run already there (whose checkpoints it would replace step by step), as a fresh
run is, unless ``overwrite``; into a new folder, or from the folder's own checkpoints, it goes on
as before."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from tiny_training import make_trainer

from graded.train.runs import RunError

OPTIONS = {"steps": 12, "eval_every": 4, "lr": 1e-2}


def _contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "run.lock"}


@pytest.fixture
def runs(tmp_path) -> dict[str, Path]:
    """``own``: a finished run (another learning rate); ``source``: a run paused at step 4."""
    make_trainer(tmp_path / "own", **{**OPTIONS, "lr": 3e-3}).fit()
    make_trainer(tmp_path / "source", **OPTIONS).fit(pause_after=4)
    return {"own": tmp_path / "own", "source": tmp_path / "source"}


def test_a_resume_from_another_folder_over_a_run_is_refused_and_writes_nothing(runs):
    before = _contents(runs["own"])
    with pytest.raises(RunError, match=rf"run folder {runs['own']} already holds checkpoints "
                       rf"of its own run; resuming from {runs['source']}/checkpoints/"
                       r"step_000000004 there would write over them"):
        make_trainer(runs["own"], **OPTIONS).fit(resume_from=runs["source"])
    assert _contents(runs["own"]) == before


def test_with_overwrite_the_folder_then_holds_the_resumed_run_alone(runs, tmp_path):
    whole = make_trainer(tmp_path / "whole", **OPTIONS).fit()  # the source run, uninterrupted
    trainer = make_trainer(runs["own"], **OPTIONS)
    trainer.overwrite = True
    rest = trainer.fit(resume_from=runs["source"])
    assert rest.losses == whole.losses[4:]
    kept = sorted(p.name for p in (runs["own"] / "checkpoints").iterdir())
    assert kept == ["best.json", "step_000000008", "step_000000012"]  # no step 4 of the old run


def test_a_resume_into_a_new_folder_or_from_the_folders_own_checkpoint_goes_on(runs, tmp_path):
    whole = make_trainer(tmp_path / "whole", **OPTIONS).fit()
    rest = make_trainer(tmp_path / "new", **OPTIONS).fit(resume_from=runs["source"])
    assert rest.losses == whole.losses[4:]
    step4 = runs["source"] / "checkpoints" / "step_000000004"
    again = make_trainer(runs["source"], **OPTIONS).fit(resume_from=step4)
    assert again.losses == whole.losses[4:]
