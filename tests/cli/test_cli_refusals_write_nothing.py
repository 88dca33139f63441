"""A command the CLI refuses writes nothing: not into a run folder it reads, not a report
folder, not over a file that training wrote. And where each command writes (--out, train's
output.dir), missing parent folders are made, the same way for every command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_configs import tiny_config

from graded.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("refusals")
    assert main(["train", str(tiny_config(tmp))]) == 0
    return tmp / "runs" / "tiny"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A fresh copy of the trained run, which a test may damage."""
    return Path(shutil.copytree(trained, tmp_path / "runs" / "tiny"))


def _contents(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("damage", ["metrics.json", "metrics.csv", "grades.jsonl"])
def test_a_report_refused_for_a_damaged_run_writes_nothing_into_the_first(run, tmp_path,
                                                                         capsys, damage):
    # the damaged file was read after RUN/report/ was made and RUN's manifest recorded it
    other = Path(shutil.copytree(run, tmp_path / "runs" / "other"))
    (other / damage).unlink(missing_ok=True)  # the tiny run is not graded: no grades
    if damage != "metrics.csv":  # a missing metrics.csv; the others cut short mid-line
        (other / damage).write_text('{"step": 2, "ev')
    before = _contents(run)
    capsys.readouterr()
    assert main(["report", str(run), str(other)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graded: error: ") and str(other / damage) in err
    assert _contents(run) == before
    assert not (run / "report").exists()


def test_a_report_blocked_by_a_file_leaves_the_runs_manifest_as_it_was(run, capsys):
    # RUN/report was entered in the manifest, then making the folder failed on the file
    (run / "report").write_text("mine")
    before = _contents(run)
    capsys.readouterr()
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"graded: error: {run / 'report'} exists and is not a folder: expected a folder or a "
        "new path")
    assert _contents(run) == before


@pytest.mark.parametrize("name", ["config.yaml", "metrics.json", "metrics.csv",
                                  ".graded-run.json", "checkpoints/mine.json"])
def test_eval_out_naming_a_file_of_the_run_is_refused_before_it_is_replaced(run, capsys, name):
    # `graded eval RUN --out RUN/config.yaml` replaced the run's config with the evaluation
    before = _contents(run)
    capsys.readouterr()
    assert main(["eval", str(run), "--out", str(run / name)]) == 2
    err = capsys.readouterr().err.strip()
    entry = name.split("/")[0]
    assert err.startswith(f"graded: error: --out {run / name} is ")
    assert f"the run's own {entry}, which graded wrote there" in err
    assert f"give another path, e.g. {run / 'eval.json'}" in err
    assert _contents(run) == before


def test_eval_out_may_name_eval_json_or_a_users_file_inside_the_run(run, capsys):
    for name in ("eval.json", "mine.json", "mine.json"):  # written, then written again
        assert main(["eval", str(run), "--out", str(run / name)]) == 0
        assert json.loads((run / name).read_text()) == json.loads(capsys.readouterr().out)


def test_eval_and_report_out_make_missing_parents_as_train_output_dir_does(trained, tmp_path,
                                                                         capsys):
    # the convention: every place a command writes to is made with its parents (train's
    # output.dir, report, study, demo and the searches' --out); eval --out follows it
    config = tiny_config(tmp_path, "nested")
    assert main(["train", str(config), "--set", f"output.dir={tmp_path / 'a' / 'b'}"]) == 0
    assert (tmp_path / "a" / "b" / "nested" / "metrics.json").is_file()
    out = tmp_path / "c" / "d" / "eval.json"
    capsys.readouterr()
    assert main(["eval", str(trained), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(capsys.readouterr().out)
    assert main(["report", str(trained), "--out", str(tmp_path / "e" / "f")]) == 0
    assert (tmp_path / "e" / "f" / "report.md").is_file()


@pytest.mark.parametrize("damage", ["metrics.csv", "grades.jsonl"])
def test_write_runs_report_reads_every_run_before_making_its_folder(run, tmp_path, damage):
    """The Python API: the report folder was made before a damaged metrics.csv or
    grades.jsonl of a later run was read, and left behind, empty, by the refusal."""
    from graded.train.report import write_runs_report

    other = Path(shutil.copytree(run, tmp_path / "runs" / "other"))
    (other / damage).unlink(missing_ok=True)
    if damage == "grades.jsonl":
        (other / damage).write_text('{"step": 2, "gr')
    out = tmp_path / "reports" / "both"
    with pytest.raises((FileNotFoundError, ValueError), match=damage):
        write_runs_report([run, other], out)
    assert not out.exists()
    assert write_runs_report([run], out) == out / "report.md"
