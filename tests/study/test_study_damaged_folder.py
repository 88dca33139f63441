"""A study folder damaged by hand (a stored file of the wrong shape, a folder where a file goes
or the reverse) is refused by name, saying what is wrong, before anything runs: never a bare
``KeyError``, ``TypeError`` or ``OSError`` from deep in the runner or the report."""

from __future__ import annotations

import json
import re
import shutil

import pytest

import graded.study.experiments as experiments
from graded.study.core import Context
from graded.study.experiments.e1_sample_efficiency import SampleEfficiencyExperiment
from graded.study.runner import job_file, run_study
from study.test_runner import Counter as Calls  # tests/ is on the path (tests/conftest.py)
from study.test_study_trial_runner import Broken, Jobs, Whole


@pytest.fixture
def study(monkeypatch, tmp_path):
    """A folder holding a finished study of a whole experiment (EA), a job experiment (EB)
    and a failed one (EC), and the call counts of their runs."""
    calls = Calls(tmp_path / "calls.json")
    exps = {e.name: e for e in (Jobs(calls), Whole(calls), Broken())}
    monkeypatch.setattr(experiments, "registry", lambda: dict(exps))
    out = tmp_path / "out"
    run_study(out, workers=1, quick=True)
    return out, calls


def _edit(path, change) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def _each_finding(**fields):
    return lambda d: {**d, "findings": [{**f, **fields} for f in d["findings"]]}


@pytest.mark.parametrize(("change", "named"), [
    (lambda d: {**d, "wall_s": "abc"}, "wall_s must be a number >= 0.0, got 'abc'"),
    (lambda d: {**d, "wall_s": [1]}, "wall_s must be a number >= 0.0, got [1]"),
    (lambda d: {**d, "job_seconds": "x"}, "job_seconds must be a number >= 0.0, got 'x'"),
    (lambda d: {**d, "findings": {"a": 1}}, "findings is {'a': 1}; expected a list"),
    (lambda d: {**d, "findings": [[1]]}, "a finding is [1]; expected a JSON object"),
    (_each_finding(figures=5), "figures is 5; expected a list of file names"),
    (_each_finding(seeds="3"), "seeds must be an int, got '3'"),
    (_each_finding(quantity=None), "quantity is None; expected a string"),
    (_each_finding(estimate="high"), "estimate is 'high'; expected a number"),
])
def test_stored_findings_of_the_wrong_shape_are_refused_by_name(study, change, named):
    # a wall time or figure list of the wrong type failed with a bare ValueError or TypeError
    # (from float() or the report), a string count or a null quantity went into the report
    out, _ = study
    stored = out / "EA" / "findings.json"
    _edit(stored, change)
    with pytest.raises(ValueError) as refused:
        run_study(out, workers=1, quick=True)
    assert str(refused.value).startswith(f"{stored} (the stored findings of EA) is damaged: ")
    assert named in str(refused.value) and str(refused.value).endswith("delete it to rerun EA")


def test_a_stored_jobs_run_time_that_is_not_a_number_is_refused_by_name(study):
    # the summary's float() of it failed with "could not convert string to float: 'x'"
    out, calls = study
    (out / "EB" / "findings.json").unlink()
    job = job_file(out, "EB", "j2")
    _edit(job, lambda d: {**d, "_wall_s": "x"})
    with pytest.raises(ValueError, match=re.escape(f"{job} (a finished job of EB) is damaged: "
                                                   "_wall_s must be a number >= 0.0, got 'x'")):
        run_study(out, workers=1, quick=True, only="EB")
    assert calls.get("j1") == 1  # nothing ran again


def test_a_settings_file_without_its_fields_is_named_damaged(study):
    # study.json without its fields was refused as a study run "of {'quick': True}", another
    # setting, not as the damaged file it is
    out, _ = study
    _edit(out / "study.json", lambda d: {"quick": d["quick"]})
    with pytest.raises(ValueError) as refused:
        run_study(out, workers=1, quick=True)
    assert str(refused.value) == (
        f"{out / 'study.json'} (the folder's study settings) is damaged: expected a JSON object "
        "with quick, seeds, seeds_given, base_seed, missing ['seeds', 'seeds_given', "
        "'base_seed']; delete it to redo what it stored")


@pytest.mark.parametrize(("path", "kind", "expected"), [
    ("report.md", "folder", "the study's report.md file"),
    ("results.json", "folder", "the study's results.json file"),
    ("EA", "file", "the folder of experiment EA"),
    ("EC", "file", "the folder of experiment EC"),
    ("EB/jobs", "file", "the folder of EB's stored jobs"),
])
def test_a_file_where_a_folder_goes_or_the_reverse_is_refused_before_anything_runs(
        study, path, kind, expected):
    # the study ran, then failed on a bare IsADirectoryError, FileExistsError or
    # NotADirectoryError when it stored a result or wrote the report
    out, calls = study
    target = out / path
    if target.is_dir():
        shutil.rmtree(target)
    else:  # EC failed: it has no folder
        target.unlink(missing_ok=True)
    target.mkdir() if kind == "folder" else target.write_text("moved here by hand")
    (out / "EB" / "findings.json").unlink(missing_ok=True)
    with pytest.raises(ValueError) as refused:
        run_study(out, workers=1, quick=True)
    assert str(refused.value) == (f"{target} is a {kind}; expected {expected} (or nothing): "
                                  "move or delete it")
    assert calls.get("EA") == 1 and calls.get("sum") == 0 and calls.get("j1") == 1


def test_an_e1_job_file_without_its_fields_is_refused_by_name_before_any_job_runs(
        monkeypatch, tmp_path):
    # valid JSON without the fields of a run reached E1's summary, which failed on a bare
    # KeyError: 'arm', after every other job had run
    def no_job(self, ctx, job):
        raise AssertionError("no job should run: the damaged file is refused first")

    monkeypatch.setattr(SampleEfficiencyExperiment, "run_job", no_job)
    out = tmp_path / "out"
    key = SampleEfficiencyExperiment().plan(Context(out=out, quick=True, seeds=2), 1, {})[0][
        "key"]
    job = job_file(out, "E1", key)
    job.parent.mkdir(parents=True)
    job.write_text(json.dumps({"task": "poly_e1", "test": 0.5}))
    with pytest.raises(ValueError) as refused:
        run_study(out, workers=1, quick=True, only="E1")
    assert str(refused.value) == (
        f"{job} (a finished job of E1) is damaged: expected a JSON object with task, arm, n, "
        "seed, lr, val, test, train_first, train_last, diverged, missing ['arm', 'n', 'seed', "
        "'lr', 'val', 'train_first', 'train_last', 'diverged']; delete it to redo what it "
        "stored")
