"""How ``graded demo`` runs its jobs: in this process or in spawned workers, and how it stops.

:func:`_run_jobs` trains the jobs (:func:`graded.demo_runs.train_one`) here when one worker is
asked for, else in a pool of spawned processes fed through a pipe each (:func:`_run_pool`).
SIGINT or SIGTERM (:class:`_MainStop`) asks every run in progress to finish its step and write a
checkpoint; a second SIGINT kills the workers at once. A stopped demo raises
:class:`DemoInterrupted` with the runs that finished.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

from graded.demo_runs import _thread_lock_for_tqdm, train_one
from graded.train.signals import StopSignals

__all__ = ["STOP_GRACE_S", "DemoInterrupted"]


class DemoInterrupted(Exception):
    """SIGINT or SIGTERM stopped the demo; ``results`` holds the runs that finished."""

    def __init__(self, results: list[dict[str, Any]], total: int) -> None:
        super().__init__(f"interrupted: {len(results)} of {total} runs finished")
        self.results = results
        self.total = total


def _worker_init() -> None:
    """A demo worker turns SIGINT/SIGTERM into KeyboardInterrupt. While a trainer trains it
    handles the signals itself (it finishes the step and writes a checkpoint); anywhere else
    (building a run, waiting for a job) the signal abandons what it was doing, which has written
    no checkpoint yet. The main process sends no job after a stop."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)


def _train_or_skip(job: dict[str, Any]) -> dict[str, Any]:
    """:func:`train_one`, or a "skipped" result when a signal abandoned it before training."""
    try:
        return train_one(job)
    except KeyboardInterrupt:
        return {**{k: job[k] for k in ("task", "model", "seed")}, "skipped": True}


class _MainStop(StopSignals):
    """SIGINT/SIGTERM in the demo's main process: the first asks every worker to stop (each
    finishes its step and writes a checkpoint), a second SIGINT kills them at once."""

    def __init__(self, *, in_process: bool = False) -> None:
        super().__init__()
        self.in_process = in_process  # runs train here: a signal outside training abandons it

    def on_signal(self, signum: int, first: bool) -> None:
        import multiprocessing as mp
        import signal

        if first:
            print("\nstopping the demo: every run in progress finishes its step and writes a "
                  "checkpoint (Ctrl-C again to abort at once)", file=sys.stderr, flush=True)
        for child in mp.active_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL if self.aborted else signal.SIGTERM)
        if self.in_process:
            raise KeyboardInterrupt


def _run_jobs(jobs: list[dict[str, Any]], workers: int) -> list[dict[str, Any]]:
    from tqdm.auto import tqdm

    _thread_lock_for_tqdm()
    results: list[dict[str, Any]] = []
    bar = tqdm(total=len(jobs), unit="run", desc="demo", dynamic_ncols=True, file=sys.stderr)

    def note(r: dict[str, Any]) -> None:
        if r.get("skipped") or r.get("interrupted"):
            return
        results.append(r)
        bar.update(1)
        what = r.get("error") or f"{r['metric_name']}={r['metric']:.4f} in {r['train_s']:.0f}s"
        bar.write(f"  {r['task']:<22} {r['model']:<8} seed {r['seed']}: {what}")

    with _MainStop(in_process=workers <= 1) as stop:
        if workers <= 1:
            for job in jobs:
                try:
                    r = train_one(job)  # the trainer turns a signal into an interrupted run
                except KeyboardInterrupt:  # a signal while no trainer was training
                    break
                note(r)
                if stop.flag or r.get("interrupted"):
                    stop.flag = True
                    break
        else:
            _run_pool(jobs, workers, stop, note)
    bar.close()
    if stop.flag:
        raise DemoInterrupted(results, len(jobs))
    return results


def _worker_loop(conn: Any) -> None:
    """A demo worker: train the jobs it receives until it receives None."""
    import traceback

    _worker_init()
    with contextlib.suppress(KeyboardInterrupt, EOFError, BrokenPipeError):
        while (job := conn.recv()) is not None:
            try:
                out = _train_or_skip(job)
            except Exception:  # a bug, not a result: the main process raises it
                out = {k: job[k] for k in ("task", "model", "seed")}
                out["worker_traceback"] = traceback.format_exc()
            conn.send(out)


def _run_pool(jobs: list[dict[str, Any]], workers: int, stop: _MainStop, note: Any) -> None:
    """Jobs in ``workers`` spawned processes, each fed through a pipe of its own (so a killed
    worker cannot leave a shared queue locked). On a stop signal the workers finish their step,
    write a checkpoint and exit; any still alive after ``STOP_GRACE_S`` seconds are killed
    (checkpoints are written atomically, so nothing is left half-written)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    queue = list(jobs)
    idle, busy, procs = [], {}, []
    for _ in range(min(workers, len(jobs))):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_loop, args=(child,), daemon=True)
        proc.start()
        child.close()
        procs.append(proc)
        idle.append(parent)
    deadline = None
    try:
        while busy or (queue and not stop.flag):
            while idle and queue and not stop.flag:
                conn = idle.pop()
                conn.send(queue.pop(0))
                busy[conn] = True
            for conn in wait(list(busy), timeout=0.1):
                try:
                    out = conn.recv()
                except (EOFError, ConnectionResetError) as exc:  # the worker died (or, on a
                    # stop, exited as its pipe was read)
                    if not stop.flag:
                        raise RuntimeError("a demo worker process died") from exc
                else:
                    if "worker_traceback" in out:
                        raise RuntimeError(f"demo run {out['task']}/{out['model']}/seed "
                                           f"{out['seed']} failed:\n{out['worker_traceback']}")
                    note(out)
                busy.pop(conn)
                idle.append(conn)
            if stop.flag:
                deadline = deadline or time.monotonic() + STOP_GRACE_S
                if stop.aborted or time.monotonic() > deadline:
                    break
    finally:
        for conn in idle:
            with contextlib.suppress(OSError):
                conn.send(None)
        end = time.monotonic() + (0.0 if stop.aborted else 1.0)
        for proc in procs:
            proc.join(timeout=max(0.0, end - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()


STOP_GRACE_S = 6.0
