"""Running the study when things go wrong: a worker process that dies (killed, out of memory)
costs its pool-mates nothing and fails only the unit that kills it again; an experiment that
crashes makes the command exit 1; stored job results of another setting are refused by name."""

from __future__ import annotations

import os
import pathlib


def quick_start() -> None:
    """A worker initialiser that imports nothing (the study's own imports torch: seconds)."""


def dying_unit(kind, name, ctx, job):
    """A unit that counts its starts in its folder and kills its worker process abruptly, as
    the kernel's out-of-memory killer would: always for experiment EA, at its first start for
    EC (killed for another's sake). A worker imports it from this module."""
    folder = pathlib.Path(ctx["out"])
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "starts", "a") as starts:
        starts.write("x")
    if name == "EA" or (name == "EC" and (folder / "starts").read_text() == "x"):
        os._exit(9)
    return {"ok": True, "findings": [], "wall_s": 0.0}


def test_a_dead_workers_pool_mates_rerun_and_a_unit_that_kills_it_again_fails(monkeypatch,
                                                                              tmp_path):
    # a dead worker failed, by name, every unit of its pool: EB (queued beside EA) and ED
    # (beside EC, whose worker died once) failed with the unit that killed its worker
    import graded.study.runner as runner  # here: the workers import this module, not torch

    monkeypatch.setattr(runner, "_execute", dying_unit)
    monkeypatch.setattr(runner, "_worker_init", quick_start)
    study = runner.StudyRun(out=tmp_path, quick=True, seeds=2, seeds_given=False, base_seed=0,
                            workers=1, command="test")
    sched = runner._Scheduler(study, {})
    sched.queue = [("whole", name, None) for name in ("EA", "EB", "EC", "ED")]
    sched.run_pool(1)
    # one worker holds two units at a time: EA died beside EB and again alone; EB then ran
    # alone, EC died beside ED, then EC and ED ran alone
    assert list(study.errors) == ["EA"]
    assert study.errors["EA"].startswith("the worker process running EA died, twice: in a "
                                         "pool with other units, then with it alone")
    assert "\n" not in study.errors["EA"]  # the report shows an error's last line
    assert study.findings == {"EB": [], "EC": [], "ED": []}
    assert all((tmp_path / n / "findings.json").is_file() for n in ("EB", "EC", "ED"))
    assert not (tmp_path / "EA" / "findings.json").exists()
    starts = {n: len((tmp_path / n / "starts").read_text()) for n in ("EA", "EB", "EC", "ED")}
    assert starts == {"EA": 2, "EB": 1, "EC": 2, "ED": 1}


class _Fine:
    name, title, claims = "EA", "measures", ("8",)

    def run(self, ctx):
        from graded.study.core import Finding

        return [Finding("8", self.name, "q", "c", 3, 0.5, 0.1, 0.9, "fails")]


class _Crashes:
    name, title, claims = "EC", "crashes", ("000-I",)

    def run(self, ctx):
        raise RuntimeError("broken on purpose")


def test_the_command_exits_with_1_when_an_experiment_failed(monkeypatch, tmp_path, capsys):
    # `graded study` (and `make demo`) exited 0 with an experiment crashed: only the report
    # said so
    import graded.study.experiments as experiments
    from graded.cli import main

    exps = {e.name: e for e in (_Fine(), _Crashes())}
    monkeypatch.setattr(experiments, "registry", lambda: dict(exps))
    out = tmp_path / "out"
    argv = ["study", "--quick", "--workers", "1", "--out", str(out)]
    assert main([*argv, "--only", "EA"]) == 0
    capsys.readouterr()
    assert main([*argv, "--only", "EA,EC"]) == 1
    err = capsys.readouterr().err
    assert "graded: error: experiment EC failed" in err and "broken on purpose" in err
    assert main([*argv, "--only", "EA"]) == 0  # EC's failure belongs to the call that ran it


def test_the_command_takes_the_failed_experiments_from_the_run_not_results_json(monkeypatch,
                                                                                tmp_path,
                                                                                capsys):
    # `graded study` read results.json back to find the failed experiments, which the run it
    # had just made knew
    import json

    import graded.study.experiments as experiments
    from graded.cli import main

    exps = {e.name: e for e in (_Fine(), _Crashes())}
    monkeypatch.setattr(experiments, "registry", lambda: dict(exps))
    out = tmp_path / "out"
    read: list[str] = []
    read_text = pathlib.Path.read_text

    def spy(self, *args, **kwargs):
        read.append(self.name)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", spy)
    assert main(["study", "--quick", "--workers", "1", "--out", str(out)]) == 1
    assert "results.json" not in read
    assert "graded: error: experiment EC failed" in capsys.readouterr().err
    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    from graded.study.runner import execute_study, run_study

    run = execute_study(out, quick=True, workers=1)  # EA reused, EC rerun and failed again
    assert run.report == out / "report.md" and run.failed == ["EC"]
    assert run.errors["EC"].strip().endswith("RuntimeError: broken on purpose")
    assert run.reused == {"EA": True, "EC": False}
    results = json.loads((out / "results.json").read_text())
    assert [n for n, e in results["experiments"].items() if e["error"]] == run.failed
    assert [f.as_dict() for f in run.findings["EA"]] == results["findings"]
    assert run_study(out, quick=True, workers=1) == out / "report.md"  # as before


