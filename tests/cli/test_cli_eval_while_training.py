"""`graded eval` of a run that trains meanwhile: the checkpoint it picked may be rotated away
(``keep_last``, a best that is no longer the best) between the lookup and the load. The trainer
is simulated deterministically: the load first saves a newer checkpoint and removes the one it
was asked for, as a save and its rotation do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_configs import tiny_config

from graded.cli import main
from graded.train import checkpoint as ck


@pytest.fixture
def run(tmp_path) -> Path:
    """Four steps, a checkpoint every two: step 2 and step 4 (the final one) are kept."""
    assert main(["train", str(tiny_config(tmp_path, "tiny", steps=4, checkpoint_every=2))]) == 0
    return tmp_path / "runs" / "tiny"


def _newest(root: Path) -> Path:
    return max(p for p in root.iterdir() if ck.STEP_DIR.match(p.name))


def _save_newer(root: Path) -> Path:
    """A checkpoint two steps past the newest, as the trainer saves it (the newest's weights,
    its own step), named best: the save of a run that is still improving."""
    newest = _newest(root)
    step = int(ck.STEP_DIR.match(newest.name).group(1)) + 2
    target = root / f"step_{step:09d}"
    shutil.copytree(newest, target)
    state = json.loads((target / ck.STATE_FILE).read_text())
    state["step"] = step  # state.json's checksums cover the tensor files only
    (target / ck.STATE_FILE).write_text(json.dumps(state))
    (root / "best.json").write_text(json.dumps({"checkpoint": target.name, "step": step,
                                                "metric": 0.0}))
    return target


def _rotating(monkeypatch, times: int | None, *, keep: int = 3) -> list[Path]:
    """Make the first ``times`` loads (all of them with None) happen after the trainer saved a
    newer checkpoint and rotated the asked one away, with those older than the last ``keep``;
    returns the folders asked for."""
    real = ck.load_checkpoint
    asked: list[Path] = []

    def load(directory, *args, **kwargs):
        directory = Path(directory)
        asked.append(directory)
        if times is None or len(asked) <= times:
            _save_newer(directory.parent)
            shutil.rmtree(directory, ignore_errors=True)
            steps = sorted(p for p in directory.parent.iterdir() if ck.STEP_DIR.match(p.name))
            for old in steps[:-keep]:
                shutil.rmtree(old)
        return real(directory, *args, **kwargs)

    monkeypatch.setattr(ck, "load_checkpoint", load)
    return asked


def _final_eval(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())["eval"]


def test_eval_best_rotated_away_while_read_evaluates_the_new_best(run, monkeypatch, capsys):
    """It failed with "checkpoint file .../state.json: missing". The new best holds the final
    weights, so its figures are the run's own final evaluation (metrics.json)."""
    checkpoints = run / "checkpoints"
    named = checkpoints / json.loads((checkpoints / "best.json").read_text())["checkpoint"]
    asked = _rotating(monkeypatch, 1)
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert asked == [named, checkpoints / "step_000000006"]
    assert printed["checkpoint"] == str(checkpoints / "step_000000006")
    assert printed["step"] == 6
    assert printed["metrics"] == pytest.approx(_final_eval(run), rel=1e-5)
    assert captured.err == ""


def test_eval_latest_whose_listed_checkpoints_all_vanished_lists_them_again(run, monkeypatch,
                                                                           capsys):
    """keep_last=1: the save of step 6 removes steps 2 and 4 while step 4 is read. It failed
    with "holds no intact checkpoint", naming both as damaged; now step 6 is evaluated and
    nothing is called damaged."""
    checkpoints = run / "checkpoints"
    asked = _rotating(monkeypatch, 1, keep=1)
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", "latest"]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    # step 2 too was listed before the rotation; the second look lists step 6 alone
    assert asked == [checkpoints / f"step_00000000{s}" for s in (4, 2, 6)]
    assert printed["step"] == 6
    assert printed["metrics"] == pytest.approx(_final_eval(run), rel=1e-5)
    assert "damaged" not in captured.err and captured.err == ""


def test_a_damaged_checkpoint_is_still_named_when_a_removed_one_is_not(run, monkeypatch,
                                                                      capsys):
    """Step 6 is damaged (its weights truncated), step 4 is removed while read, step 2 loads:
    the warning names step 6 alone (step 4 was called damaged too)."""
    checkpoints = run / "checkpoints"
    newest = _save_newer(checkpoints)  # step 6, damaged below
    weights = newest / ck.MODEL_FILE
    weights.write_bytes(weights.read_bytes()[:100])
    real = ck.load_checkpoint
    asked: list[Path] = []

    def load(directory, *args, **kwargs):
        asked.append(Path(directory))
        if Path(directory).name == "step_000000004":
            shutil.rmtree(directory)
        return real(directory, *args, **kwargs)

    monkeypatch.setattr(ck, "load_checkpoint", load)
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", "latest"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["step"] == 2
    assert asked == [checkpoints / f"step_00000000{s}" for s in (6, 4, 2)]
    warnings = captured.err.strip().splitlines()
    assert len(warnings) == 1, warnings
    assert f"skipped damaged checkpoint {newest}: checkpoint file {weights}" in warnings[0]


@pytest.mark.parametrize("which", ["best", "latest"])
def test_eval_of_a_run_whose_checkpoints_keep_vanishing_says_it_is_being_written(
        run, monkeypatch, capsys, which):
    """Every load finds its checkpoint rotated away: a bounded number of looks, then one error
    line naming the run and saying it is being written (it was a raw "state.json: missing")."""
    asked = _rotating(monkeypatch, None)
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", which]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"graded: error: run {run} is being written"), err[0]
    # best: one load a look; latest: every listed checkpoint a look (two, then more)
    looks = ck.CHECKPOINT_LOOKUPS
    assert len(asked) == looks if which == "best" else looks <= len(asked) <= 3 * looks
    assert len(set(asked)) == len(asked)  # each look took a newer checkpoint


def test_eval_of_a_named_checkpoint_removed_while_read_says_the_run_is_being_written(
        run, monkeypatch, capsys):
    checkpoints = run / "checkpoints"
    asked = _rotating(monkeypatch, 1)
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", "step_000000004"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert asked == [checkpoints / "step_000000004"]  # a named folder has no successor
    assert len(err) == 1 and err[0].startswith(f"graded: error: run {run} is being written")
    assert str(checkpoints / "step_000000004") in err[0]


def test_a_damaged_best_is_reported_once_not_looked_up_again(run, monkeypatch, capsys):
    """The lookup standing still (best.json names the same folder) means the failure is the
    checkpoint's own: its error, after one load."""
    checkpoints = run / "checkpoints"
    named = checkpoints / json.loads((checkpoints / "best.json").read_text())["checkpoint"]
    weights = named / ck.MODEL_FILE
    weights.write_bytes(weights.read_bytes()[:100])
    asked = _rotating(monkeypatch, 0)
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert asked == [named]
    assert len(err) == 1 and err[0].startswith(f"graded: error: checkpoint file {weights}: ")
