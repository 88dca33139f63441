"""A model that another trainer trained (or loaded a checkpoint into) and that is given to a new
Trainer: the new run starts from those weights, not from the initialisation its config records,
and says so once (a ``RuntimeWarning`` and a ``warning`` event in ``history.jsonl``); a model as
built, and a resume of the trainer's own run, say nothing."""

from __future__ import annotations

import warnings

import pytest
from tiny_training import OPTIONS, Trainer, make_data, make_trainer

from graded.train.options import TrainOptions

STEPS = {"steps": 4, "eval_every": 4}


def _new_trainer(model, run_dir):
    return Trainer(model, make_data(96, 1), make_data(48, 2), kind="classification",
                   options=TrainOptions(**{**OPTIONS, **STEPS}), run_dir=run_dir, seed=0)


def _warnings_of(history):
    return [e["message"] for e in history if e["event"] == "warning"]


def test_a_model_trained_by_another_trainer_starts_a_run_that_says_so(tmp_path):
    first = make_trainer(tmp_path / "a", **STEPS)
    first.fit()
    second = _new_trainer(first.model, tmp_path / "b")
    with pytest.warns(RuntimeWarning, match=r"holds the training to step 4 of run .*a: this "
                                            r"run starts from those weights"):
        second.fit()
    [note] = _warnings_of(second.run.history())
    assert str(tmp_path / "a") in note and "fit(resume_from=...)" in note
    assert not _warnings_of(first.run.history())


def test_a_model_a_resume_loaded_is_named_by_its_checkpoint(tmp_path):
    make_trainer(tmp_path / "a", **STEPS).fit()
    loader = make_trainer(tmp_path / "loader", **STEPS)
    loader.prepare_resume(tmp_path / "a")
    second = _new_trainer(loader.model, tmp_path / "b")
    with pytest.warns(RuntimeWarning, match=r"holds checkpoint .*step_000000004 \(step 4\)"):
        second.fit()


def test_a_model_as_built_and_a_resume_of_the_own_run_say_nothing(tmp_path):
    trainer = make_trainer(tmp_path / "a", **STEPS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        trainer.fit(pause_after=2)
        trainer.fit(resume_from=tmp_path / "a")
    assert not _warnings_of(trainer.run.history())
