"""Checkpoints: exact round trip, atomic writes, no unpickling, rotation keeps last K and best."""

from __future__ import annotations

import os
import random
import stat
import subprocess
import sys

import numpy as np
import pytest
import safetensors.torch
import torch
from tiny_training import TinyClassifier

from graded.train import checkpoint as ck
from graded.train import checkpoint_folder
from graded.train.state_tensors import capture_rng_state, restore_rng_state


def _trained_pair(seed: int = 0):
    torch.manual_seed(seed)
    model = TinyClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.9))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randint(0, 12, (4, 8))).sum().backward()
        opt.step()
    return model, opt


def test_checkpoint_round_trip_restores_model_optimizer_and_rng(tmp_path):
    model, opt = _trained_pair()
    ck.save_checkpoint(tmp_path / "c", model, opt, {"step": 3, "note": (1, 2)})
    expected_next = torch.rand(3)  # what the RNG gives right after saving

    model2, opt2 = _trained_pair(seed=1)
    torch.manual_seed(123)
    meta = ck.load_checkpoint(tmp_path / "c", model2, opt2)
    assert meta["step"] == 3 and meta["note"] == [1, 2]
    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), k
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for pid in s1["state"]:
        for key, val in s1["state"][pid].items():
            assert torch.equal(val, s2["state"][pid][key])
    assert torch.equal(torch.rand(3), expected_next)


def _draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def test_each_ranks_rng_state_round_trips_and_a_rank_without_one_restores_rank_0s(tmp_path):
    """A checkpoint of two ranks whose torch, Python and NumPy streams differ: restoring rank r
    gives the numbers rank r would have drawn next; rank 2, which saved none (a resume on
    more processes), gets rank 0's, as does a load that names no rank."""
    states, nexts = [], []
    for seed in (1, 2):  # rank 0, rank 1
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        states.append(capture_rng_state())
        nexts.append(_draws())
    assert nexts[0] != nexts[1]
    model, opt = _trained_pair()
    ck.save_checkpoint(tmp_path / "c", model, opt, {"step": 3}, rng=states)
    tensors, rest = ck.read_rng_state(tmp_path / "c")
    for rank, expected in ((0, nexts[0]), (1, nexts[1]), (2, nexts[0])):
        torch.manual_seed(123)
        random.seed(123)
        np.random.seed(123)
        restore_rng_state(tensors, rest, rank=rank)
        assert _draws() == expected, rank
    ck.load_checkpoint(tmp_path / "c", model, opt)
    assert _draws() == nexts[0]


def test_tied_weights_are_stored_once_and_reloaded_tied(tmp_path):
    model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False))
    model[1].weight = model[0].weight
    ck.save_checkpoint(tmp_path / "c", model, None, {"step": 0})
    other = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False))
    other[1].weight = other[0].weight
    ck.load_checkpoint(tmp_path / "c", other)
    assert torch.equal(other[0].weight, model[0].weight)
    assert other[1].weight is other[0].weight


def test_a_parameter_shared_by_many_modules_round_trips(tmp_path):
    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.grades = torch.nn.Parameter(torch.randn(4))
            self.stages = torch.nn.ModuleList(torch.nn.Module() for _ in range(3))
            for stage in self.stages:
                stage.grades = self.grades
            self.other = torch.nn.Parameter(torch.randn(4))

    model = Shared()
    ck.save_checkpoint(tmp_path / "c", model, None, {"step": 0})
    stored = safetensors.torch.load_file(tmp_path / "c" / ck.MODEL_FILE)
    assert sorted(stored) == ["grades", "other"]
    fresh = Shared()
    ck.load_checkpoint(tmp_path / "c", fresh)
    assert torch.equal(fresh.grades, model.grades) and torch.equal(fresh.other, model.other)
    assert all(stage.grades is fresh.grades for stage in fresh.stages)


def test_failed_write_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    model, opt = _trained_pair()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_folder, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        ck.save_checkpoint(tmp_path / "step_000000001", model, opt, {"step": 1})
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a temporary one


