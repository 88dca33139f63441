"""The best checkpoint is the best monitored value, strictly; ``early_stopping.min_delta`` only
decides which evaluations count for the patience; both are saved and resumed exactly."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from tiny_training import make_trainer

from graded.train.checkpoint import CheckpointManager, read_checkpoint_state
from graded.train.logging import read_metrics
from graded.train.stopping import Stopper

# The tiny classifier's eval loss falls by 0.0001 to 0.0016 per evaluation over these 16 steps
# (eval_every 2), so a min_delta of 0.003 counts only some of its improvements: the step-8
# evaluation beats step 2's by more than 0.003, no later one beats step 8's by that much.
MIN_DELTA = 0.003
OPTIONS = {"steps": 16, "eval_every": 2, "keep_last": 10}
STOP = {**OPTIONS, "early_stopping": {"patience": 3, "min_delta": MIN_DELTA}}


def _eval_losses(run: Path) -> list[tuple[int, float]]:
    return read_metrics(run)["eval"]["loss"]


def _argmin(curve: list[tuple[int, float]]) -> tuple[int, float]:
    """The step and value of the lowest loss, the first of equal ones."""
    return min(curve, key=lambda point: (point[1], point[0]))


def _counted_improvements(curve: list[tuple[int, float]], min_delta: float,
                          patience: int | None = None) -> tuple[list[int], int | None]:
    """Keras' EarlyStopping over ``curve``, a naive loop: the steps whose loss beat the last
    counted one by more than ``min_delta``, and the step the run stops at (None: it does not)."""
    counted, reference, waited = [], None, 0
    for step, loss in curve:
        if reference is None or loss < reference - min_delta:
            counted.append(step)
            reference, waited = loss, 0
        else:
            waited += 1
            if patience is not None and waited >= patience:
                return counted, step
    return counted, None


def _best_json(run: Path) -> dict:
    return json.loads((run / "checkpoints" / "best.json").read_text())


def _final_state(run: Path) -> dict:
    return read_checkpoint_state(CheckpointManager(run / "checkpoints").latest())["stopper"]


def test_the_best_checkpoint_has_the_lowest_eval_loss_whatever_min_delta(tmp_path):
    result = make_trainer(tmp_path, **OPTIONS,
                          early_stopping={"patience": 100, "min_delta": MIN_DELTA}).fit()
    curve = _eval_losses(tmp_path)
    step, loss = _argmin(curve)
    counted, _ = _counted_improvements(curve, MIN_DELTA)
    assert counted[-1] != step  # min_delta skips the improvement that made the best
    assert _best_json(tmp_path) == {"checkpoint": f"step_{step:09d}", "step": step,
                                    "metric": loss}
    # graded eval's default checkpoint, and metrics.json's best
    assert CheckpointManager(tmp_path / "checkpoints").best().name == f"step_{step:09d}"
    assert result.best_checkpoint.name == f"step_{step:09d}" and result.best_metric == loss
    assert json.loads((tmp_path / "metrics.json").read_text())["best"] == loss


def test_min_delta_decides_only_when_early_stopping_stops(tmp_path):
    # the curve of the run without early stopping; the run with it follows it to its stop
    make_trainer(tmp_path / "free", **OPTIONS).fit()
    curve = _eval_losses(tmp_path / "free")
    counted, stop = _counted_improvements(curve, MIN_DELTA, patience=3)
    assert stop is not None and stop < OPTIONS["steps"]
    result = make_trainer(tmp_path / "stop", **STOP).fit()
    assert result.early_stopped and result.step == stop
    until_stop = [(s, v) for s, v in curve if s <= stop]
    assert _eval_losses(tmp_path / "stop") == until_stop
    step, loss = _argmin(until_stop)
    assert _best_json(tmp_path / "stop")["step"] == step and result.best_metric == loss
    state = _final_state(tmp_path / "stop")
    reference = dict(curve)[counted[-1]]
    assert state == {"best": loss, "best_step": step, "reference": reference, "bad_evals": 3}


@pytest.mark.parametrize("pause", [6, 10])
def test_a_run_paused_where_best_and_reference_differ_resumes_bit_for_bit(tmp_path, pause):
    full = make_trainer(tmp_path / "full", **STOP).fit()
    first = make_trainer(tmp_path / "part", **STOP).fit(pause_after=pause)
    paused = read_checkpoint_state(CheckpointManager(tmp_path / "part" / "checkpoints")
                                   .path_for(pause))["stopper"]
    rest = make_trainer(tmp_path / "part", **STOP).fit(resume_from=tmp_path / "part")
    assert first.losses + rest.losses == full.losses
    assert (rest.step, rest.early_stopped) == (full.step, full.early_stopped)
    assert _best_json(tmp_path / "part") == _best_json(tmp_path / "full")
    assert _best_json(tmp_path / "full")["step"] == _argmin(_eval_losses(tmp_path / "full"))[0]
    assert paused["best"] != paused["reference"] and paused["bad_evals"] > 0  # both mattered
    assert rest.best_metric == full.best_metric
    assert _final_state(tmp_path / "part") == _final_state(tmp_path / "full")
    summaries = [json.loads((tmp_path / run / "metrics.json").read_text())
                 for run in ("part", "full")]
    assert summaries[0]["best"] == summaries[1]["best"] == full.best_metric


def _as_one_value(checkpoint: Path) -> dict:
    """Rewrite the checkpoint's stopper as one holding one value (best and bad_evals)."""
    path = checkpoint / "state.json"
    state = json.loads(path.read_text())
    state["stopper"] = {"best": state["stopper"]["best"],
                        "bad_evals": state["stopper"]["bad_evals"]}
    path.write_text(json.dumps(state))
    return state["stopper"]


