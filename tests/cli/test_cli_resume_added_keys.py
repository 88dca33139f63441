"""Resuming, through the command line, a run recorded before ``task.unseen`` existed: its
``config.yaml`` and checkpoints lack the key; it resumes with the default and refuses
``task.unseen=false`` naming the key, writing nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from cli_configs import tiny_config

from graded.cli import main


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _as_recorded_before_task_unseen(run: Path) -> None:
    """Remove ``task.unseen`` from config.yaml and from every checkpoint's state.json."""
    path = run / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    assert cfg["task"].pop("unseen") is True
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for state_file in (run / "checkpoints").glob("*/state.json"):
        state = json.loads(state_file.read_text())
        del state["config"]["task"]["unseen"]
        state_file.write_text(json.dumps(state, indent=1, sort_keys=True))


def test_a_run_recorded_before_task_unseen_resumes_and_refuses_unseen_false(tmp_path, capsys):
    assert main(["train", str(tiny_config(tmp_path, steps=4, checkpoint_every=2))]) == 0
    run = tmp_path / "runs" / "tiny"
    _as_recorded_before_task_unseen(run)
    before = _hashes(run)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--set", "task.unseen=false",
                 "--set", "train.steps=6"]) == 2
    err = capsys.readouterr().err
    assert "task.unseen was true, now false" in err
    assert _hashes(run) == before  # refused before anything was written
    assert main(["train", "--resume", str(run), "--set", "train.steps=6"]) == 0
    assert json.loads((run / "metrics.json").read_text())["step"] == 6
    events = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] == "override" and e["key"] == "task.unseen"]
    assert yaml.safe_load((run / "config.yaml").read_text())["task"]["unseen"] is True
