"""`graded report` of runs that another process is training (it holds their lock): each is
reported as training, not by the stale end its metrics.json recorded, and nothing is written
into it (as `graded eval` of a run in use writes no eval.json there)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from test_cli_runs import held_lock

from graded.cli import main


def _interrupted_run(folder: Path) -> Path:
    """A run folder as a Ctrl-C at step 2 of 1000 leaves it: metrics.csv and a metrics.json
    whose status is interrupted (what `graded train --resume` then trains on from)."""
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("step,split,name,value\n2,train,loss,0.5\n"
                                        "2,eval,accuracy,0.75\n")
    (folder / "metrics.json").write_text(json.dumps(
        {"status": "interrupted", "step": 2, "steps": 1000, "train_loss": 0.5,
         "train_objective": "plain", "eval": {"accuracy": 0.75}, "interrupted": True,
         "early_stopped": False, "error": None}))
    return folder


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("graded: error: "), err
    assert "Traceback" not in err, err
    return lines[-1]


@pytest.mark.slow  # a training process held for the report (3 to 4 s on 2 cores): `pytest -m slow`
def test_a_folder_of_runs_reports_a_run_in_training_as_training_not_interrupted(tmp_path):
    # it was "| cut | 2 (interrupted) |" and "cut was interrupted at step 2 of 1000"
    runs = tmp_path / "runs"
    cut, idle = _interrupted_run(runs / "cut"), _interrupted_run(runs / "idle")
    with held_lock(cut) as pid:
        assert main(["report", str(runs)]) == 0
    text = (runs / "report" / "report.md").read_text()
    assert f"| cut | 2 (training, process {pid}) | 0.5 | 0.75 |" in text
    assert f"- cut is training (process {pid} holds it); its figures are from step 2" in text
    assert "cut was interrupted" not in text
    # the other run, whose lock nobody holds, is still the interrupted run it is
    assert "| idle | 2 (interrupted) | 0.5 | 0.75 |" in text
    assert "- idle was interrupted at step 2 of 1000" in text
    assert not (idle / "run.lock").exists()  # the probe takes no lock and writes nothing


def test_a_lock_file_left_by_a_killed_process_is_no_run_in_training(tmp_path):
    # the kernel drops a killed writer's lock; its file still names the process
    run = _interrupted_run(tmp_path / "runs" / "cut")
    (run / "run.lock").write_text("999999\n")
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "| cut | 2 (interrupted) | 0.5 | 0.75 |" in text and "is training" not in text


@pytest.mark.parametrize("purpose", ["evaluation", "report"])
def test_a_run_another_command_holds_for_a_moment_is_reported_by_its_end(tmp_path, capsys,
                                                                        purpose):
    """A run whose lock `graded eval` held (to write its eval.json) was reported as training,
    with "its figures are from step 2, where it last stopped": the lock file now says what it
    is held for, and only the trainer's lock marks a run in training."""
    runs = tmp_path / "runs"
    cut = _interrupted_run(runs / "cut")
    with held_lock(cut, purpose) as pid:
        assert main(["report", str(runs)]) == 0
        assert main(["report", str(cut)]) == 2  # still nothing written into a run in use
        line = _one_error_line(capsys.readouterr().err)
        assert f"in use by process {pid} ({purpose})" in line, line
    text = (runs / "report" / "report.md").read_text()
    assert "| cut | 2 (interrupted) | 0.5 | 0.75 |" in text
    assert "- cut was interrupted at step 2 of 1000" in text
    assert f"- cut is in use by process {pid} ({purpose})" in text
    assert "is training" not in text


def test_a_lock_file_of_an_earlier_version_names_a_pid_alone_and_reads_as_training():
    from graded.train.runs import LockHolder

    assert LockHolder.parse("4242\n") == LockHolder("4242", "training")
    assert LockHolder.parse("4242 evaluation\n") == LockHolder("4242", "evaluation")
    assert LockHolder.parse("") is None and LockHolder.parse("\n") is None


@pytest.mark.slow  # a training process held for the report (3 to 4 s on 2 cores): `pytest -m slow`
def test_the_report_of_one_run_in_training_is_written_to_out_only(tmp_path, capsys):
    # it was refused ("in use by process N") without a word of --out, which works
    run = _interrupted_run(tmp_path / "runs" / "cut")
    with held_lock(run) as pid:
        before = _hashes(run)  # with the lock file the training process wrote
        assert main(["report", str(run)]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"in use by process {pid} (training)" in line, line
        hint = f"graded report {run} --out {run.parent / 'cut-report'}"
        assert line.endswith(hint), line
        assert _hashes(run) == before  # no report/, no manifest entry
        # the command the refusal names writes the report, beside the run
        assert main(hint.split()[1:]) == 0
        assert capsys.readouterr().out.strip() == f"report: {run.parent / 'cut-report'}/report.md"
        text = (run.parent / "cut-report" / "report.md").read_text()
        assert f"| cut | 2 (training, process {pid}) | 0.5 | 0.75 |" in text
        # an --out inside the run is refused as `graded eval --out` inside it is
        assert main(["report", str(run), "--out", str(run / "mine")]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"--out {run / 'mine'} is inside run folder {run}, which is in use by " \
               f"process {pid}" in line, line
        assert _hashes(run) == before and not (run / "mine").exists()
    # once the run ends, its report goes into it as before
    assert main(["report", str(run)]) == 0
    assert (run / "report" / "report.md").is_file()
