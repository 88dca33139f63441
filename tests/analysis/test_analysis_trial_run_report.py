"""The run report of run folders that are unusual but real: a run without evaluation, a run
whose name is long, or holds a ``|`` or a space."""

import json

import pytest

from graded.train.report import file_label, write_runs_report


def _run(folder, *, eval_=None, grades=False):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(
        {"step": 2, "steps": 2, "train_loss": 0.5, "eval": eval_ or {}}))
    (folder / "metrics.csv").write_text("step,split,name,value\n1,train,loss,0.5\n")
    if grades:
        (folder / "grades.jsonl").write_text(
            json.dumps({"step": 1, "grades": {"grading": [1.0, 2.0]}}) + "\n")
    return folder


def _table(text):
    return [line for line in text.splitlines() if line.startswith("|")]


def _cells(line):
    """The cells of a Markdown table row (an escaped ``\\|`` is no separator)."""
    return [c.strip() for c in line.replace("\\|", "\0").strip().strip("|").split("|")]


@pytest.mark.parametrize("eval_", [{}, {"loss": 0.25, "accuracy": 0.75}])
def test_every_row_of_the_run_table_has_the_header_cell_count(tmp_path, eval_):
    """GFM renders a table only when the header and delimiter rows have the same number of
    cells: a run without evaluation gave a header of four cells over a delimiter of three."""
    report = write_runs_report([_run(tmp_path / "a", eval_=eval_)], tmp_path / "rep")
    rows = _table(report.read_text())
    counts = [len(_cells(line)) for line in rows]
    assert counts == [3 + len(eval_)] * 3, rows
    assert _cells(rows[2])[:3] == ["a", "2", "0.5"]


def test_a_run_named_with_a_pipe_is_one_cell(tmp_path):
    report = write_runs_report([_run(tmp_path / "lr|0.1", eval_={"loss": 0.25})],
                               tmp_path / "rep")
    rows = _table(report.read_text())
    assert [len(_cells(line)) for line in rows] == [4, 4, 4]
    assert _cells(rows[2])[0] == "lr\0" + "0.1"  # the escaped pipe, kept in its cell


def test_a_run_with_a_long_name_gets_its_grade_plot(tmp_path):
    """A run folder's name may have 255 bytes; ``grades_<name>.png`` then had 266, and the
    report failed with 'File name too long'."""
    long = "lgt-" + "é" * 100 + "x" * 49  # 253 bytes
    run = _run(tmp_path / long, grades=True)
    report = write_runs_report([run], tmp_path / "rep")
    plots = sorted(p.name for p in (tmp_path / "rep").glob("grades_*.png"))
    assert len(plots) == 1 and len(plots[0].encode()) <= 255
    assert f"({plots[0]})" in report.read_text()


def test_long_labels_that_begin_alike_keep_distinct_file_names():
    a, b = "r" * 300 + "a", "r" * 300 + "b"
    assert file_label(a) != file_label(b)
    assert max(len(file_label(x).encode()) for x in (a, b)) <= 200
    assert file_label("task/lgt-seed0") == "task_lgt-seed0"  # short labels are unchanged
    cut = file_label("é" * 150)  # cut between characters, not inside one
    assert cut.startswith("é" * 95) and len(cut.encode()) <= 200


def test_a_run_named_with_a_space_links_its_grade_plot(tmp_path):
    report = write_runs_report([_run(tmp_path / "lgt run", grades=True)], tmp_path / "rep")
    assert "![grades lgt run](<grades_lgt run.png>)" in report.read_text()
    assert (tmp_path / "rep" / "grades_lgt run.png").is_file()


def test_the_eval_curves_of_a_run_without_final_evaluation_are_drawn(tmp_path):
    """A run resumed and interrupted before its next evaluation has no final evaluation in
    metrics.json, but metrics.csv holds its earlier ones: their curve was left out."""
    run = _run(tmp_path / "resumed")
    with (run / "metrics.csv").open("a") as fh:
        fh.write("2,eval,loss,0.75\n4,eval,loss,0.5\n")
    text = write_runs_report([run], tmp_path / "rep").read_text()
    assert "![eval loss](eval_loss.png)" in text
    assert (tmp_path / "rep" / "eval_loss.png").is_file()
    assert _cells(_table(text)[0]) == ["run", "steps", "train loss"]  # no final figure


def test_a_long_run_name_is_cut_in_the_middle_in_the_legend():
    """The whole name made the legend wider than the figure (matplotlib: "Tight layout not
    applied")."""
    from graded.train.report import _legend_label

    name = "polynomial_regression/" + "x" * 80 + "/lgt-seed0"
    short = _legend_label(name)
    assert len(short) == 47 and short.startswith("polynomial_regression/") and \
        short.endswith("x/lgt-seed0") and "…" in short
    assert _legend_label("lgt-seed0") == "lgt-seed0"
