"""Damaged checkpoints: one-line errors naming the file, fallback to the newest intact one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_training import TinyClassifier, make_trainer

from graded.train import checkpoint as ck
from graded.train.optim import param_groups
from graded.train.runs import RunFolder
from graded.train.state_tensors import read_tensors


@pytest.fixture
def run(checkpointed_run) -> Path:
    """The run (conftest) with checkpoints at steps 4 and 8 (tests damage copies)."""
    return checkpointed_run


@pytest.fixture
def copy(run, tmp_path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def _latest(run: Path) -> Path:
    return run / "checkpoints" / "step_000000008"


def _fresh() -> tuple[TinyClassifier, torch.optim.Optimizer]:
    model = TinyClassifier()
    return model, torch.optim.AdamW(param_groups(model, 0.01))  # the groups the trainer uses


def _load_error(directory: Path, **kwargs) -> str:
    model, opt = _fresh()
    with pytest.raises(ck.CheckpointError) as exc:
        ck.load_checkpoint(directory, model, kwargs.pop("optimizer", opt), **kwargs)
    message = str(exc.value)
    assert "\n" not in message
    return message


def _cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_model_file_is_a_one_line_error_naming_it(copy):
    path = _latest(copy) / ck.MODEL_FILE
    _cut_in_half(path)
    message = _load_error(_latest(copy))
    assert message.startswith(f"checkpoint file {path}: truncated")


def test_a_truncated_optimizer_file_is_a_one_line_error_naming_it(copy):
    path = _latest(copy) / ck.OPTIM_FILE
    _cut_in_half(path)
    assert _load_error(_latest(copy)).startswith(f"checkpoint file {path}: truncated")


def test_flipped_header_bytes_are_a_one_line_error_naming_the_file(copy):
    path = _latest(copy) / ck.MODEL_FILE
    data = bytearray(path.read_bytes())
    data[8:12] = b"\xff\xfe\x00\x01"  # the JSON header starts at byte 8
    path.write_bytes(bytes(data))
    assert _load_error(_latest(copy)).startswith(f"checkpoint file {path}: ")


def test_flipped_tensor_bytes_fail_the_recorded_checksum(copy):
    path = _latest(copy) / ck.MODEL_FILE
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the last tensor's data: the header still parses
    path.write_bytes(bytes(data))
    assert _load_error(_latest(copy)) == (
        f"checkpoint file {path}: corrupt (its SHA-256 differs from the one state.json records)")


def test_garbage_state_json_is_a_one_line_error_naming_it(copy):
    path = _latest(copy) / ck.STATE_FILE
    path.write_text('{"step": 8, "sched')
    assert _load_error(_latest(copy)).startswith(f"checkpoint file {path}: truncated")
    path.write_text("[1, 2]")
    assert _load_error(_latest(copy)) == (
        f"checkpoint file {path}: not a checkpoint state (no integer 'step')")


def test_a_model_of_another_width_is_refused_naming_keys_and_shapes(run):
    wide = TinyClassifier(dim=32)
    with pytest.raises(ck.CheckpointError) as exc:
        ck.load_checkpoint(_latest(run), wide, restore_rng=False)
    message = str(exc.value)
    assert message.startswith(f"checkpoint file {_latest(run) / ck.MODEL_FILE}: does not fit")
    assert "embed.weight is (12, 16) in the file, (12, 32) in the model" in message
    assert "\n" not in message


def test_a_mismatch_leaves_the_model_unchanged(run):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ck.CheckpointError, match=r"missing 0\.weight, 0\.bias; unexpected"):
        ck.load_checkpoint(_latest(run), model, restore_rng=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_optimizer_state_of_other_parameter_groups_is_refused(run):
    model = TinyClassifier()
    split = torch.optim.AdamW([{"params": [model.embed.weight]},
                               {"params": [p for n, p in model.named_parameters()
                                           if n != "embed.weight"]}])
    message = _load_error(_latest(run), optimizer=split)
    assert f"{ck.OPTIM_FILE}: optimizer state for parameter groups of sizes" in message


def test_a_missing_optimizer_file_is_named_when_an_optimizer_is_asked_for(copy):
    path = _latest(copy) / ck.OPTIM_FILE
    path.unlink()
    assert _load_error(_latest(copy)).startswith(f"checkpoint file {path}: missing")


def test_weights_only_load_works_without_the_optimizer_file(copy, run):
    (_latest(copy) / ck.OPTIM_FILE).unlink()
    model = TinyClassifier()
    meta = ck.load_checkpoint(_latest(copy), model, restore_rng=False)
    stored = read_tensors(_latest(run) / ck.MODEL_FILE)[0]
    assert meta["step"] == 8
    assert all(torch.equal(stored[k], v) for k, v in model.state_dict().items())


def test_find_intact_skips_damaged_checkpoints_newest_first(copy):
    _cut_in_half(_latest(copy) / ck.MODEL_FILE)
    model, opt = _fresh()
    found = ck.CheckpointManager(copy / "checkpoints").find_intact(model, opt)
    assert found.path.name == "step_000000004" and found.meta["step"] == 4
    assert [p for p, _ in found.skipped] == [_latest(copy)]
    assert str(_latest(copy) / ck.MODEL_FILE) in found.skipped[0][1]


def test_no_intact_checkpoint_is_one_error_listing_each(copy):
    for step in (4, 8):
        (copy / "checkpoints" / f"step_{step:09d}" / ck.STATE_FILE).write_text("{")
    model, opt = _fresh()
    with pytest.raises(ck.CheckpointError) as exc:
        ck.CheckpointManager(copy / "checkpoints").find_intact(model, opt)
    assert "step_000000004" in str(exc.value) and "step_000000008" in str(exc.value)


def test_resume_falls_back_to_the_newest_intact_checkpoint_and_says_so(copy, tmp_path, capsys):
    full = make_trainer(tmp_path / "full", steps=8).fit().losses
    _cut_in_half(_latest(copy) / ck.MODEL_FILE)
    capsys.readouterr()
    resumed = make_trainer(copy, steps=8).fit(resume_from=copy)
    err = capsys.readouterr().err
    assert f"warning: skipped damaged checkpoint {_latest(copy)}: checkpoint file" in err
    assert "resuming from" in err and "step_000000004 (step 4)" in err
    assert resumed.losses == full[4:]  # continued exactly from step 4
    event = [e for e in RunFolder(copy).history() if e["event"] == "resume"][-1]
    assert event["step"] == 4 and event["skipped"][0][0] == str(_latest(copy))
    ck.load_checkpoint(_latest(copy), TinyClassifier(), restore_rng=False)  # rewritten intact


def _name_as_best(run: Path, step: int) -> None:
    (run / "checkpoints" / "best.json").write_text(json.dumps(
        {"checkpoint": f"step_{step:09d}", "step": step, "metric": 0.0}))


def test_a_resume_past_a_damaged_best_checkpoint_rewinds_best_json_to_the_resumed_run(copy):
    # step 8 is named best and damaged: the resumed run (from step 4) must not keep pointing
    # at it until step 8 comes round again
    _name_as_best(copy, 8)
    _cut_in_half(_latest(copy) / ck.MODEL_FILE)
    state4 = ck.read_checkpoint_state(copy / "checkpoints" / "step_000000004")
    assert state4["stopper"]["bad_evals"] == 0  # the first evaluation: the best so far
    make_trainer(copy, steps=8).fit(resume_from=copy, pause_after=4)
    best = json.loads((copy / "checkpoints" / "best.json").read_text())
    assert best == {"checkpoint": "step_000000004", "step": 4,
                    "metric": state4["stopper"]["best"]}
    assert ck.CheckpointManager(copy / "checkpoints").best() == copy / "checkpoints" / \
        "step_000000004"


def test_rewinding_best_json_removes_it_when_no_kept_checkpoint_set_the_best(copy):
    _name_as_best(copy, 8)
    state_file = copy / "checkpoints" / "step_000000004" / ck.STATE_FILE
    state = json.loads(state_file.read_text())
    state["stopper"]["best_step"] = 2  # an earlier evaluation set the best, not step 4's
    state_file.write_text(json.dumps(state))
    manager = ck.CheckpointManager(copy / "checkpoints")
    manager.rewind_best(4, state["stopper"]["best"])
    assert not (copy / "checkpoints" / "best.json").exists() and manager.best() is None
    _name_as_best(copy, 4)  # a best at or before the resumed step is the resumed run's own
    manager.rewind_best(4, 123.0)
    assert json.loads((copy / "checkpoints" / "best.json").read_text())["step"] == 4


@pytest.mark.parametrize("how", ["damaged", "named"])
def test_a_save_after_resuming_from_an_older_checkpoint_is_kept_and_resumed_next(copy, tmp_path,
                                                                                  how):
    # the run resumes at step 4 with a checkpoint at 8 in the folder: 8 damaged (skipped), or
    # intact with step 4's folder named. Its save at 6 must survive the rotation (keep_last=1
    # used to count the stale step 8 and remove step 6) and be what the next resume takes.
    full = make_trainer(tmp_path / "full", steps=8).fit().losses
    if how == "damaged":
        _cut_in_half(_latest(copy) / ck.MODEL_FILE)
        source = copy
    else:
        source = copy / "checkpoints" / "step_000000004"
    first = make_trainer(copy, steps=8, keep_last=1).fit(resume_from=source, pause_after=6)
    saved = copy / "checkpoints" / "step_000000006"
    assert first.last_checkpoint == saved and saved.is_dir()
    assert 8 not in ck.CheckpointManager(copy / "checkpoints").steps()  # the abandoned future
    second = make_trainer(copy, steps=8, keep_last=1).fit(resume_from=copy)
    assert first.losses + second.losses == full[4:]
