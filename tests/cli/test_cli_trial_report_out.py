"""`graded report --out` inside a run's own entries (its checkpoints, its tensorboard folder): the
report is refused there, before anything is written, as `graded eval --out` is, since graded
removes those entries with whatever lies in them (`output.overwrite`, a resume's rotation)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_configs import tiny_config
from test_cli_report_in_use import _hashes, _one_error_line

from graded.cli import main


@pytest.fixture
def run(tmp_path) -> Path:
    assert main(["train", str(tiny_config(tmp_path))]) == 0
    return tmp_path / "runs" / "tiny"


def test_a_report_in_a_folder_of_the_users_inside_the_run_survives_overwrite(run, tmp_path):
    """The place to give instead: `output.overwrite` keeps "your own files" (a report in
    RUN/checkpoints/ was removed with the checkpoints, unannounced)."""
    mine = run / "mine"
    assert main(["report", str(run), "--out", str(mine)]) == 0
    assert main(["train", str(tiny_config(tmp_path)), "--set", "output.overwrite=true"]) == 0
    assert (mine / "report.md").is_file()  # a folder of the user's stays


@pytest.mark.parametrize("inside", ["checkpoints", "checkpoints/step_000000002",
                                    "tensorboard"])
def test_report_refuses_an_out_inside_the_runs_own_entries(run, capsys, inside):
    before = _hashes(run)
    out = run / inside
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(out)]) == 2
    entry = inside.split("/")[0]
    where = "inside the" if "/" in inside else "the"
    assert _one_error_line(capsys.readouterr().err) == (
        f"graded: error: --out {out} is {where} run's own {entry}, which graded wrote there and "
        f"replaces or removes (a resume, output.overwrite); give another folder, e.g. "
        f"{run / 'report'} (the default) or a name of yours")
    assert _hashes(run) == before
    assert not (run / "tensorboard").exists()


def test_report_refuses_an_out_inside_a_second_runs_checkpoints(run, tmp_path, capsys):
    other_config = tiny_config(tmp_path, "other")
    assert main(["train", str(other_config)]) == 0
    other = tmp_path / "runs" / "other"
    capsys.readouterr()
    assert main(["report", str(run), str(other), "--out", str(other / "checkpoints")]) == 2
    assert "run's own checkpoints" in _one_error_line(capsys.readouterr().err)
    assert not (other / "checkpoints" / "report.md").exists()


@pytest.mark.parametrize("out", ["report", "mine", "."])
def test_report_writes_into_the_run_itself_or_a_folder_of_the_users(run, capsys, out):
    assert main(["report", str(run), "--out", str(run / out)]) == 0
    assert (run / out / "report.md").is_file()
