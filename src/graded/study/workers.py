"""What the claims study's worker processes run (:func:`_execute`: one unit, a whole
experiment or one job, whose failure comes back as its traceback) and how the main process ends
them (:func:`_stop_pool`, and SIGTERM taken as Ctrl-C). :mod:`graded.study.runner` schedules
the units."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from graded._processes import pool_workers
from graded.study.core import Context, Experiment

__all__: list[str] = []


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)


def _context(ctx: dict) -> Context:
    return Context(out=Path(ctx["out"]), quick=ctx["quick"], seeds=ctx["seeds"],
                   base_seed=ctx["base_seed"], seeds_given=ctx["seeds_given"])


def _experiment(name: str) -> Experiment:
    from graded.study.experiments import registry

    return registry()[name]


def _execute(kind: str, name: str, ctx: dict, job: dict | None = None) -> dict:
    """Run one unit in this process: a whole experiment or one job. Never raises: a failure
    comes back as its traceback."""
    began = time.perf_counter()
    try:
        experiment = _experiment(name)
        context = _context(ctx)
        if kind == "whole":
            findings = [f.as_dict() for f in experiment.run(context)]
            return {"ok": True, "findings": findings, "wall_s": time.perf_counter() - began}
        result = experiment.run_job(context, job)
        return {"ok": True, "result": result, "wall_s": time.perf_counter() - began}
    except Exception:  # a failed experiment is reported, the others go on
        return {"ok": False, "error": traceback.format_exc(),
                "wall_s": time.perf_counter() - began}


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Drop the queued units and end the running ones, whose results would not be stored: a
    worker left running keeps the interpreter from exiting until its unit is done (the pool
    joins its workers at exit), and SIGTERM reaches only this process (Ctrl-C in a terminal
    reaches the workers too)."""
    workers = pool_workers(pool)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.terminate()
    for process in workers:
        process.join(timeout=10)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the study like Ctrl-C (queued work dropped, stored results kept)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
