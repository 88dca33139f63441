"""Run folders: one writer at a time, overwrite removes only library files, resume rules."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tiny_training import OPTIONS, TinyClassifier, make_data, make_trainer

from graded.train.options import TrainOptions
from graded.train.runs import (
    LOCK_FILE,
    RunError,
    RunFolder,
    RunLockedError,
    refusal_message,
    resume_changes,
)
from graded.train.schedules import warmup_cosine
from graded.train.trainer import Trainer

HOLD_LOCK = (
    "import sys\nfrom graded.train.runs import RunFolder\n"
    "RunFolder(sys.argv[1]).acquire()\nprint('locked', flush=True)\nsys.stdin.read()\n"
)


def _holder(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _overwriting_trainer(run_dir: Path, **options) -> Trainer:
    torch.manual_seed(0)
    return Trainer(TinyClassifier(), make_data(96, 1), make_data(48, 2), kind="classification",
                   options=TrainOptions(**{**OPTIONS, **options}), run_dir=run_dir,
                   overwrite=True)


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- the lock


def test_a_second_writer_in_another_process_is_refused_with_the_holders_pid(tmp_path):
    run = tmp_path / "run"
    proc = _holder(run)
    try:
        with pytest.raises(RunLockedError) as exc:
            RunFolder(run).acquire()
        assert str(run) in str(exc.value) and f"process {proc.pid}" in str(exc.value)
        with pytest.raises(RunLockedError, match=str(proc.pid)):
            make_trainer(run).fit()
        assert not (run / "checkpoints").exists()  # the refused trainer wrote nothing
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    with RunFolder(run).lock():  # released when its holder ends
        assert (run / LOCK_FILE).read_text() == f"{os.getpid()} training\n"


def test_a_refused_writer_is_told_what_the_holder_holds_the_lock_for(tmp_path):
    refused = pytest.raises(RunLockedError, match=f"in use by process {os.getpid()} for report")
    with RunFolder(tmp_path, purpose="report").lock(), refused as exc:
        RunFolder(tmp_path).acquire()
    assert (exc.value.holder, exc.value.purpose) == (str(os.getpid()), "report")
    with pytest.raises(ValueError, match="purpose 'writing' is not one of"):
        RunFolder(tmp_path, purpose="writing")


def test_a_second_lock_in_this_process_is_refused_and_one_object_is_reentrant(tmp_path):
    first, second = RunFolder(tmp_path), RunFolder(tmp_path)
    with first.lock(), first.lock():  # flock is per open file description: same process,
        with pytest.raises(RunLockedError, match=str(os.getpid())):  # second open conflicts
            second.acquire()
        assert first.locked
    assert not first.locked and (tmp_path / LOCK_FILE).read_text() == ""
    with second.lock():
        assert second.locked


def test_a_lock_file_left_by_a_killed_process_does_not_block(tmp_path):
    proc = _holder(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # stale pid left behind
    assert (tmp_path / LOCK_FILE).read_text() == f"{proc.pid} training\n"
    with RunFolder(tmp_path, purpose="evaluation").lock():
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()} evaluation\n"


def test_trainer_holds_the_lock_only_while_fitting_and_a_caller_may_hold_it_around(tmp_path):
    trainer = make_trainer(tmp_path, steps=4)
    with trainer.run.lock():  # as the CLI does around its preflight and fit
        trainer.fit()
        with pytest.raises(RunLockedError):
            RunFolder(tmp_path).acquire()
    with RunFolder(tmp_path).lock():
        pass


# --------------------------------------------------------------------------- existing runs


def test_trainer_refuses_a_folder_that_already_holds_checkpoints(tmp_path):
    make_trainer(tmp_path, steps=4).fit()
    before = _hashes(tmp_path)
    with pytest.raises(RunError, match="already holds checkpoints") as exc:
        make_trainer(tmp_path, steps=4).fit()
    assert str(tmp_path) in str(exc.value)
    assert _hashes(tmp_path) == before


def test_overwrite_removes_only_what_the_library_wrote_and_says_so(tmp_path, capsys):
    make_trainer(tmp_path, steps=4, tensorboard=True).fit()
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("1,2")
    (tmp_path / "checkpoints" / "step_000000004" / "keep.txt").write_text("inside a library folder")
    written = RunFolder(tmp_path).written()
    assert {"config.yaml", "metrics.csv", "checkpoints", "tensorboard", "history.jsonl"} <= set(
        written)
    capsys.readouterr()
    result = _overwriting_trainer(tmp_path, steps=3).fit()
    err = capsys.readouterr().err
    assert f"overwriting {tmp_path}: removed" in err and "checkpoints" in err
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "data" / "x.csv").read_text() == "1,2"
    assert not (tmp_path / "checkpoints" / "step_000000004").exists()
    assert not (tmp_path / "tensorboard").exists()  # the new run writes none
    assert result.step == 3 and [e["event"] for e in RunFolder(tmp_path).history()] == [
        "start", "end"]


def test_remove_written_returns_exactly_the_manifest_entries_present(tmp_path):
    run = RunFolder(tmp_path)
    for name in ("metrics.csv", "own.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "checkpoints").mkdir()
    run.record("metrics.csv", "checkpoints", "eval.json")  # eval.json never written
    assert run.remove_written() == [tmp_path / "checkpoints", tmp_path / "metrics.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".graded-run.json", "own.txt", LOCK_FILE]
    assert run.written() == []
    with pytest.raises(ValueError, match=r"'\.\./escape'"):
        run.record("../escape")


# --------------------------------------------------------------------------- config.yaml


def test_a_python_run_folder_holds_a_config_yaml_describing_the_run(tmp_path):
    trainer = make_trainer(tmp_path, steps=3)
    trainer.fit()
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert written == {"kind": "classification", "seed": 0, "recipe": None,
                       "model": {"class": "TinyClassifier"},
                       "train": trainer.opts.model_dump(mode="json")}


def test_a_config_run_writes_the_same_config_yaml_as_dump_config(tmp_path):
    from graded.config import build_run, dump_config, validate_config

    cfg = validate_config({
        "name": "tiny", "task": {"name": "dyck", "options": {"max_length": 8},
                                 "n_train": 32, "n_eval": 16},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
        "train": {**OPTIONS, "steps": 2, "batch_size": 8, "warmup_steps": 1},
        "output": {"dir": str(tmp_path)}}, "test")
    build_run(cfg).trainer.fit()
    assert (tmp_path / "tiny" / "config.yaml").read_text() == dump_config(cfg)


def test_a_config_yaml_the_caller_wrote_is_kept(tmp_path):
    (tmp_path / "config.yaml").write_text("mine: true\n")
    make_trainer(tmp_path, steps=3).fit()
    assert (tmp_path / "config.yaml").read_text() == "mine: true\n"
    assert "config.yaml" not in RunFolder(tmp_path).written()


# --------------------------------------------------------------------------- resume rules


def test_resume_changes_sorts_differences_by_the_documented_rule():
    old = {"name": "a", "seed": 0, "task": {"name": "dyck"}, "model": {"d_model": 16},
           "train": {"steps": 10, "lr": 1e-3, "batch_size": 16, "early_stopping": None},
           "output": {"dir": "runs"}}
    new = {"name": "b", "seed": 1, "task": {"name": "dyck"}, "model": {"d_model": 32, "x": 1},
           "train": {"steps": 20, "lr": 1e-2, "batch_size": 16,
                     "early_stopping": {"patience": 2}},
           "output": {"dir": "elsewhere"}}
    allowed, refused = resume_changes(old, new)
    assert allowed == {"name": ("a", "b"), "train.steps": (10, 20), "train.lr": (1e-3, 1e-2),
                       "train.early_stopping": (None, {"patience": 2}),  # turned on: one
                       "output.dir": ("runs", "elsewhere")}
    assert refused == {"seed": (0, 1), "model.d_model": (16, 32), "model.x": ("absent", 1)}
    # and off again; a key inside a section that stays on is one difference of that key
    assert resume_changes(new, old)[0]["train.early_stopping"] == ({"patience": 2}, None)
    on3 = {**new, "train": {**new["train"], "early_stopping": {"patience": 3}}}
    assert resume_changes(new, on3) == ({"train.early_stopping.patience": (2, 3)}, {})
    message = refusal_message("RUN", refused)
    assert "\n" not in message and "model.d_model was 16, now 32" in message
    assert "seed was 0, now 1" in message and "train.lr" in message  # names what may change


def test_refused_resume_names_each_key_and_leaves_every_file_byte_identical(tmp_path):
    make_trainer(tmp_path, steps=8).fit(pause_after=4)
    before = _hashes(tmp_path)
    trainer = make_trainer(tmp_path, steps=8, batch_size=32, weight_decay=0.5)
    with pytest.raises(RunError) as exc:
        trainer.fit(resume_from=tmp_path)
    message = str(exc.value)
    assert "train.batch_size was 16, now 32" in message
    assert "train.weight_decay was 0.01, now 0.5" in message and str(tmp_path) in message
    assert _hashes(tmp_path) == before


def test_prepare_resume_checks_weights_and_optimizer_and_writes_nothing(tmp_path):
    make_trainer(tmp_path, steps=8).fit(pause_after=4)
    before = _hashes(tmp_path)
    plan = make_trainer(tmp_path, steps=12).prepare_resume(tmp_path)
    assert plan.step == 4 and plan.changes == {"train.steps": (8, 12)} and not plan.skipped
    assert _hashes(tmp_path) == before


def test_a_new_lr_on_resume_is_used_from_the_resume_step_and_recorded(tmp_path):
    make_trainer(tmp_path, steps=12).fit(pause_after=5)
    trainer = make_trainer(tmp_path, steps=12, lr=1e-2)
    used: list[float] = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        used.append(trainer.optimizer.param_groups[0]["lr"])
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    trainer.fit(resume_from=tmp_path)
    schedule = warmup_cosine(OPTIONS["warmup_steps"], 12)
    assert used == pytest.approx([1e-2 * schedule(s) for s in range(5, 12)], rel=1e-12)
    assert used[0] != pytest.approx(OPTIONS["lr"] * schedule(5))
    overrides = [e for e in RunFolder(tmp_path).history() if e["event"] == "override"]
    assert overrides == [{"event": "override", "time": overrides[0]["time"], "key": "train.lr",
                          "old": OPTIONS["lr"], "new": 1e-2, "step": 5}]
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["lr"] == 1e-2


def test_history_records_start_resume_and_end_with_steps(tmp_path):
    make_trainer(tmp_path, steps=8).fit(pause_after=4)
    make_trainer(tmp_path, steps=8).fit(resume_from=tmp_path)
    events = [(e["event"], e["step"]) for e in RunFolder(tmp_path).history()]
    assert events == [("start", 0), ("end", 4), ("resume", 4), ("end", 8)]
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["status"] == "paused" and json.loads(lines[3])["status"] == (
        "finished")


# --------------------------------------------------------------------------- unwritable folders


def test_a_refused_write_is_a_run_error_naming_the_folder(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / LOCK_FILE))

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(RunError, match=f"cannot write to {tmp_path}: permission denied"):
        make_trainer(tmp_path, steps=3).fit()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores folder permissions")
def test_a_read_only_run_folder_is_a_run_error_naming_the_folder(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(RunError, match=f"cannot write to {tmp_path}: permission denied"):
            make_trainer(tmp_path, steps=3).fit()
    finally:
        tmp_path.chmod(0o700)
