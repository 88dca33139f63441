"""The study runner: run the selected experiments in worker processes, store each result as it
finishes, and write the report (``graded study``).

Layout of the output folder::

    OUT/study.json            the study's settings (mode, seeds, first seed); a folder is reused
                              only with the same settings
    OUT/<E>/findings.json     a finished experiment's findings and wall time (written atomically:
                              a finished experiment is not rerun)
    OUT/<E>/jobs/<key>.json   each finished job of a job experiment (E1) with the settings it
                              ran with, likewise not rerun
    OUT/<E>/*.png, section.md figures and the experiment's own section of the report
    OUT/report.md, OUT/results.json

An experiment is a plain :class:`graded.study.core.Experiment` (run whole in one worker) or a
:class:`graded.study.core.JobExperiment`, whose jobs are spread over all workers stage by stage
and summarised in the main process. ``workers = 1`` runs everything in this process. What is
stored, and the check that a folder holds one setting, is :mod:`graded.study.storage`; what a
worker process runs, :mod:`graded.study.workers`.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graded.checks import check_int
from graded.study.core import Context, Experiment, Finding
from graded.study.storage import (
    _read_findings,
    _read_job,
    _write_json,
    check_layout,
    check_settings,
    experiment_dir,
    job_file,
)
from graded.study.workers import _execute, _sigterm_as_interrupt, _stop_pool, _worker_init

__all__ = ["DEFAULT_SEEDS", "StudyRun", "execute_study", "experiment_dir", "job_file",
           "run_study"]

DEFAULT_SEEDS = {True: 2, False: 5}  # quick, full


def _load_findings(study: StudyRun, name: str, path: Path) -> None:
    """Reuse an experiment's stored findings (:meth:`_Scheduler._finish` wrote them); a file
    that does not hold findings is refused by name."""
    study.findings[name], study.wall[name], job_seconds = _read_findings(path, name)
    if job_seconds is not None:
        study.job_seconds[name] = job_seconds
    study.reused[name] = True


@dataclass
class StudyRun:
    """What one ``graded study`` call did: per experiment, its findings (or error), wall time
    and whether it was reused from an earlier call; ``report``, the report it wrote."""

    out: Path
    quick: bool
    seeds: int
    seeds_given: bool
    base_seed: int
    workers: int
    command: str
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    wall: dict[str, float] = field(default_factory=dict)
    reused: dict[str, bool] = field(default_factory=dict)
    job_seconds: dict[str, float] = field(default_factory=dict)  # summed job times (E1)
    total_wall: float = 0.0
    report: Path | None = None

    @property
    def failed(self) -> list[str]:
        """The experiments that failed in this call (those of earlier calls are rerun, not
        recorded), in the registry's order."""
        return list(self.errors)

    def context(self, name: str) -> Context:
        return Context(out=experiment_dir(self.out, name), quick=self.quick, seeds=self.seeds,
                       base_seed=self.base_seed, seeds_given=self.seeds_given)

    def settings(self) -> dict[str, Any]:
        return {"quick": self.quick, "seeds": self.seeds, "seeds_given": self.seeds_given,
                "base_seed": self.base_seed}


# --------------------------------------------------------------------------- main side


