"""Runs that cannot be damaged, through the command line: resume checks everything before it
writes, one writer per run folder, damaged checkpoints named and skipped, demo runs usable."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from cli_configs import tiny_config

from graded.cli import main
from graded.train.checkpoint import CheckpointManager
from graded.train.logging import read_metrics

HOLD_LOCK = (
    "import sys\nfrom graded.train.runs import RunFolder\n"
    "RunFolder(sys.argv[1], purpose=sys.argv[2]).acquire()\nprint('locked', flush=True)\n"
    "sys.stdin.read()\n"
)


def _config(tmp_path: Path, name: str = "tiny", *, model: dict | None = None, **train) -> Path:
    """Four steps with a checkpoint every two, so that there is an older one to fall back to."""
    return tiny_config(tmp_path, name, model=model,
                       **{"steps": 4, "checkpoint_every": 2, **train})


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


@pytest.fixture
def run(tmp_path) -> Path:
    assert main(["train", str(_config(tmp_path))]) == 0
    return tmp_path / "runs" / "tiny"


def test_resume_with_another_models_config_is_refused_and_leaves_every_file_identical(
    run, tmp_path, capsys
):
    other = _config(tmp_path, "other", model={"d_model": 32, "n_heads": 2, "n_layers": 2,
                                               "positional": "learned"})
    before = _hashes(run)
    capsys.readouterr()
    assert main(["train", str(other), "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "model.d_model" in err and "16" in err and "32" in err
    assert _hashes(run) == before
    # the run is still whole: it evaluates and resumes
    assert main(["eval", str(run)]) == 0
    assert main(["train", "--resume", str(run), "--set", "train.steps=6"]) == 0


def test_a_change_that_cannot_happen_mid_run_is_refused_by_set(run, capsys):
    before = _hashes(run)
    assert main(["train", "--resume", str(run), "--set", "train.batch_size=8"]) == 2
    assert "train.batch_size" in capsys.readouterr().err
    assert _hashes(run) == before


def test_a_new_learning_rate_on_resume_is_used_and_recorded(run):
    from graded.train.logging import read_metrics

    assert main(["train", "--resume", str(run), "--set", "train.lr=0.01",
                 "--set", "train.steps=6", "--set", "train.schedule=constant"]) == 2  # refused
    assert main(["train", "--resume", str(run), "--set", "train.lr=0.01",
                 "--set", "train.steps=6"]) == 0
    overrides = {e["key"]: (e["old"], e["new"]) for e in _history(run)
                 if e["event"] == "override"}
    assert overrides["train.lr"] == (0.001, 0.01)
    assert overrides["train.steps"] == (4, 6)
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"] == 0.01
    # the logged learning rate after the resume follows the new peak: warmup 1, cosine to 6
    import math

    lrs = dict(read_metrics(run)["train"]["lr"])
    for step in (5, 6):  # step s (1-based) ran at the cosine's value for s − 1 − warmup
        expected = 0.01 * 0.5 * (1 + math.cos(math.pi * (step - 2) / 5))
        assert lrs[step] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("purpose", ["training", "evaluation"])
def test_a_second_writer_is_refused_with_the_holders_pid(run, capsys, purpose):
    with held_lock(run, purpose) as pid:
        before = _hashes(run)
        assert main(["train", "--resume", str(run), "--set", "train.steps=6"]) == 2
        err = capsys.readouterr().err
        assert f"run folder {run} is in use by process {pid} for {purpose}" in err
        assert _hashes(run) == before


@contextmanager
def held_lock(run: Path, purpose: str = "training") -> Iterator[int]:
    """``run``'s lock held by another process for the block (by default a run training
    there); yields that process's id."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run), purpose],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.fixture
def held(run):
    """``run``'s lock held by another process for the test's length (:func:`held_lock`)."""
    with held_lock(run) as pid:
        yield pid


def test_eval_of_a_run_in_use_prints_the_result_and_writes_nothing_into_it(run, held,
                                                                           capsys):
    """It was refused ("in use by process N") for the eval.json it wanted to write. The
    printed figures are the run's own final evaluation of that checkpoint (metrics.json)."""
    before = _hashes(run)
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", "latest"]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    final = json.loads((run / "metrics.json").read_text())
    assert printed["step"] == final["step"] == 4
    assert printed["metrics"] == pytest.approx(final["eval"], rel=1e-5)
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and str(held) in err[0] and "not written" in err[0], err
    assert _hashes(run) == before  # no eval.json, no manifest entry


