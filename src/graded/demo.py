"""The main job (``graded demo``): baseline transformer vs LGT vs EGT on two graded tasks.

For each task and seed it trains three models of the same size through the same trainer and
configs as ``graded train``: an ungraded transformer, an LGT (000 §5, learnable grades, the
recipe of 000 Algorithm 5.1) and an EGT (000 §6-7, learnable grades, Algorithm 7.1). Next to
them it fits the simple baselines of :mod:`graded.evaluation` on the same split, so no score is
read without its context. It writes ``OUT/report.md`` (mean ± std over seeds, the budget, and
which model won where), learning-curve PNGs and grade-trajectory PNGs, and returns its path.

The tasks have graded input features, and LGT/EGT start their input grading from those natural
grades: degree-weighted polynomial regression (000 Ex. 5.11, 5.24; coefficients graded by
monomial degree) and the weighted projective space P(2,4,6,10) (a random representative λ⋆x of
a point; predict its weight-0 invariants; grades = the weights). Metric: R² for both. The
budget (steps, sizes) keeps the full demo within about 10 minutes on 2 CPU cores (about 4 on an
idle machine).
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from graded._io import atomic_write_text
from graded.checks import check_bool, check_int
from graded.train.report import mean_std
from graded.train.signals import StopSignals

# LGT and EGT start their input grading from the task's natural feature grades (aligned grades);
# every other grading starts neutral, so at step 0 the rest of each graded model equals the
# baseline, and all grades are learned.
MODELS: dict[str, dict[str, Any]] = {
    "baseline": {"grading": None},
    "LGT": {"grading": "linear", "learnable_grades": True, "input_grades": "task"},
    "EGT": {"grading": "exponential", "learnable_grades": True, "input_grades": "task"},
}

TASKS: dict[str, dict[str, Any]] = {
    "polynomial_regression": {
        "task": {"name": "polynomial_regression", "n_train": 2000, "n_eval": 500},
        "model": {"positional": "none"},
        "steps": 1500,
        "lr": 3e-3,
        "grades": "monomial degree 0..3 of each coefficient",
        # one ungraded target (the polynomial's value): the recipes on the plain loss
        "graded_loss": False,
    },
    "weighted_projective": {
        "task": {"name": "weighted_projective", "n_train": 2000, "n_eval": 500},
        "model": {"positional": "none"},
        "steps": 2000,
        "lr": 3e-3,
        "grades": "weights (2, 4, 6, 10) of J2, J4, J6, J10",
    },
}

MODEL_SIZE = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "dropout": 0.0}
BATCH_SIZE = 64


def run_config(task: str, model: str, seed: int, out_dir: Path, quick: bool) -> dict[str, Any]:
    """The run config (a ``graded train`` config as a dict) of one demo run."""
    spec = TASKS[task]
    steps = max(20, spec["steps"] // 10) if quick else spec["steps"]
    task_section = dict(spec["task"])
    if quick:
        task_section.update(n_train=400, n_eval=200)
    return {
        "name": f"{model}-seed{seed}",
        "seed": seed,
        "task": task_section,
        "model": {**MODEL_SIZE, **spec["model"], **MODELS[model]},
        # the baseline's plain recipe has no graded loss to switch
        "recipe": {"name": "auto", "options": (
            {} if MODELS[model]["grading"] is None
            else {"graded_loss": spec.get("graded_loss", True)})},
        "train": {
            "steps": steps, "batch_size": BATCH_SIZE, "lr": spec["lr"],
            "warmup_steps": max(1, steps // 20), "schedule": "cosine",
            "eval_every": max(1, steps // 10), "log_every": max(1, steps // 50),
            "keep_last": 1, "progress": False, "device": "cpu",
        },
        # a rerun replaces what the library wrote in the run folder, nothing else; the trainer
        # writes config.yaml there, so eval, report and --resume work on demo runs
        "output": {"dir": str(out_dir / task), "overwrite": True},
    }


def train_one(job: dict[str, Any]) -> dict[str, Any]:
    """Train one (task, model, seed) run in this process; return its figures (or its error)."""
    import torch

    from graded.config import build_run, validate_config
    from graded.evaluation import compute_metric
    from graded.train.objectives import predict

    torch.set_num_threads(1)
    _thread_lock_for_tqdm()
    cfg = validate_config(job["config"], f"demo {job['task']}/{job['model']}")
    out = {k: job[k] for k in ("task", "model", "seed")}
    run_dir = cfg.run_dir()
    out["run_dir"] = str(run_dir)
    try:
        parts = build_run(cfg, run_dir, resume_command=f"graded train --resume {run_dir}")
    except (ImportError, NotImplementedError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    began = time.perf_counter()
    try:
        result = parts.trainer.fit()
    except FloatingPointError as exc:  # a diverged run is a result, reported as such
        out["error"] = f"diverged: {exc}"
        return out
    out["train_s"] = time.perf_counter() - began
    if result.interrupted:
        out["interrupted"] = True
        return out
    pred = predict(parts.model, parts.test.tensors, parts.task.kind)
    out["metric_name"] = parts.task.metric
    out["metric"] = compute_metric(parts.task.metric, pred, parts.test)
    out["eval"] = result.final_eval
    out["params"] = sum(p.numel() for p in parts.model.parameters())
    out["steps"] = result.step
    return out


def baselines_for(task: str, seed: int, out_dir: Path, quick: bool) -> dict[str, float]:
    """The simple baselines' headline metric on the split of ``seed``."""
    from graded.config import build_data, build_task, validate_config
    from graded.kinds import run_baselines

    cfg = validate_config(run_config(task, "baseline", seed, out_dir, quick))
    task_obj = build_task(cfg)
    train, test = build_data(cfg, task_obj)
    return run_baselines(train, test)