class _Scheduler:
    """Hands units to a pool (or runs them here) and advances job experiments stage by stage."""

    def __init__(self, study: StudyRun, experiments: dict[str, Experiment]) -> None:
        self.study = study
        self.experiments = experiments
        self.pending: dict[str, dict[str, Any]] = {}  # job experiments in progress
        self.queue: list[tuple[str, str, dict | None]] = []
        self.began: dict[str, float] = {}
        self.job_time: dict[str, float] = {}

    def ctx_dict(self, name: str) -> dict:
        c = self.study.context(name)
        return {"out": str(c.out), "quick": c.quick, "seeds": c.seeds,
                "base_seed": c.base_seed, "seeds_given": c.seeds_given}

    # ---- bookkeeping
    def start(self) -> None:
        for name, exp in self.experiments.items():
            done = experiment_dir(self.study.out, name) / "findings.json"
            if done.exists():
                _load_findings(self.study, name, done)
                self._log(f"{name}: finished earlier, reusing {done}")
                continue
            self.study.reused[name] = False
            self.began[name] = time.perf_counter()
            if hasattr(exp, "plan") and hasattr(exp, "run_job"):
                self.pending[name] = {"stage": -1, "results": {}, "waiting": set()}
                self.job_time[name] = 0.0
                self._next_stage(name)
            else:  # indivisible: start it before the jobs, which fill the gaps
                self.queue.insert(sum(u[0] == "whole" for u in self.queue),
                                  ("whole", name, None))

    def _next_stage(self, name: str) -> None:
        exp, state = self.experiments[name], self.pending[name]
        ctx = self.study.context(name)
        while not state["waiting"]:
            state["stage"] += 1
            if state["stage"] >= exp.stages:
                self._summarise(name)
                return
            try:
                jobs = exp.plan(ctx, state["stage"], dict(state["results"]))
            except Exception:
                self._fail(name, traceback.format_exc())
                return
            for job in jobs:
                path = job_file(self.study.out, name, job["key"])
                if path.exists():
                    state["results"][job["key"]] = _read_job(
                        path, name, tuple(getattr(exp, "result_fields", ())))
                    continue
                state["waiting"].add(job["key"])
                self.queue.append(("job", name, job))
            self._log(f"{name}: stage {state['stage']}: {len(jobs)} jobs, "
                      f"{len(jobs) - len(state['waiting'])} finished earlier")

    def _summarise(self, name: str) -> None:
        state = self.pending.pop(name)
        try:
            findings = self.experiments[name].summarise(self.study.context(name),
                                                        state["results"])
        except Exception:
            self._fail(name, traceback.format_exc())
            return
        timed = [r.get("_wall_s") for r in state["results"].values()]
        job_s = (sum(float(t) for t in timed) if all(t is not None for t in timed) else None)
        self._finish(name, findings, time.perf_counter() - self.began[name], job_s)

    def _finish(self, name: str, findings: list[Finding], wall: float,
                job_s: float | None = None) -> None:
        self.study.findings[name] = findings
        self.study.wall[name] = wall
        if job_s is not None:
            self.study.job_seconds[name] = job_s
        _write_json(experiment_dir(self.study.out, name) / "findings.json",
                    {"experiment": name, "wall_s": wall, "job_seconds": job_s,
                     "settings": self.study.settings(),
                     "findings": [f.as_dict() for f in findings]})
        self._log(f"{name}: finished in {wall:.0f} s ({len(findings)} findings)")

    def _fail(self, name: str, error: str, wall: float | None = None) -> None:
        """Record ``name``'s failure and its wall time (``wall``, the failed unit's own, or the
        time since it was started), which the report and results.json both give."""
        now = time.perf_counter()
        self.study.wall[name] = wall if wall is not None else now - self.began.get(name, now)
        self.pending.pop(name, None)
        self.queue = [u for u in self.queue if u[1] != name]
        self.study.errors[name] = error
        self._log(f"{name}: FAILED\n{error}")

    def done(self, unit: tuple[str, str, dict | None], out: dict) -> None:
        kind, name, job = unit
        if name in self.study.errors:
            return
        if not out["ok"]:
            self._fail(name, out["error"], out["wall_s"] if kind == "whole" else None)
            return
        if kind == "whole":
            try:  # findings that could not be read back once stored fail their experiment
                findings = [Finding.from_dict(f) for f in out["findings"]]
            except (TypeError, ValueError):
                self._fail(name, traceback.format_exc(), out["wall_s"])
                return
            self._finish(name, findings, out["wall_s"])
            return
        state = self.pending.get(name)
        if state is None:
            return
        out["result"]["_wall_s"] = out["wall_s"]
        _write_json(job_file(self.study.out, name, job["key"]),
                    {**out["result"], "_settings": self.study.settings()})
        state["results"][job["key"]] = out["result"]
        state["waiting"].discard(job["key"])
        if not state["waiting"]:
            self._next_stage(name)

    @staticmethod
    def _log(message: str) -> None:
        print(f"graded study: {message}", file=sys.stderr, flush=True)

    # ---- execution
    def run_here(self) -> None:
        while self.queue:
            unit = self.queue.pop(0)
            self.done(unit, _execute(unit[0], unit[1], self.ctx_dict(unit[1]), unit[2]))

    def run_pool(self, workers: int) -> None:
        """Run the queue in ``workers`` spawned processes. A worker that dies (killed by a
        signal, by the kernel for want of memory) breaks the pool, which ends every unit in
        it, and which one the dead worker ran is not known: each of those units (up to
        2 × ``workers``) is rerun alone in a fresh pool before the rest of the queue goes on,
        so that the pool-mates of the dead worker's unit are stored as if nothing had happened
        and a unit whose worker dies again fails, named as the one that kills it."""
        import multiprocessing as mp

        def new_pool() -> ProcessPoolExecutor:
            return ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                       initializer=_worker_init)

        def submit(unit: tuple[str, str, dict | None]) -> None:
            running[pool.submit(_execute, unit[0], unit[1], self.ctx_dict(unit[1]),
                                unit[2])] = unit

        pool = new_pool()
        running: dict[Future, tuple[str, str, dict | None]] = {}
        lost: list[tuple[str, str, dict | None]] = []  # units of a broken pool, to rerun
        try:
            while self.queue or running or lost:
                alone = bool(lost)  # a unit of a broken pool runs alone, to be named if it dies
                if alone:
                    unit = lost.pop(0)
                    if unit[1] in self.study.errors:  # its experiment failed meanwhile
                        continue
                    submit(unit)
                while not alone and self.queue and len(running) < 2 * workers:
                    submit(self.queue.pop(0))
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                broken = [f for f in finished if isinstance(f.exception(), BrokenProcessPool)]
                for fut in finished:
                    if fut not in broken:
                        self.done(running.pop(fut), fut.result())
                if broken:
                    units = list(running.values())
                    if alone:
                        self._killed(units[0], broken[0].exception())
                    else:
                        lost = [u for u in units if u[1] not in self.study.errors]
                        self._log(f"a worker process died ({broken[0].exception()}); the "
                                  f"{len(lost)} units of its pool run again, one at a time")
                    running.clear()
                    _stop_pool(pool)
                    pool = new_pool()
        except BaseException:  # Ctrl-C, SIGTERM or a bug: stored results stay
            _stop_pool(pool)
            raise
        pool.shutdown(wait=True)

    def _killed(self, unit: tuple[str, str, dict | None], error: BaseException) -> None:
        """Fail the experiment of ``unit``, whose worker died while it ran alone in its pool,
        after a first pool with it in had broken too."""
        kind, name, job = unit
        what = name if kind == "whole" else f"{name}'s job {job['key']!r}"
        self._fail(name, f"the worker process running {what} died, twice: in a pool with other "
                   "units, then with it alone (killed by a signal, or out of memory: "
                   f"{error}); what was stored stays, and the same command reruns the rest")