def test_eval_of_a_run_in_use_writes_to_an_out_path_outside_it(run, held, tmp_path, capsys):
    before = _hashes(run)
    out = tmp_path / "elsewhere" / "eval.json"
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", "latest", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert json.loads(out.read_text()) == json.loads(captured.out)
    assert captured.err == ""
    assert _hashes(run) == before


def test_eval_out_inside_a_run_in_use_is_refused_naming_the_holder(run, held, capsys):
    before = _hashes(run)
    capsys.readouterr()
    assert main(["eval", str(run), "--out", str(run / "mine.json")]) == 2
    err = capsys.readouterr().err
    assert f"inside run folder {run}, which is in use by process {held} for training" in err
    assert _hashes(run) == before


def test_eval_of_a_run_another_eval_holds_names_that_purpose(run, capsys):
    with held_lock(run, "evaluation") as pid:
        capsys.readouterr()
        assert main(["eval", str(run), "--checkpoint", "latest"]) == 0
        err = capsys.readouterr().err
    assert f"is in use by process {pid} for evaluation: the evaluation is printed" in err


def test_eval_of_a_free_run_writes_eval_json_or_the_out_path(run, tmp_path, capsys):
    """Without a holder: RUN/eval.json, entered in the manifest (an overwrite removes it), or
    the --out file, the printed result in both; --out naming a folder is refused."""
    from graded.train.runs import RunFolder

    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert json.loads((run / "eval.json").read_text()) == json.loads(capsys.readouterr().out)
    assert "eval.json" in RunFolder(run).written()
    out = tmp_path / "e.json"
    assert main(["eval", str(run), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(capsys.readouterr().out)
    assert main(["eval", str(run), "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a folder; expected the path of a JSON file" in (
        capsys.readouterr().err)


def _damage(newest: Path, how: str, tmp_path: Path) -> Path:
    """Damage the checkpoint folder ``newest``; return the file the error must name."""
    weights = newest / "model.safetensors"
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "corrupted":  # bytes of the safetensors header overwritten
        data = bytearray(weights.read_bytes())
        data[8:24] = b"\xff" * 16
        weights.write_bytes(bytes(data))
    else:  # mismatched: a whole, intact checkpoint of a wider model in its place
        other = _config(tmp_path, "wide", model={"d_model": 32, "n_heads": 2, "n_layers": 1,
                                                 "positional": "learned"})
        assert main(["train", str(other)]) == 0
        wide = CheckpointManager(tmp_path / "runs" / "wide" / "checkpoints").latest()
        for name in ("model.safetensors", "optimizer.safetensors", "state.json"):
            (newest / name).write_bytes((wide / name).read_bytes())
    return weights


@pytest.mark.parametrize("how", ["truncated", "corrupted", "mismatched"])
def test_damaged_checkpoints_are_named_in_one_line_and_resume_falls_back(run, tmp_path, capsys,
                                                                          how):
    newest = CheckpointManager(run / "checkpoints").latest()
    named = _damage(newest, how, tmp_path)
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", str(newest)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graded: error: "), lines
    assert str(named) in lines[0]
    assert main(["eval", str(run), "--checkpoint", "latest"]) == 0
    err = capsys.readouterr().err
    assert f"skipped damaged checkpoint {newest}" in err
    assert main(["train", "--resume", str(run), "--set", "train.steps=6"]) == 0
    err = capsys.readouterr().err
    assert "newest intact checkpoint" in err
    resumed = [e for e in _history(run) if e["event"] == "resume"][-1]
    assert resumed["step"] == 2 and str(newest) in json.dumps(resumed["skipped"])


def test_eval_and_generate_need_only_the_weights(run, capsys):
    for ckpt in (run / "checkpoints").glob("step_*"):
        (ckpt / "optimizer.safetensors").unlink()
    assert main(["eval", str(run), "--checkpoint", "latest"]) == 0
    assert main(["generate", str(run), "--prompt", "("]) == 0


def test_overwrite_removes_only_what_graded_wrote(run, tmp_path, capsys):
    (run / "notes.txt").write_text("mine")
    assert main(["train", str(_config(tmp_path)), "--set", "output.overwrite=true"]) == 0
    assert (run / "notes.txt").read_text() == "mine"
    assert "removed" in capsys.readouterr().err


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_report_eval_and_resume_work_on_demo_runs(tmp_path, capsys):
    from graded.demo import run_demo

    out = tmp_path / "demo"
    run_demo(out, seeds=1, quick=True, workers=1)
    run = out / "polynomial_regression" / "LGT-seed0"
    assert (run / "config.yaml").is_file()
    assert main(["eval", str(run)]) == 0
    assert main(["report", str(run)]) == 0
    steps = json.loads((run / "metrics.json").read_text())["step"]
    assert main(["train", "--resume", str(run), "--set", f"train.steps={steps + 2}"]) == 0
    assert json.loads((run / "metrics.json").read_text())["step"] == steps + 2


def test_an_edited_config_yaml_is_checked_against_the_checkpoints(run, capsys):
    path = run / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["d_model"] = 32  # cannot change mid-run
    path.write_text(yaml.safe_dump(cfg))
    before = _hashes(run)
    assert main(["train", "--resume", str(run), "--set", "train.steps=6"]) == 2
    err = capsys.readouterr().err
    assert "model.d_model was 16, now 32" in err
    assert _hashes(run) == before
    cfg["model"]["d_model"] = 16
    cfg["train"]["lr"] = 0.002  # may change: used and recorded
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "--resume", str(run), "--set", "train.steps=6"]) == 0
    overrides = {e["key"]: (e["old"], e["new"]) for e in _history(run)
                 if e["event"] == "override"}
    assert overrides["train.lr"] == (0.001, 0.002)


def test_resume_with_fewer_steps_than_the_run_has_made_is_refused_and_writes_nothing(
    run, capsys
):
    # the run is at step 4 (metrics.json): fewer steps cannot be trained, and recording them
    # would leave config.yaml saying 3 steps for a run that made 4
    made = json.loads((run / "metrics.json").read_text())["step"]
    assert made == 4
    before = _hashes(run)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--set", f"train.steps={made - 1}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.steps=3" in err[0] and "at step 4" in err[0], err
    assert _hashes(run) == before
    # as many steps as made: nothing to do; fewer than the total but past the newest
    # checkpoint still re-spans the schedule (docs/training.md): from step 2, 3 steps
    assert main(["train", "--resume", str(run), "--set", f"train.steps={made}"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    shutil.rmtree(CheckpointManager(run / "checkpoints").latest())
    assert main(["train", "--resume", str(run), "--set", "train.steps=3"]) == 0
    assert json.loads((run / "metrics.json").read_text())["step"] == 3


def test_eval_and_generate_refuse_a_config_yaml_edited_away_from_the_checkpoints(run, capsys):
    # a new seed builds another evaluation split, a new grading base another model, and the
    # weights still load into either: the numbers would silently belong to another run
    assert main(["eval", str(run)]) == 0
    before = json.loads(capsys.readouterr().out)["metrics"]
    path = run / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    edited = {**cfg, "seed": 1, "task": {**cfg["task"], "n_eval": 16}}
    path.write_text(yaml.safe_dump(edited))
    files = _hashes(run)
    for argv in (["eval", str(run)], ["eval", str(run), "--checkpoint", "latest"],
                 ["generate", str(run), "--prompt", "("]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "seed was 0, now 1" in err and "task.n_eval was 32, now 16" in err
    assert _hashes(run) == files  # eval.json not rewritten
    # a key a resume may change (the learning rate) leaves the model and the split as trained
    path.write_text(yaml.safe_dump({**cfg, "train": {**cfg["train"], "lr": 0.5}}))
    assert main(["eval", str(run)]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"] == before


def test_resuming_an_early_stopped_run_trains_nothing_and_says_how_to_continue(tmp_path,
                                                                              capsys):
    # an lr of 1e-9 and a min_delta of 1: no evaluation after the first improves
    path = tiny_config(tmp_path, steps=40, eval_every=2, lr=1e-9,
                       early_stopping={"patience": 2, "min_delta": 1.0})
    assert main(["train", str(path)]) == 0
    run = tmp_path / "runs" / "tiny"
    end = _history(run)[-1]
    assert (end["event"], end["step"], end["status"]) == ("end", 6, "early_stopped")
    before = _hashes(run / "checkpoints")
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert (f"nothing to do: {run} stopped early at step 6 (no improvement of loss in 2 "
            "evaluations)") in out
    assert (f"continue it with `graded train --resume {run} --set "
            "train.early_stopping.patience=<more>` (or =null)") in out
    assert _hashes(run / "checkpoints") == before  # no step was made, nothing saved
    end = _history(run)[-1]
    assert (end["event"], end["step"], end["status"]) == ("end", 6, "early_stopped")


@pytest.mark.parametrize("killed", ["before its first save", "during its first save"])
def test_resuming_a_run_killed_before_its_first_checkpoint_says_there_is_nothing_to_resume(
        tmp_path, capsys, killed):
    path = tiny_config(tmp_path)
    assert main(["train", str(path)]) == 0
    run = tmp_path / "runs" / "tiny"
    shutil.rmtree(run / "checkpoints")  # as a run killed before its first checkpoint leaves it
    if killed == "during its first save":  # the folder that save was assembled in is left
        (run / "checkpoints" / ".step_000000002.4242-0123456789ab.tmp").mkdir(parents=True)
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"graded: error: run folder {run} holds no checkpoint: it stopped before "
                       "its first one, so there is nothing to resume; train it anew (without "
                       "resuming)")
    assert main(["train", str(path)]) == 0  # which works
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.json",
                                                                        "step_000000002"]


def test_early_stopping_can_be_turned_on_by_a_key_on_resume(run):
    # the run's config.yaml reads `early_stopping: null`; a key inside it turns it on
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["early_stopping"] is None
    assert main(["train", "--resume", str(run), "--set", "train.steps=8",
                 "--set", "train.early_stopping.patience=1"]) == 0
    overrides = [e for e in _history(run) if e["event"] == "override"]
    assert sorted((e["key"], e["old"], e["new"]) for e in overrides) == [
        ("train.early_stopping", None, {"patience": 1, "min_delta": 0.0}),
        ("train.steps", 4, 8)]
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]["early_stopping"]
    assert saved == {"patience": 1, "min_delta": 0.0}


def test_training_again_from_a_replaced_runs_config_yaml_does_not_replace_it(run, tmp_path,
                                                                           capsys):
    # overwrite is asked for each time: the config the run records does not carry it, or a
    # run started again from that file (to reproduce or extend it) would silently replace it
    assert main(["train", str(_config(tmp_path)), "--set", "output.overwrite=true"]) == 0
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert recorded["output"]["overwrite"] is False
    before = _hashes(run)
    capsys.readouterr()
    assert main(["train", str(run / "config.yaml"), "--set", "train.steps=6"]) == 2
    assert "already has checkpoints" in capsys.readouterr().err
    assert _hashes(run) == before


def test_graded_eval_takes_the_lowest_eval_loss_and_a_resume_keeps_best_and_early_stopping(
        tmp_path, capsys):
    """With ``early_stopping.min_delta`` 0.02 the loss falls by less than that at some
    evaluations: the best checkpoint is still the lowest loss (not the last improvement by
    0.02), and a run trained to step 6 and resumed to 12 ends as the run trained to 12 at once,
    best.json and the early-stopping state included."""
    train = {"eval_every": 1, "schedule": "constant", "lr": 1e-3,
             "early_stopping": {"patience": 3, "min_delta": 0.02}}
    assert main(["train", str(tiny_config(tmp_path, "full", steps=12, **train))]) == 0
    assert main(["train", str(tiny_config(tmp_path, "part", steps=6, **train))]) == 0
    full, part = tmp_path / "runs" / "full", tmp_path / "runs" / "part"
    paused = json.loads((part / "checkpoints" / "step_000000006" / "state.json").read_text())
    assert main(["train", "--resume", str(part), "--set", "train.steps=12"]) == 0
    curve = read_metrics(full)["eval"]["loss"]
    step, loss = min(curve, key=lambda point: (point[1], point[0]))
    reference = curve[0][1]  # the last evaluation that improved by more than min_delta
    for _, value in curve[1:]:
        reference = value if value < reference - 0.02 else reference
    assert reference != loss  # min_delta skips the improvement that made the best
    for run in (full, part):
        assert json.loads((run / "checkpoints" / "best.json").read_text()) == {
            "checkpoint": f"step_{step:09d}", "step": step, "metric": loss}
        assert json.loads((run / "metrics.json").read_text())["best"] == loss
        final = json.loads((run / "checkpoints" / "step_000000012" / "state.json").read_text())
        assert final["stopper"]["best"] == loss and final["stopper"]["reference"] == reference
    assert paused["stopper"]["best"] != paused["stopper"]["reference"]  # both mattered
    for split, name in (("train", "loss"), ("eval", "loss")):
        assert read_metrics(part)[split][name] == read_metrics(full)[split][name]
    capsys.readouterr()
    assert main(["eval", str(part)]) == 0  # the default checkpoint: the best
    out = json.loads(capsys.readouterr().out)
    assert out["step"] == step and out["metrics"]["loss"] == loss
