"""The runs of ``graded demo``: the tasks and models it compares and how one run trains.

:data:`TASKS` and :data:`MODELS` are the two graded tasks and the three models of the same size
(:data:`MODEL_SIZE`, batch :data:`BATCH_SIZE`); :func:`run_config` is the ``graded train``
config of one (task, model, seed), so that ``graded eval``, ``graded report`` and
``graded train --resume`` work on demo runs. :func:`train_one` trains one run in this process
on one thread and returns its figures (or its error); :func:`baselines_for` fits the simple
baselines of :mod:`graded.evaluation` on the same split. :mod:`graded.demo_workers` runs them
in worker processes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["BATCH_SIZE", "MODELS", "MODEL_SIZE", "TASKS", "baselines_for", "run_config",
           "train_one"]

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
