"""Grade trajectories from snapshot lists, JSONL run folders and CSV files."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from analysis_helpers import is_png

from graded.analysis import grade_trajectories, load_grade_records, plot_grade_trajectories

RECORDS = [
    {"step": 10, "grades": {"feature_grading": [0.0, 0.5], "attn.grading": [[0.0], [1.0]]}},
    {"step": 0, "grades": {"feature_grading": [0.0, 0.0], "attn.grading": [[0.0], [0.0]]}},
    {"step": 20, "grades": {"feature_grading": [0.1, 0.9], "attn.grading": [[0.2], [1.5]]}},
]


def test_trajectories_are_sorted_by_step_and_flatten_per_head_grades():
    traj = grade_trajectories(RECORDS)
    assert set(traj) == {"feature_grading", "attn.grading"}
    assert traj["feature_grading"].steps.tolist() == [0, 10, 20]
    assert traj["feature_grading"].grades.tolist() == [[0.0, 0.0], [0.0, 0.5], [0.1, 0.9]]
    assert traj["attn.grading"].grades[:, 1].tolist() == [0.0, 1.0, 1.5]


def test_jsonl_run_folder_and_csv_give_the_same_trajectories(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "grades.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    path = tmp_path / "grades.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "module", "index", "grade"])
        for r in RECORDS:
            for name, values in r["grades"].items():
                flat = [v for row in values for v in (row if isinstance(row, list) else [row])]
                for i, v in enumerate(flat):
                    w.writerow([r["step"], name, i, v])
    want = grade_trajectories(RECORDS)
    for source in (run, run / "grades.jsonl", path):
        got = grade_trajectories(source)
        for name in want:
            assert torch.equal(got[name].steps, want[name].steps)
            assert torch.equal(got[name].grades, want[name].grades)


def test_bad_sources_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"grades\.jsonl"):
        load_grade_records(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("step,value\n0,1.0\n")
    with pytest.raises(ValueError, match="module"):
        load_grade_records(bad)
    with pytest.raises(ValueError, match="empty"):
        grade_trajectories([])


def test_a_damaged_line_is_named_by_file_and_line(tmp_path):
    """A JSONL line cut short (a killed writer) or a CSV cell that is not a number used to
    raise json's or int()'s bare message, without saying where."""
    path = tmp_path / "grades.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + '{"step": 20, "gra\n')
    with pytest.raises(ValueError, match=r"grades\.jsonl:2 is not a JSON grade snapshot"):
        load_grade_records(tmp_path)
    bad = tmp_path / "grades.csv"
    bad.write_text("step,module,index,grade\n0,m,0,0.5\n10,m,x,0.7\n")
    with pytest.raises(ValueError, match=r"grades\.csv:3: .*index='x'"):
        load_grade_records(bad)


def test_plot_grade_trajectories_writes_a_png(tmp_path):
    path = plot_grade_trajectories(RECORDS, tmp_path, filename="g.png")
    assert path == tmp_path / "g.png" and is_png(path)
    with pytest.raises(ValueError, match=r"\.png"):
        plot_grade_trajectories(RECORDS, tmp_path, filename="g.svg")


def test_a_module_first_recorded_after_the_first_snapshot_keeps_its_trajectory():
    records = [{"step": 2, "grades": {"a": [1.0, 2.0]}},
               {"step": 1, "grades": {"a": [0.5, 1.5]}},
               {"step": 3, "grades": {"a": [1.0, 2.5], "b": [[1.0], [2.0]]}}]
    traj = grade_trajectories(records)
    assert list(traj) == ["a", "b"]
    assert traj["a"].steps.tolist() == [1, 2, 3]
    assert traj["b"].steps.tolist() == [3]
    assert traj["b"].grades.tolist() == [[1.0, 2.0]]


@pytest.mark.parametrize("record", [{"grades": {"a": [1.0]}}, {"step": 0, "grades": [1.0]},
                                    [1.0, 2.0]])
def test_a_malformed_snapshot_is_refused_naming_the_expected_form(record):
    with pytest.raises(ValueError, match="a grade snapshot is"):
        grade_trajectories([{"step": 1, "grades": {"a": [1.0]}}, record])
