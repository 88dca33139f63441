"""The file names of a run report are unique per run and per metric. A run label becomes a
file name with its folders joined by ``_``, and ``a/b`` and a run named ``a_b`` then wrote the
same ``grades_a_b.png``: the second run's plot replaced the first's, and both linked to it."""

import json
import re

from graded.train.report import file_label, run_labels, write_runs_report


def _run(folder, *, metrics=""):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(
        {"step": 2, "steps": 2, "train_loss": 0.5, "eval": {}}))
    (folder / "metrics.csv").write_text("step,split,name,value\n1,train,loss,0.5\n" + metrics)
    (folder / "grades.jsonl").write_text(
        json.dumps({"step": 1, "grades": {"grading": [1.0, 2.0]}}) + "\n")
    return folder


def _targets(text, kind):
    """The file each ``![kind ...](target)`` image of the report links to."""
    return [t.strip("<>") for t in re.findall(rf"!\[{kind} [^\]]*\]\(([^)]*\)?)\)", text)]


def test_runs_whose_labels_join_to_one_name_get_one_grade_plot_each(tmp_path):
    runs = [_run(tmp_path / "x" / "a_b"), _run(tmp_path / "a" / "b"), _run(tmp_path / "c" / "b")]
    labels = run_labels(runs)
    assert sorted(labels.values()) == ["a/b", "a_b", "c/b"]
    report = write_runs_report(runs, tmp_path / "rep")
    plots = sorted(p.name for p in (tmp_path / "rep").glob("grades_*.png"))
    assert len(plots) == 3
    targets = _targets(report.read_text(), "grades")
    assert sorted(targets) == plots  # each run links its own plot


def test_file_labels_are_distinct_for_labels_that_join_alike_and_readable():
    labels = ["a/b/c", "a_b/c", "a/b_c", "a_b_c", "a__b/c", "a/_b/c", "a_/b/c", "a/b/c-x"]
    names = [file_label(x) for x in labels]
    assert len(set(names)) == len(names), dict(zip(labels, names))
    for label, name in zip(labels, names):  # the joined label, then a hash where ambiguous
        assert name.startswith(label.replace("/", "_"))
    assert file_label("task/lgt-seed0") == "task_lgt-seed0"  # no "_" of its own: unchanged
    assert re.fullmatch(r"lgt_seed0-[0-9a-f]{8}", file_label("lgt_seed0"))
    assert file_label("lgt_seed0") == file_label("lgt_seed0")  # the same run, the same name


def test_metric_names_get_distinct_linked_files_also_on_a_case_insensitive_disk(tmp_path):
    metrics = "".join(f"2,eval,{name},0.25\n" for name in
                      ("acc/top1", "acc_top1", "R2", "r2", "exact match", "loss"))
    report = write_runs_report([_run(tmp_path / "run", metrics=metrics)], tmp_path / "rep")
    targets = _targets(report.read_text(), "eval")
    assert len(targets) == 6
    assert len({t.casefold() for t in targets}) == 6
    assert all((tmp_path / "rep" / t).is_file() for t in targets)
    assert "eval_loss.png" in targets and "eval_exact match.png" in targets
    assert "(<eval_exact match.png>)" in report.read_text()  # a space: still one link
    from graded.train.report import metric_file_labels

    files = metric_file_labels(["acc/top1", "loss"])
    assert files == {"acc/top1": "acc_top1", "loss": "loss"}  # no clash: no hash
