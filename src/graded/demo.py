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

Its parts: :mod:`graded.demo_runs` (the tasks, models and the config and training of one run),
:mod:`graded.demo_workers` (the worker processes and how a signal stops them) and
:mod:`graded.demo_report` (the report and its verdict); their names are importable from here.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

from graded.checks import check_bool, check_int

# the parts' names, the private ones included, stay importable from here; run_demo looks up
# _run_jobs, baselines_for and write_demo_report here (the tests replace them on this module)
from graded.demo_report import (
    _fmt,  # noqa: F401  (imported from here by tests/cli/test_cli.py)
    _graded_loss_tasks,  # noqa: F401
    _summary,  # noqa: F401
    _verdict,  # noqa: F401  (imported from here by tests/evaluation/test_demo_verdict.py)
    write_demo_report,
)
from graded.demo_runs import (
    BATCH_SIZE,
    MODEL_SIZE,
    MODELS,
    TASKS,
    _thread_lock_for_tqdm,  # noqa: F401
    baselines_for,
    run_config,
    train_one,
)
from graded.demo_workers import (
    STOP_GRACE_S,  # noqa: F401
    DemoInterrupted,
    _MainStop,  # noqa: F401
    _run_jobs,
    _run_pool,  # noqa: F401
    _train_or_skip,  # noqa: F401
    _worker_init,  # noqa: F401
    _worker_loop,  # noqa: F401
)


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


__all__ = ["MODELS", "TASKS", "DemoInterrupted", "run_config", "run_demo", "train_one",
           "write_demo_report"]