class _BadFigures:
    name, title, claims = "EB", "lists its figures wrongly", ("3",)

    def run(self, ctx):
        from graded.study.core import Finding

        return [Finding("3", self.name, "q", "c", 3, 0.5, 0.1, 0.9, "fails", figures=5)]


def test_findings_the_study_could_not_read_back_fail_their_experiment_alone(monkeypatch,
                                                                            tmp_path):
    # a finding whose figures were not a list was stored, then the report failed on a bare
    # TypeError ('int' object is not iterable): no report, whatever the other experiments did
    import json

    import graded.study.experiments as experiments
    from graded.study.runner import run_study

    exps = {e.name: e for e in (_Fine(), _BadFigures())}
    monkeypatch.setattr(experiments, "registry", lambda: dict(exps))
    out = tmp_path / "out"
    run_study(out, quick=True, workers=1)
    results = json.loads((out / "results.json").read_text())
    assert results["experiments"]["EB"]["error"].strip().endswith(
        "TypeError: figures is 5; expected a list of file names")
    assert results["experiments"]["EA"]["error"] is None
    assert not (out / "EB" / "findings.json").exists() and (out / "EA" / "findings.json").exists()


class _Jobs:
    """Three jobs that record the budget (quick or full) they ran with."""

    name, title, claims, stages = "EB", "a job experiment", ("3",), 1

    def plan(self, ctx, stage, previous):
        return [{"key": f"j{i}"} for i in (1, 2, 3)]

    def run_job(self, ctx, job):
        return {"quick": ctx.quick}

    def summarise(self, ctx, results):
        from graded.study.core import Finding

        quick = float(sum(r["quick"] for r in results.values()))
        return [Finding("3", self.name, "quick jobs", "-", 3, quick, quick, quick, "holds")]


def test_stored_jobs_of_another_setting_are_refused_without_the_settings_file(monkeypatch,
                                                                              tmp_path):
    # with study.json gone, deleting the refused findings.json (as its message advises) let
    # the quick runs stored in EB/jobs be summarised as the full study's: 3 quick jobs of 3
    import json
    import re

    import pytest

    import graded.study.experiments as experiments
    from graded.study.runner import job_file, run_study

    monkeypatch.setattr(experiments, "registry", lambda: {"EB": _Jobs()})
    out = tmp_path / "out"
    run_study(out, workers=1, quick=True)
    assert json.loads(job_file(out, "EB", "j1").read_text())["_settings"]["quick"] is True
    (out / "study.json").unlink()
    (out / "EB" / "findings.json").unlink()
    with pytest.raises(ValueError, match=re.escape(str(job_file(out, "EB", "j1")))) as refused:
        run_study(out, workers=1, quick=False)
    assert f"delete {out / 'EB' / 'jobs'}" in str(refused.value)
    assert "of --quick, the mode's default seeds (2; no --seeds)" in str(refused.value)
    assert "not of this call's the full study (no --quick)" in str(refused.value)
    assert not (out / "study.json").exists()  # a refused call changes nothing
    run_study(out, workers=1, quick=True)  # the same setting still reuses them
    stored = json.loads((out / "EB" / "findings.json").read_text())["findings"][0]
    assert stored["estimate"] == 3.0


def test_a_refused_setting_is_named_in_the_commands_terms(monkeypatch, tmp_path):
    # `--quick` then `--quick --seeds 2` was refused as {'quick': True, 'seeds': 2,
    # 'seeds_given': False, ...} against the same with 'seeds_given': True: the one difference
    # (E4/E5, E6, E8 train 3 models unless --seeds is given) hidden in a field name
    import pytest

    import graded.study.experiments as experiments
    from graded.study.runner import run_study

    monkeypatch.setattr(experiments, "registry", lambda: {"EA": _Fine()})
    out = tmp_path / "out"
    run_study(out, workers=1, quick=True)
    with pytest.raises(ValueError) as refused:
        run_study(out, workers=1, quick=True, seeds=2)
    assert str(refused.value) == (
        f"{out} holds a study run of --quick, the mode's default seeds (2; no --seeds), first "
        "seed 0, not of this call's --quick, --seeds 2, first seed 0; use another --out (or "
        "delete the folder) to start afresh")
    (out / "study.json").unlink()
    with pytest.raises(ValueError, match=r"holds findings of --quick, the mode's default "
                       r"seeds \(2; no --seeds\), first seed 0, not of this call's the full "
                       r"study \(no --quick\), --seeds 5, first seed 0; delete it"):
        run_study(out, workers=1, quick=False, seeds=5)