def test_a_checkpoint_holding_one_value_resumes_with_it_as_best_and_reference(tmp_path):
    # without min_delta the one value was both: the resumed run is the uninterrupted one
    full = make_trainer(tmp_path / "full", **OPTIONS).fit()
    first = make_trainer(tmp_path / "part", **OPTIONS).fit(pause_after=6)
    manager = CheckpointManager(tmp_path / "part" / "checkpoints")
    old = _as_one_value(manager.path_for(6))
    rest = make_trainer(tmp_path / "part", **OPTIONS).fit(resume_from=tmp_path / "part")
    assert first.losses + rest.losses == full.losses
    assert _best_json(tmp_path / "part") == _best_json(tmp_path / "full")
    # with a min_delta, the one value is the reference of early stopping too
    trainer = make_trainer(tmp_path / "other", **STOP)
    shutil.copytree(tmp_path / "part", tmp_path / "again")
    for step in manager.steps():
        if step > 6:
            shutil.rmtree(CheckpointManager(tmp_path / "again" / "checkpoints").path_for(step))
    plan = trainer.prepare_resume(tmp_path / "again")
    assert plan.step == 6
    assert plan.stopper == Stopper(best=old["best"], best_step=None, reference=old["best"],
                                   bad_evals=old["bad_evals"])


def test_resuming_past_a_damaged_best_names_the_best_loss_not_the_last_counted_one(tmp_path):
    # step 16 holds the best and is damaged: the run resumed from step 14 names the checkpoint
    # the uninterrupted run named at step 14, the lowest loss up to it
    options = {**OPTIONS, "early_stopping": {"patience": 100, "min_delta": MIN_DELTA}}
    make_trainer(tmp_path / "run", **options).fit()
    make_trainer(tmp_path / "upto14", **options).fit(pause_after=14)
    damaged = CheckpointManager(tmp_path / "run" / "checkpoints").path_for(16)
    (damaged / "model.safetensors").write_bytes(b"garbage")
    (tmp_path / "run" / "checkpoints" / "best.json").write_text(json.dumps(
        {"checkpoint": damaged.name, "step": 16, "metric": 0.0}))
    make_trainer(tmp_path / "run", **options).fit(resume_from=tmp_path / "run", pause_after=14)
    step, loss = _argmin([(s, v) for s, v in _eval_losses(tmp_path / "run") if s <= 14])
    counted, _ = _counted_improvements(_eval_losses(tmp_path / "run"), MIN_DELTA)
    assert counted[-1] != step
    assert _best_json(tmp_path / "run") == _best_json(tmp_path / "upto14") == {
        "checkpoint": f"step_{step:09d}", "step": step, "metric": loss}