def test_atomic_text_write_keeps_old_content_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "best.json"
    ck.atomic_write_text(path, "old")

    def broken(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(ck.os, "replace", broken)
    with pytest.raises(OSError):
        ck.atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["best.json"]


def test_an_atomic_text_write_is_readable_as_its_folder_and_keeps_a_replaced_files_mode(
        tmp_path):
    """mkstemp makes 0600 files: config.yaml, metrics.json and reports written through it were
    unreadable by other users. A new file gets its folder's read and write bits; a replaced
    file keeps its own mode."""
    import stat

    folder = tmp_path / "run"
    folder.mkdir()
    folder.chmod(0o755)
    ck.atomic_write_text(folder / "metrics.json", "{}")
    assert stat.S_IMODE((folder / "metrics.json").stat().st_mode) == 0o644
    (folder / "metrics.json").chmod(0o600)
    ck.atomic_write_text(folder / "metrics.json", "{\"a\": 1}")
    assert stat.S_IMODE((folder / "metrics.json").stat().st_mode) == 0o600
    assert (folder / "metrics.json").read_text() == '{"a": 1}'


def test_loading_never_unpickles(tmp_path, monkeypatch):
    model, opt = _trained_pair()
    ck.save_checkpoint(tmp_path / "c", model, opt, {"step": 3})

    def forbidden(*args, **kwargs):
        raise AssertionError("torch.load must not be used on checkpoints")

    monkeypatch.setattr(torch, "load", forbidden)
    ck.load_checkpoint(tmp_path / "c", model, opt)
    # The files are plain safetensors and JSON.
    assert set(safetensors.torch.load_file(tmp_path / "c" / ck.MODEL_FILE)) <= set(
        model.state_dict()
    )


def test_manager_keeps_last_k_and_the_best(tmp_path):
    model, opt = _trained_pair()
    mgr = ck.CheckpointManager(tmp_path, keep_last=2)
    for step in range(1, 6):
        mgr.save(step, model, opt, {}, is_best=(step == 2), metric=0.5)
    assert mgr.steps() == [2, 4, 5]
    assert mgr.best().name == "step_000000002"
    assert mgr.latest().name == "step_000000005"


KILLED_MID_SAVE = """
import os, sys, torch
from graded.train import checkpoint as ck
from graded.train import checkpoint_folder
from graded.train.state_tensors import capture_rng_state, restore_rng_state
model = torch.nn.Linear(3, 2)
def killed(*args, **kwargs):  # the process dies after model.safetensors, before the rest
    os._exit(9)
checkpoint_folder.save_file = killed
ck.CheckpointManager(sys.argv[1]).save(2, model, None, {"step": 2})
"""


def test_a_writer_killed_mid_save_leaves_the_last_checkpoint_and_its_next_save_cleans_up(
        tmp_path):
    model, opt = _trained_pair()
    manager = ck.CheckpointManager(tmp_path, keep_last=2)
    manager.save(1, model, opt, {"step": 1})
    done = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, str(tmp_path)], timeout=120)
    assert done.returncode == 9
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".step_000000002.")]
    assert len(left) == 1 and (tmp_path / left[0] / ck.MODEL_FILE).is_file()  # the debris
    assert manager.steps() == [1] and manager.latest().name == "step_000000001"
    fresh = TinyClassifier()
    assert ck.load_checkpoint(manager.latest(), fresh, restore_rng=False)["step"] == 1
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                  model.state_dict().values()))
    manager.save(2, model, opt, {"step": 2})  # the run's next save removes the debris
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000001", "step_000000002"]


def test_a_checkpoint_folder_has_the_mode_of_any_folder_the_umask_allows(tmp_path):
    # it is assembled in a temporary folder: one made by tempfile.mkdtemp is 0700 whatever the
    # umask, and safetensors writes 0600 files, so other users could not read a shared run's
    # checkpoints
    model, opt = _trained_pair()
    old = os.umask(0o022)
    try:
        path = ck.save_checkpoint(tmp_path / "step_000000001", model, opt, {"step": 1})
        (tmp_path / "plain").mkdir()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    for name in (ck.STATE_FILE, ck.MODEL_FILE, ck.OPTIM_FILE):  # each file readable by all
        assert stat.S_IMODE((path / name).stat().st_mode) == 0o644, name
