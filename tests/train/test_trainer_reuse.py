"""One trainer, one run: a second ``fit`` of the same trainer continues its run through
``resume_from``, and a ``fit()`` without it is refused once the model and optimizer are no
longer as built (it would restart the step, schedule and logs from the weights and optimizer
state of another run), before anything is written; a fit refused before its first step leaves
the trainer as built."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch
from tiny_training import make_trainer

from graded.train.runs import RunError
from graded.train.state_tensors import CheckpointError

OPTIONS = {"steps": 8, "eval_every": 4}


def _contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "run.lock"}


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_second_fit_without_resume_from_is_refused_and_changes_nothing(tmp_path, overwrite):
    trainer = make_trainer(tmp_path / "run", **OPTIONS)
    trainer.overwrite = overwrite  # replaces the folder's files, never the model's state
    trainer.fit()
    before, weights = _contents(tmp_path / "run"), _weights(trainer.model)
    message = (rf"this Trainer's model and optimizer already hold the training of an earlier "
               rf"fit\(\) \(to step 8\), so fit\(\) without resume_from would start a new run "
               rf"at step 0 .*fit\(resume_from={re.escape(repr(str(tmp_path / 'run')))}\)")
    with pytest.raises(RunError, match=message):
        trainer.fit()
    assert _contents(tmp_path / "run") == before
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())
    assert trainer.scheduler.last_epoch == 8  # the schedule was not stepped on


def test_a_paused_trainer_continues_through_resume_from_as_an_uninterrupted_run(tmp_path):
    whole = make_trainer(tmp_path / "whole", **OPTIONS).fit()
    trainer = make_trainer(tmp_path / "run", **OPTIONS)
    first = trainer.fit(pause_after=4)
    with pytest.raises(RunError, match=r"the training of an earlier fit\(\) \(to step 4\)"):
        trainer.fit()
    rest = trainer.fit(resume_from=tmp_path / "run")
    assert first.losses + rest.losses == whole.losses
    assert rest.step == 8 and rest.final_eval == whole.final_eval
    events = [e["event"] for e in trainer.run.history()]
    assert events == ["start", "end", "resume", "end"]


def test_a_fit_after_prepare_resume_is_refused_naming_the_checkpoint_it_loaded(tmp_path):
    make_trainer(tmp_path / "source", **OPTIONS).fit(pause_after=4)
    trainer = make_trainer(tmp_path / "new", **OPTIONS)
    trainer.prepare_resume(tmp_path / "source")
    step4 = tmp_path / "source" / "checkpoints" / "step_000000004"
    with pytest.raises(RunError, match=rf"already hold checkpoint {re.escape(str(step4))} "
                       rf"\(step 4\).*fit\(resume_from="
                       rf"{re.escape(repr(str(tmp_path / 'source')))}\)"):
        trainer.fit()
    assert not (tmp_path / "new").exists()


def test_a_fit_refused_before_its_first_step_leaves_the_trainer_as_built(tmp_path):
    fresh = make_trainer(tmp_path / "fresh", **OPTIONS).fit()
    make_trainer(tmp_path / "run", **{**OPTIONS, "lr": 1e-2}).fit()  # another run there
    trainer = make_trainer(tmp_path / "run", **OPTIONS)
    with pytest.raises(RunError, match="already holds checkpoints"):
        trainer.fit()
    trainer.overwrite = True
    again = trainer.fit()  # the model is still as built: a new run, as a fresh trainer's
    assert again.losses == fresh.losses


def test_a_plan_prepared_under_another_spelling_of_its_path_is_loaded_once(tmp_path,
                                                                          monkeypatch):
    import graded.train.run_state as trainer_module  # where prepare_resume calls it

    make_trainer(tmp_path / "run", **OPTIONS).fit(pause_after=4)
    calls = []
    plan_resume = trainer_module.plan_resume
    monkeypatch.setattr(trainer_module, "plan_resume",
                        lambda source, *a, **k: calls.append(source)
                        or plan_resume(source, *a, **k))
    monkeypatch.chdir(tmp_path)
    trainer = make_trainer(tmp_path / "run", **OPTIONS)
    trainer.prepare_resume("run")  # relative: fit below names it absolute, with a slash more
    result = trainer.fit(resume_from=f"{tmp_path}//run/")
    assert [Path(c) for c in calls] == [Path("run")] and result.step == 8


def test_a_fit_that_failed_after_steps_without_a_checkpoint_refuses_a_fresh_fit(tmp_path):
    trainer = make_trainer(tmp_path / "run", **OPTIONS)
    train_step = trainer._train_step

    def fail_at_step_3(step: int):
        if step == 2:
            raise RuntimeError("step 3 failed")
        return train_step(step)

    trainer._train_step = fail_at_step_3
    with pytest.raises(RuntimeError, match="step 3 failed"):
        trainer.fit()
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing in the folder says so
    trainer._train_step = train_step
    with pytest.raises(RunError, match=r"the training of an earlier fit\(\) \(to step 3\)"):
        trainer.fit()


def test_a_failed_prepare_resume_leaves_the_plan_made_before_it(tmp_path):
    whole = make_trainer(tmp_path / "whole", **OPTIONS).fit()
    make_trainer(tmp_path / "a", **OPTIONS).fit(pause_after=4)
    make_trainer(tmp_path / "b", **{**OPTIONS, "lr": 1e-2}).fit(pause_after=4)  # other weights
    damaged = tmp_path / "b" / "checkpoints" / "step_000000004" / "optimizer.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-8])  # found before any of b's weights load
    trainer = make_trainer(tmp_path / "new", **OPTIONS)
    trainer.prepare_resume(tmp_path / "a")
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors"):
        trainer.prepare_resume(tmp_path / "b")
    rest = trainer.fit(resume_from=tmp_path / "a")  # a's plan, not b's weights
    assert rest.losses == whole.losses[4:]


def test_a_closed_trainer_refuses_to_fit_before_writing(tmp_path, monkeypatch):
    """Under torchrun close() leaves the process group and unwraps the DDP model: a later fit
    would train each rank alone. Refused, on one process too, so a script behaves alike."""
    from graded.train import distributed as D

    monkeypatch.setattr(D, "setup", lambda device: D.DistContext(rank=0, world_size=2))
    monkeypatch.setattr(D, "wrap_model", lambda model, ctx: model)
    monkeypatch.setattr(D, "teardown", lambda ctx: None)
    for folder in ("torchrun", "one"):
        if folder == "one":
            monkeypatch.undo()
        trainer = make_trainer(tmp_path / folder, **OPTIONS)
        trainer.close()
        for resume_from in (None, tmp_path):
            with pytest.raises(RuntimeError, match=r"this Trainer is closed: close\(\) left its "
                               "process group"):
                trainer.fit(resume_from=resume_from)
        assert not (tmp_path / folder).exists()