def test_stopper_counts_improvements_by_min_delta_and_keeps_the_strict_best():
    # monitor_mode max (an accuracy), min_delta 0.1: a worked sequence
    stopper, bests = Stopper(), []
    for step, value in enumerate([0.5, 0.55, 0.62, 0.62, 0.7, 0.65], start=1):
        bests.append(stopper.observe(value, step, mode="max", min_delta=0.1))
    assert bests == [True, True, True, False, True, False]  # a tie is not a new best
    # counted: 0.5 (step 1), then 0.62 > 0.5 + 0.1 (step 3); 0.7 is not > 0.62 + 0.1
    assert stopper == Stopper(best=0.7, best_step=5, reference=0.62, bad_evals=3)
    assert stopper.stopped(3) and not stopper.stopped(4) and not stopper.stopped(None)
    assert Stopper.from_state(stopper.to_state()) == stopper


@pytest.mark.parametrize("when", ["during the last step", "during the save"])
def test_a_ctrl_c_after_the_last_step_of_a_pause_reports_an_interruption(tmp_path, monkeypatch,
                                                                         when):
    """A SIGINT during the last step before ``pause_after``, or during the checkpoint the pause
    writes, is a first Ctrl-C: the checkpoint is written and ``fit`` reports the run
    interrupted (a loop that resumes paused runs stops), not paused."""
    full = make_trainer(tmp_path / "full", steps=12).fit()
    trainer = make_trainer(tmp_path / "part", steps=12)
    if when == "during the last step":
        train_step = trainer._train_step

        def signalled_step(step):
            if step + 1 == 6:
                os.kill(os.getpid(), signal.SIGINT)
            return train_step(step)

        monkeypatch.setattr(trainer, "_train_step", signalled_step)
    else:
        save = CheckpointManager.save

        def signalled_save(self, step, *args, **kwargs):
            if step == 6:
                os.kill(os.getpid(), signal.SIGINT)
            return save(self, step, *args, **kwargs)

        monkeypatch.setattr(CheckpointManager, "save", signalled_save)
    first = trainer.fit(pause_after=6)
    monkeypatch.undo()
    assert first.step == 6 and first.interrupted
    assert json.loads((tmp_path / "part" / "metrics.json").read_text())["interrupted"] is True
    assert trainer.run.history()[-1]["status"] == "interrupted"
    assert CheckpointManager(tmp_path / "part" / "checkpoints").latest().name == "step_000000006"
    rest = make_trainer(tmp_path / "part", steps=12).fit(resume_from=tmp_path / "part")
    assert first.losses + rest.losses == full.losses


@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_nan_evaluation_is_never_the_best_and_counts_as_no_improvement(mode):
    """Every comparison with NaN is false: the first evaluation, if NaN, became the best, and
    no later value could beat it (best.json kept naming the NaN checkpoint, and with patience
    the run stopped early on its finite, improving evaluations)."""
    from graded.train.stopping import Stopper

    nan = float("nan")
    sign = 1.0 if mode == "min" else -1.0
    stopper = Stopper()
    assert not stopper.observe(nan, 1, mode=mode)
    assert stopper.best is None and stopper.bad_evals == 1
    assert stopper.observe(sign * 2.0, 2, mode=mode)
    assert stopper.observe(sign * 1.0, 3, mode=mode)
    assert (stopper.best, stopper.best_step, stopper.bad_evals) == (sign * 1.0, 3, 0)
    assert not stopper.observe(nan, 4, mode=mode)
    assert (stopper.best, stopper.bad_evals) == (sign * 1.0, 1)
    assert not stopper.stopped(2) and not stopper.observe(nan, 5, mode=mode)
    assert stopper.stopped(2)  # two evaluations in a row without improvement
    # a state saved with NaN as best and reference (before this rule) is beaten by a number
    old = Stopper(best=nan, best_step=1, reference=nan, bad_evals=0)
    assert old.observe(sign * 5.0, 2, mode=mode)
    assert (old.best, old.reference, old.bad_evals) == (sign * 5.0, sign * 5.0, 0)