def _thread_lock_for_tqdm() -> None:
    """tqdm's default lock is a multiprocessing lock, which spawned workers leak at exit."""
    import threading

    from tqdm.auto import tqdm

    tqdm.set_lock(threading.RLock())


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


def run_demo(
    out_dir: str | Path = "runs/demo", *, seeds: int = 3, quick: bool = False, workers: int = 2
) -> Path:
    """Train every (task, model, seed), fit the baselines, write ``out_dir/report.md``.

    The options are checked before anything is written: ``seeds`` and ``workers`` integers
    >= 1 (not bools), ``quick`` True or False, ``out_dir`` not an existing file. At most one
    process per run is started (``workers`` beyond the number of runs start none), and the
    report gives the number started."""
    seeds = check_int("seeds", seeds, minimum=1)
    workers = check_int("workers", workers, minimum=1)
    quick = check_bool("quick", quick)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"the demo's output folder {str(out_dir)!r} is an existing file; "
                         "expected a folder (or a path to create one at)")
    jobs = [
        {"task": t, "model": m, "seed": s, "config": run_config(t, m, s, out_dir, quick)}
        for t in TASKS for s in range(seeds) for m in MODELS
    ]
    workers = min(workers, len(jobs))  # the processes _run_pool starts
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"graded demo: {len(jobs)} runs ({len(TASKS)} tasks × {len(MODELS)} models × "
          f"{seeds} seeds) in {workers} process(es); writing to {out_dir}", file=sys.stderr)
    import torch

    began = time.perf_counter()
    threads = torch.get_num_threads()
    try:  # with workers=1 the runs train here, on 1 thread (train_one): the caller's comes back
        results = _run_jobs(jobs, workers)
        baselines = {t: [baselines_for(t, s, out_dir, quick) for s in range(seeds)]
                     for t in TASKS}
    finally:
        torch.set_num_threads(threads)
    wall = time.perf_counter() - began
    budget = {
        "wall_s": wall, "workers": workers, "seeds": seeds, "quick": quick,
        "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "steps": {t: run_config(t, "baseline", 0, out_dir, quick)["train"]["steps"]
                  for t in TASKS},
        "n_train": {t: run_config(t, "baseline", 0, out_dir, quick)["task"]["n_train"]
                    for t in TASKS},
        "model_size": MODEL_SIZE, "batch_size": BATCH_SIZE,
    }
    return write_demo_report(out_dir, results, baselines, budget)


# --------------------------------------------------------------------------- report


def _fmt(values: list[float], digits: int = 3) -> str:
    """Mean ± sample std of ``values``; the value alone for one (one seed has no spread)."""
    m, s = mean_std(values)
    if m != m:
        return "–"
    finite = sum(v is not None and v == v for v in values)
    return f"{m:.{digits}f}" if finite < 2 else f"{m:.{digits}f} ± {s:.{digits}f}"


