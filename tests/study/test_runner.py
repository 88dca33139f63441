"""The study runner: resumability, job stages, failures, settings, selection and the report."""

from __future__ import annotations

import json

import pytest

import graded.study.experiments as experiments
from graded.study.core import CLAIMS, Context, Finding, run_jobs_inline
from graded.study.runner import job_file, run_study


class Counter:
    """Counts calls in a file (experiments may run in other processes)."""

    def __init__(self, path):
        self.path = path

    def bump(self, key: str) -> None:
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        data[key] = data.get(key, 0) + 1
        self.path.write_text(json.dumps(data))

    def get(self, key: str) -> int:
        return json.loads(self.path.read_text()).get(key, 0) if self.path.exists() else 0


class WholeExperiment:
    name = "EA"
    title = "a whole experiment"
    claims = ("2", "8")

    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    def run(self, ctx: Context) -> list[Finding]:
        self.counter.bump(self.name)
        ctx.out.mkdir(parents=True, exist_ok=True)
        (ctx.out / "section.md").write_text("Extra table.\n\n![fig](a.png)\n")
        return [Finding("2", self.name, "q", "c", 3, -1.0, -2.0, -0.5, "holds"),
                Finding("8", self.name, "r", "c", 3, 0.5, 0.1, 0.9, "fails")]


class StagedExperiment:
    """Stage 0 squares 1..3; stage 1 adds the stage-0 results; summarise reports the sum."""

    name = "E/B"
    title = "a job experiment"
    claims = ("3",)
    stages = 2

    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    def plan(self, ctx, stage, previous):
        if stage == 0:
            return [{"key": f"sq|{i}", "x": i} for i in (1, 2, 3)]
        total = sum(r["y"] for r in previous.values())
        return [{"key": "sum", "x": total}]

    def run_job(self, ctx, job):
        self.counter.bump(job["key"])
        return {"y": job["x"] ** 2 if job["key"].startswith("sq") else job["x"]}

    def summarise(self, ctx, results):
        s = results["sum"]["y"]
        return [Finding("3", self.name, "sum of squares", "-", 1, s, s, s, "holds")]

    def run(self, ctx):
        return run_jobs_inline(self, ctx)


class BrokenExperiment:
    name = "EC"
    title = "fails"
    claims = ("000-I",)

    def run(self, ctx):
        raise RuntimeError("this experiment is broken")


@pytest.fixture
def fake_registry(monkeypatch, tmp_path):
    counter = Counter(tmp_path / "calls.json")
    exps = [WholeExperiment(counter), StagedExperiment(counter), BrokenExperiment()]
    monkeypatch.setattr(experiments, "registry", lambda: {e.name: e for e in exps})
    return counter


def _summary_rows(report: str) -> list[str]:
    section = report.split("## Summary: one row per claim")[1].split("## Experiments")[0]
    return [ln for ln in section.splitlines() if ln.startswith("| ") and not
            ln.startswith("| claim")]


def test_report_has_a_row_for_every_claim_and_the_rule_before_the_numbers(fake_registry,
                                                                          tmp_path):
    report = run_study(tmp_path / "out", workers=1, quick=True).read_text()
    rows = _summary_rows(report)
    assert [r.split("|")[1].strip() for r in rows] == list(CLAIMS)
    assert report.index("## The verdict rule") < report.index("## Predictions") < report.index(
        "## Summary")
    by_claim = {r.split("|")[1].strip(): r for r in rows}
    assert "**holds**" in by_claim["2"] and "**fails**" in by_claim["8"]
    assert "**holds**" in by_claim["3"] and "14.0000" in by_claim["3"]  # 1 + 4 + 9 = 14
    assert "experiment EC failed" in by_claim["000-I"]
    assert "not measured" in by_claim["1"]
    assert "](EA/a.png)" in report  # figure links made relative to the study folder
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["claim"] for r in results["claims"]] == list(CLAIMS)
    assert results["experiments"]["EC"]["error"].strip().endswith("this experiment is broken")


