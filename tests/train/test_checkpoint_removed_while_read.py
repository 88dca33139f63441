"""CheckpointManager.find_intact on a run another process trains meanwhile: a checkpoint its
rotation removes between the listing and the load is not damaged, and the folder is listed
again for the checkpoints saved meanwhile (a bounded number of times)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from tiny_training import TinyClassifier

from graded.train import checkpoint as ck
from graded.train.state_tensors import read_tensors


@pytest.fixture
def run(checkpointed_run) -> Path:
    """The run (conftest) with checkpoints at steps 4 and 8 (never modified: tests use copies)."""
    return checkpointed_run


@pytest.fixture
def root(run, tmp_path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run" / "checkpoints"


def _removing(monkeypatch, rotate) -> list[Path]:
    """Loads that first run ``rotate(asked folder)`` (the trainer's save and rotation)."""
    real, asked = ck.load_checkpoint, []

    def load(directory, *args, **kwargs):
        asked.append(Path(directory))
        rotate(Path(directory))
        return real(directory, *args, **kwargs)

    monkeypatch.setattr(ck, "load_checkpoint", load)
    return asked


def test_a_checkpoint_removed_while_read_is_not_called_damaged(root, monkeypatch):
    """Step 8 removed as it is read: step 4 is taken and nothing is skipped (step 8 was listed
    as skipped for a missing state.json)."""
    asked = _removing(monkeypatch, lambda d: shutil.rmtree(d) if d.name.endswith("8") else None)
    found = ck.CheckpointManager(root).find_intact(TinyClassifier())
    assert [p.name for p in asked] == ["step_000000008", "step_000000004"]
    assert found.path == root / "step_000000004" and found.meta["step"] == 4
    assert found.skipped == []


def test_all_listed_checkpoints_removed_then_the_new_one_is_taken(root, monkeypatch):
    """keep_last=1: reading step 8, the trainer saves step 12 and removes 4 and 8. It was
    "holds no intact checkpoint"; the second listing finds step 12, whose weights (those of
    step 8) are loaded."""
    def rotate(directory: Path) -> None:
        if directory.name == "step_000000008":
            shutil.copytree(directory, root / "step_000000012")
            shutil.rmtree(directory)
            shutil.rmtree(root / "step_000000004")

    stored = read_tensors(root / "step_000000008" / ck.MODEL_FILE)[0]
    asked = _removing(monkeypatch, rotate)
    model = TinyClassifier()
    found = ck.CheckpointManager(root).find_intact(model)
    assert [p.name for p in asked] == ["step_000000008", "step_000000004", "step_000000012"]
    assert found.path == root / "step_000000012" and found.skipped == []
    assert all(torch.equal(stored[k], v) for k, v in model.state_dict().items())


def test_checkpoints_removed_at_every_look_raise_removed_after_the_bound(root, monkeypatch):
    """Every load finds its folder removed and a newer one saved: ``lookups`` listings, then
    CheckpointRemovedError naming the folders (a CheckpointError, as callers expect)."""
    def rotate(directory: Path) -> None:
        newest = max(int(p.name[5:]) for p in root.iterdir() if ck.STEP_DIR.match(p.name))
        shutil.copytree(directory, root / f"step_{newest + 4:09d}")
        shutil.rmtree(directory)

    asked = _removing(monkeypatch, rotate)
    with pytest.raises(ck.CheckpointRemovedError, match="removed while being read") as exc:
        ck.CheckpointManager(root).find_intact(TinyClassifier(), lookups=3)
    assert isinstance(exc.value, ck.CheckpointError)
    assert len({p.name for p in asked}) == len(asked)  # a newer checkpoint at each load
    assert asked[0].name in str(exc.value) and str(root) in str(exc.value)
    # three listings of two checkpoints each (each load leaves one newer in place of one)
    assert len(asked) == 3 * 2


def test_lookups_below_one_are_refused_naming_the_value(root):
    with pytest.raises(ValueError, match="lookups must be >= 1, got 0"):
        ck.CheckpointManager(root).find_intact(TinyClassifier(), lookups=0)