def _verdict(task: str, metric: str, by_model: dict[str, list[float]],
             baselines: dict[str, list[float]]) -> list[str]:
    """Plain sentences: who won, and whether grading helped beyond the seed-to-seed spread.

    A seed whose score is NaN (or infinite) is no measurement: means, spreads and the number of
    seeds behind a standard error count the finite scores only."""
    from graded.evaluation import HIGHER_IS_BETTER

    sign = 1.0 if HIGHER_IS_BETTER.get(metric, True) else -1.0
    finite = {m: [v for v in vals if v is not None and math.isfinite(v)]
              for m, vals in by_model.items()}
    means = {m: mean_std(v) for m, v in finite.items() if v}
    if not means:
        return [f"- **{task}**: no model finished with a finite {metric}."]
    best = max(means, key=lambda m: sign * means[m][0])
    lines = [f"- **{task}** ({metric}): best transformer is **{best}** "
             f"({_fmt(by_model[best])})."]
    if "baseline" in means:
        b_mean, b_std = means["baseline"]
        n_b = len(finite["baseline"])
        for g in ("LGT", "EGT"):
            if not by_model.get(g):
                lines.append(f"  - {g}: not run (graded models unavailable).")
                continue
            if g not in means:
                lines.append(f"  - {g}: no seed gave a finite {metric}.")
                continue
            g_mean, g_std = means[g]
            delta = g_mean - b_mean
            if min(len(finite[g]), n_b) < 2:  # one seed has no spread: no standard error
                lines.append(f"  - {g} against the ungraded transformer: Δ = {delta:+.3f}, "
                             "not tested (a standard error needs at least 2 seeds of each; "
                             "run with --seeds 2 or more).")
                continue
            se = math.sqrt(g_std**2 / len(finite[g]) + b_std**2 / n_b)
            if sign * delta > 2 * se and delta != 0:
                word = "**better** than"
            elif sign * delta < -2 * se and delta != 0:
                word = "**worse** than"
            else:
                word = "not distinguishable from"
            lines.append(f"  - {g} is {word} the ungraded transformer: Δ = {delta:+.3f} "
                         f"(standard error {se:.3f}; better/worse means |Δ| > 2 SE).")
    simple = {n: mean_std(v)[0] for n, v in baselines.items()}
    if simple:
        top = max(simple, key=lambda n: sign * simple[n])
        beat = sign * (means[best][0] - simple[top]) > 0
        lines.append(f"  - The best simple baseline is {top} ({simple[top]:.3f}); the best "
                     f"transformer {'beats' if beat else 'does NOT beat'} it.")
    return lines


def _summary(verdict: list[str]) -> str:
    """The report's one-sentence summary of the :func:`_verdict` lines: how many (task, graded
    model) pairs were compared with the ungraded transformer (2 finite seeds of each, at
    least), and how many of those a graded model won or lost. A pair not compared (one seed, a
    failed run) is no evidence either way, so with none compared nothing is concluded."""
    pairs = 2 * len(TASKS)
    compared = [ln for ln in verdict if ln.startswith(("  - LGT is ", "  - EGT is "))]
    better = [ln for ln in compared if "**better**" in ln]
    worse = [ln for ln in compared if "**worse**" in ln]
    if not compared:
        return (f"In short: none of the {pairs} (task, graded model) pairs could be compared "
                "with the ungraded transformer (a comparison needs at least 2 seeds with a "
                "finite score of each model; run with --seeds 2 or more), so this demo says "
                "nothing about whether grading helped.")
    return (f"In short: a graded model beat the ungraded transformer beyond two standard "
            f"errors in {len(better)} of the {len(compared)} (task, graded model) pairs "
            f"compared (of {pairs}), and lost in {len(worse)}."
            + ("" if better else " With this budget, grading did not help on the pairs "
                                 "compared."))


def _graded_loss_tasks() -> str:
    """Which demo tasks train LGT and EGT on the graded loss, for the report."""
    return "; ".join(f"{task}: {'graded' if spec.get('graded_loss', True) else 'plain'} loss"
                     for task, spec in TASKS.items())