def test_a_finished_experiment_is_not_rerun(fake_registry, tmp_path):
    out = tmp_path / "out"
    run_study(out, workers=1, quick=True)
    run_study(out, workers=1, quick=True)
    assert fake_registry.get("EA") == 1
    assert fake_registry.get("sq|1") == 1 and fake_registry.get("sum") == 1
    assert "stored result of an earlier call" in (out / "report.md").read_text()


def test_stored_jobs_are_not_rerun_when_the_summary_is_missing(fake_registry, tmp_path):
    out = tmp_path / "out"
    run_study(out, workers=1, quick=True, only="E/B")
    assert job_file(out, "E/B", "sq|2").exists()
    (out / "E-B" / "findings.json").unlink()
    job_file(out, "E/B", "sum").unlink()
    run_study(out, workers=1, quick=True, only="E/B")
    assert fake_registry.get("sq|2") == 1  # stored stage-0 job reused
    assert fake_registry.get("sum") == 2  # the deleted job ran again


def test_a_failed_experiment_is_retried_on_the_next_call(fake_registry, tmp_path):
    out = tmp_path / "out"
    run_study(out, workers=1, quick=True)
    assert not (out / "EC" / "findings.json").exists()


def test_a_folder_with_other_settings_is_refused(fake_registry, tmp_path):
    out = tmp_path / "out"
    run_study(out, workers=1, quick=True, only="EA")
    with pytest.raises(ValueError, match="use another --out"):
        run_study(out, workers=1, quick=False, only="EA")


def test_bad_arguments_name_the_value(fake_registry, tmp_path):
    with pytest.raises(ValueError, match="unknown experiment 'E42'"):
        run_study(tmp_path, workers=1, only="E42")
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        run_study(tmp_path, workers=0)
    with pytest.raises(ValueError, match="seeds must be >= 1, got 0"):
        run_study(tmp_path, workers=1, seeds=0)


def test_the_real_registry_lists_every_experiment_and_selects_e4_e5_by_part():
    reg = experiments.registry()
    assert list(reg) == ["E1", "E2", "E3", "E4/E5", "E6", "E7", "E8", "E9"]
    assert list(experiments.select("e5,E1")) == ["E1", "E4/E5"]
    for exp in reg.values():
        assert set(exp.claims) <= set(CLAIMS)


def test_the_cli_has_the_study_subcommand():
    from graded.cli import build_parser

    args = build_parser().parse_args(["study", "--quick", "--only", "E7", "--seeds", "3",
                                      "--workers", "1", "--out", "x"])
    assert (args.quick, args.only, args.seeds, args.workers, args.out) == (True, "E7", 3, 1, "x")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["study", "--workers", "0"])


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_worker_processes_run_a_real_experiment_and_store_it(tmp_path):
    out = tmp_path / "out"
    report = run_study(out, quick=True, only="E7", workers=2).read_text()
    stored = json.loads((out / "E7" / "findings.json").read_text())
    assert [f["claim"] for f in stored["findings"]] == ["8"]
    assert "| 8 | 001 Prop 4.10 | E7 |" in report


def test_job_times_are_stored_and_summed(fake_registry, tmp_path):
    out = tmp_path / "out"
    run_study(out, workers=1, quick=True, only="E/B")
    stored = [json.loads(job_file(out, "E/B", k).read_text()) for k in ("sq|1", "sq|2", "sum")]
    assert all(r["_wall_s"] >= 0 for r in stored)
    findings = json.loads((out / "E-B" / "findings.json").read_text())
    assert findings["job_seconds"] == pytest.approx(
        sum(json.loads(p.read_text())["_wall_s"] for p in (out / "E-B" / "jobs").iterdir()))


def test_the_primary_row_of_a_claim_comes_from_its_owner():
    from graded.study.report import claim_rows

    early = Finding("6", "E2", "model bound", "-", 2, -1.0, -2.0, -0.5, "holds")
    owner = Finding("6", "E6", "layer Jacobians", "-", 2, 0.5, 0.2, 0.8, "fails")
    rows = claim_rows({"E2": [early], "E6": [owner]}, {}, {"E2": ("6",), "E6": ("6",)})
    row = next(r for r in rows if r["claim"] == "6")
    assert (row["experiment"], row["verdict"], row["findings"]) == ("E6", "fails", 2)