def run_study(out: str | Path = "runs/study", *, quick: bool = False, only: str | None = None,
              seeds: int | None = None, workers: int = 2, base_seed: int = 0,
              command: str | None = None) -> Path:
    """Run the experiments selected by ``only`` (all by default) and write ``OUT/report.md``
    and ``OUT/results.json``; returns the report's path. ``seeds`` overrides the mode's default
    (2 quick, 5 full); experiments finished by an earlier call with the same settings are
    reused, not rerun. :func:`execute_study` does the same and returns what the call did."""
    report = execute_study(out, quick=quick, only=only, seeds=seeds, workers=workers,
                           base_seed=base_seed, command=command).report
    assert report is not None  # execute_study writes it
    return report


def execute_study(out: str | Path = "runs/study", *, quick: bool = False,
                  only: str | None = None, seeds: int | None = None, workers: int = 2,
                  base_seed: int = 0, command: str | None = None) -> StudyRun:
    """:func:`run_study`, returning the :class:`StudyRun` of the call: its report's path
    (``report``), every experiment's findings, and the experiments that failed (``failed``,
    with their tracebacks in ``errors``), for a caller that acts on them (``graded study``
    exits 1 after the report when one failed)."""
    from graded.study.experiments import select
    from graded.study.report import write_report

    if seeds is not None:
        seeds = check_int("seeds", seeds, minimum=1)
    workers = check_int("workers", workers, minimum=1)
    base_seed = check_int("base_seed", base_seed, minimum=0)
    experiments = select(only)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; expected a folder (new or of an earlier "
                         "study)")
    out.mkdir(parents=True, exist_ok=True)
    study = StudyRun(out=out, quick=quick, seeds=seeds or DEFAULT_SEEDS[quick],
                     seeds_given=seeds is not None, base_seed=base_seed, workers=workers,
                     command=command or _command(quick, only, seeds, workers, out))
    check_layout(out, experiments)
    check_settings(out, study.settings())
    began = time.perf_counter()
    sched = _Scheduler(study, experiments)
    with _sigterm_as_interrupt():
        sched.start()
        if workers == 1:
            sched.run_here()
        else:
            sched.run_pool(workers)
    study.total_wall = time.perf_counter() - began
    study.errors = {n: study.errors[n] for n in experiments if n in study.errors}
    _load_others(study, experiments)
    study.report = write_report(study, machine=_machine())
    return study


def _load_others(study: StudyRun, selected: dict[str, Experiment]) -> None:
    """Findings stored in the folder by earlier calls for experiments not selected now, so
    that runs of ``--only`` parts add up to one report."""
    from graded.study.experiments import registry

    for name in registry():
        path = experiment_dir(study.out, name) / "findings.json"
        if name in selected or not path.exists():
            continue
        _load_findings(study, name, path)


def _command(quick: bool, only: str | None, seeds: int | None, workers: int, out: Path) -> str:
    parts = ["graded study"]
    if quick:
        parts.append("--quick")
    if only:
        parts.append(f"--only {only}")
    if seeds is not None:
        parts.append(f"--seeds {seeds}")
    parts += [f"--workers {workers}", f"--out {out}"]
    return " ".join(parts)


def _machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__}