def write_demo_report(out_dir: Path, results: list[dict[str, Any]],
                      baselines: dict[str, list[dict[str, float]]],
                      budget: dict[str, Any]) -> Path:
    """``report.md`` with the tables, verdicts, budget and plots of one demo."""
    from graded.train.logging import read_metrics
    from graded.train.report import plot_curves, plot_grade_trajectories

    size = budget["model_size"]
    lines = ["# graded demo: ungraded transformer vs LGT vs EGT", "",
             "Produced by `graded demo`; every number below comes from this run. All three "
             f"models are encoders with d_model {size['d_model']}, {size['n_heads']} heads, "
             f"{size['n_layers']} layers, FFN width {size['d_ff']}, trained with AdamW (batch "
             f"{budget['batch_size']}, cosine schedule); LGT and EGT grade every stage "
             "(input, attention, FFN, output) with learnable grades, trained by the recipes of "
             "000 Algorithm 5.1 (LGT) and 7.1 (EGT, λ annealed), on the graded loss where the "
             "task's targets have grades (" + _graded_loss_tasks() + "). Their input "
             "grading starts from the task's natural grades (aligned grades), every other "
             "grading starts "
             "neutral. "
             + (f"Figures are mean ± sample std over {budget['seeds']} seeds (each seed draws "
                "its own data split and initialisation)" if budget["seeds"] > 1 else
                "Figures are those of one seed (a spread needs at least 2: --seeds 2 or more)")
             + "; the headline metric is computed by `graded.evaluation` for "
             "models and simple baselines alike, on the final model.",
             "", "## Verdict", ""]
    verdict, sections = [], []
    for task in TASKS:
        rows = [r for r in results if r["task"] == task]
        done = [r for r in rows if "error" not in r]
        metric = done[0]["metric_name"] if done else "metric"
        by_model = {m: [r["metric"] for r in done if r["model"] == m] for m in MODELS}
        base = {n: [b[n] for b in baselines[task]] for n in baselines[task][0]}
        verdict += _verdict(task, metric, by_model, base)
        eval_names = sorted({k for r in done for k in r["eval"]} - {metric})
        sec = [f"## {task}", "", f"{budget['steps'][task]} steps, {budget['n_train'][task]} "
               f"training examples; natural grades: {TASKS[task]['grades']}.", "",
               f"| model | {metric} | " + " | ".join(eval_names) + " | params | train s |",
               "|---|---|" + "---|" * len(eval_names) + "---|---|"]
        for m in MODELS:
            mr = [r for r in done if r["model"] == m]
            errs = [r["error"] for r in rows if r["model"] == m and "error" in r]
            if not mr:
                sec.append(f"| {m} | not run: {errs[0] if errs else 'no result'} |"
                           + " |" * (len(eval_names) + 2))
                continue
            cells = [_fmt([r["eval"][n] for r in mr if n in r["eval"]]) for n in eval_names]
            # the intro says "over N seeds": a model with fewer finished runs says so
            missing = len(mr) < budget["seeds"]
            fewer = f" ({len(mr)} of {budget['seeds']} seeds)" if missing else ""
            sec.append(f"| {m} | {_fmt([r['metric'] for r in mr])}{fewer} | " + " | ".join(cells)
                       + f" | {mr[0]['params']:,} | {_fmt([r['train_s'] for r in mr], 0)} |")
        for n, vals in base.items():
            sec.append(f"| *{n}* (simple baseline) | {_fmt(vals)} |"
                       + " – |" * len(eval_names) + " – | – |")
        sec.append("")
        for split, name in (("eval", metric), ("train", "loss")):
            curves = {m: [read_metrics(r["run_dir"]).get(split, {}).get(name, [])
                          for r in done if r["model"] == m] for m in MODELS}
            png = f"{task}_{split}_{name}.png"
            plot_curves(curves, out_dir / png, title=f"{task}: {split} {name}", ylabel=name)
            sec += [f"![{task} {split} {name}]({png})", ""]
        for m in ("LGT", "EGT"):
            first = next((r for r in done if r["model"] == m), None)
            if first is not None:
                png = plot_grade_trajectories(first["run_dir"], out_dir / f"{task}_{m}_grades.png",
                                              title=f"{task}: {m} grades (seed {first['seed']})")
                if png is not None:
                    sec += [f"![{task} {m} grades]({png.name})", ""]
        sections += sec
    summary = _summary(verdict)
    lines += [summary, "", *verdict, "", *sections, "## Budget", "",
                        f"- wall time {budget['wall_s']:.0f} s for all runs and baselines, "
                        f"{budget['workers']} worker process(es) with 1 thread each, on "
                        f"{budget['cpus']} CPU(s) ({budget['machine']}), Python "
                        f"{budget['python']}" + (" (quick mode)" if budget["quick"] else ""),
                        "- run folders (configs, metrics.csv, TensorBoard, checkpoints): "
                        f"`{out_dir}/<task>/<model>-seed<k>/`", ""]
    report = out_dir / "report.md"
    atomic_write_text(report, "\n".join(lines))  # a Ctrl-C leaves the old one
    return report


__all__ = ["MODELS", "TASKS", "DemoInterrupted", "run_config", "run_demo", "train_one",
           "write_demo_report"]
