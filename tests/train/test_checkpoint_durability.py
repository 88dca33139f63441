"""A checkpoint survives a crash at any point of its save: each of its files is ``fsync``-ed
before the folder is renamed into place and the parent folder after; a save of the same step
cut short between its two renames (the old folder moved aside, the new one not yet in place)
leaves the old folder under its moved-aside name, which a resume takes as that step's
checkpoint and the run's next save puts back."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch
from tiny_training import TinyClassifier, make_trainer

from graded.train import checkpoint as ck
from graded.train.checkpoint_folder import TEMP_DIR
from graded.train.optim import param_groups
from graded.train.state_tensors import read_tensors

FILES = (ck.MODEL_FILE, ck.OPTIM_FILE, ck.STATE_FILE)
MOVED_ASIDE = ".old.tmp"  # how the name of a folder a same-step save moved aside ends
STEP8 = "step_000000008"


@pytest.fixture
def run(checkpointed_run, tmp_path) -> Path:
    """A copy of the run (conftest) with checkpoints at steps 4 and 8."""
    shutil.copytree(checkpointed_run, tmp_path / "run")
    return tmp_path / "run"


def _parts() -> tuple[TinyClassifier, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyClassifier()
    return model, torch.optim.AdamW(param_groups(model, 0.01))


PROC_FD = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(),
                             reason="names the open files through /proc/self/fd")


@PROC_FD
@pytest.mark.parametrize("existing", [False, True], ids=["new", "same step"])
def test_every_file_is_fsynced_before_the_rename_and_the_parent_folder_after(
        tmp_path, monkeypatch, existing):
    model, opt = _parts()
    target = tmp_path / "checkpoints" / "step_000000001"
    if existing:
        ck.save_checkpoint(target, model, opt, {"step": 1})
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("rename", Path(src).resolve(), Path(dst).resolve()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    ck.save_checkpoint(target, model, opt, {"step": 1}, replace=True)
    monkeypatch.undo()
    final = target.resolve()
    into_place = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == final]
    assert len(into_place) == 1
    at = into_place[0]
    assembled = events[at][1]  # the temporary folder the checkpoint was written in
    assert TEMP_DIR.match(assembled.name) and not assembled.name.endswith(MOVED_ASIDE)
    synced_before = {e[1] for e in events[:at] if e[0] == "fsync"}
    assert {assembled / name for name in FILES} <= synced_before
    assert ("fsync", final.parent) in events[at + 1:]
    assert sorted(p.name for p in target.iterdir()) == sorted(FILES)


@PROC_FD
def test_a_folder_fsync_the_file_system_refuses_with_einval_still_saves(tmp_path,
                                                                        monkeypatch):
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    model, _ = _parts()
    path = ck.save_checkpoint(tmp_path / "step_000000001", model, None, {"step": 1})
    monkeypatch.undo()
    assert ck.read_checkpoint_state(path)["step"] == 1


class _Crash(BaseException):
    """The process dies here: nothing after it runs (no rollback, no clean-up)."""


def _crash_at_the_second_rename(monkeypatch, step_dir: str) -> None:
    """Make a same-step save of ``step_dir`` die after moving the old folder aside, as the
    new one is renamed into place."""
    real_replace, real_rmtree = os.replace, shutil.rmtree
    crashed = []

    def replace(src, dst) -> None:
        if crashed or (Path(dst).name == step_dir and TEMP_DIR.match(Path(src).name)
                       and not Path(src).name.endswith(MOVED_ASIDE)):
            crashed.append(src)
            raise _Crash
        real_replace(src, dst)

    def rmtree(path, *args, **kwargs) -> None:
        if crashed:
            raise _Crash
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(shutil, "rmtree", rmtree)


def _crashed_resave_of_step_8(run: Path, monkeypatch) -> None:
    """Save step 8 again from its own state, dying between the two renames."""
    trainer = make_trainer(run, steps=8, eval_every=4)
    trainer.prepare_resume(run)
    state = ck.read_checkpoint_state(run / "checkpoints" / STEP8)
    _crash_at_the_second_rename(monkeypatch, STEP8)
    with pytest.raises(_Crash):
        trainer.checkpoints.save(8, trainer.model, trainer.optimizer, state)
    monkeypatch.undo()


def test_a_resume_after_a_crash_between_the_renames_takes_the_moved_aside_step(run,
                                                                              monkeypatch):
    stored = read_tensors(run / "checkpoints" / STEP8 / ck.MODEL_FILE)[0]
    _crashed_resave_of_step_8(run, monkeypatch)
    root = run / "checkpoints"
    assert not (root / STEP8).exists()
    aside = [p for p in root.iterdir() if p.name.endswith(MOVED_ASIDE)]
    assert len(aside) == 1 and aside[0].name.startswith(f".{STEP8}.")
    manager = ck.CheckpointManager(root)
    assert manager.steps() == [4, 8] and manager.latest() == aside[0]
    trainer = make_trainer(run, steps=8, eval_every=4)
    plan = trainer.prepare_resume(run)
    assert plan.step == 8 and plan.checkpoint == aside[0] and plan.skipped == []
    assert all(torch.equal(stored[k], v) for k, v in trainer.model.state_dict().items())


def test_the_next_save_puts_the_moved_aside_checkpoint_back_in_place(run, monkeypatch):
    stored = read_tensors(run / "checkpoints" / STEP8 / ck.MODEL_FILE)[0]
    _crashed_resave_of_step_8(run, monkeypatch)
    result = make_trainer(run, steps=12, eval_every=4).fit(resume_from=run)
    root = run / "checkpoints"
    assert result.step == 12
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "step_000000004", STEP8, "step_000000012"]  # keep_last 3, no temporary folder left
    assert read_tensors(root / STEP8 / ck.MODEL_FILE)[0].keys() == stored.keys()
    assert all(torch.equal(stored[k], v)
               for k, v in read_tensors(root / STEP8 / ck.MODEL_FILE)[0].items())
