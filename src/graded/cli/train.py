"""``graded train``: train a new run from a run config, or continue one with ``--resume``, and
write the plots of a finished run into ``RUN/report/``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from graded.cli.command import EXIT_INTERRUPTED, _fail
from graded.cli.loading import _is_run_config


def cmd_train(args: argparse.Namespace) -> int:
    """Train a new run, or continue one with ``--resume``.

    Nothing is written before everything has been checked: the config (a dry build of task,
    model and recipe), the run folder's lock (a second writer is refused), and for a resume
    the changes against the run's own config (keys that cannot change mid-run are refused,
    the others recorded in ``history.jsonl``) and the checkpoint's weights and optimizer state
    (a damaged newest checkpoint falls back to the newest intact one). See
    :mod:`graded.train.runs`.
    """
    from graded.config import build_run, load_config
    from graded.train.checkpoint import CheckpointManager
    from graded.train.runs import refuse_search_run

    if args.resume is not None and not args.resume.strip():  # --resume "$UNSET"
        return _fail("--resume is empty; expected a run folder of graded train")
    resume_dir = Path(args.resume) if args.resume else None
    if args.config is None and resume_dir is None:
        return _fail("train needs a CONFIG file, or --resume RUN")
    if args.config is not None and Path(args.config).is_dir():
        return _fail(_config_is_a_folder(Path(args.config)))
    if resume_dir is not None and not resume_dir.exists():
        return _fail(f"--resume {resume_dir}: no such folder; expected a run folder of "
                     "graded train")
    if resume_dir is not None and not (resume_dir / "config.yaml").is_file():
        return _fail(f"--resume {resume_dir}: not a run folder (no config.yaml)")
    if resume_dir is not None and args.config is None and not _is_run_config(resume_dir):
        from graded.config import read_config_file
        from graded.config.schema import python_run_message

        return _fail(python_run_message(resume_dir, read_config_file(resume_dir / "config.yaml")))
    config_path = Path(args.config) if args.config else resume_dir / "config.yaml"
    cfg = load_config(config_path, args.set)
    run_dir = resume_dir or cfg.run_dir()
    resume = f"graded train --resume {shlex.quote(str(run_dir))}"  # a command to copy
    refuse_search_run(run_dir)  # before the dry build, and before the lock file is written
    if resume_dir is None and CheckpointManager(run_dir / "checkpoints").folders() \
            and not cfg.output.overwrite:
        return _fail(
            f"run folder {run_dir} already has checkpoints; resume it with "
            f"`{resume}`, or pass --set output.overwrite=true (which "
            "removes only what graded wrote there) or --set name=<new name>"
        )
    parts = build_run(cfg, run_dir, resume_command=resume)
    trainer, task, model = parts.trainer, parts.task, parts.model
    try:
        with trainer.run.lock():
            if resume_dir is not None:
                trainer.prepare_resume(resume_dir)  # checks everything, writes nothing
            if trainer.ctx.is_main:
                n_params = sum(p.numel() for p in model.parameters())
                print(f"run {run_dir}: task {task.name} ({task.kind}), {n_params:,} "
                      f"parameters, recipe {cfg.recipe_name()}, {cfg.train.steps} steps",
                      file=sys.stderr)
            result = trainer.fit(resume_from=resume_dir)
    finally:
        trainer.close()
    if trainer.ctx.is_main and not result.interrupted and not result.losses:
        if result.early_stopped:
            patience = cfg.train.early_stopping.patience
            print(f"nothing to do: {run_dir} stopped early at step {result.step} (no "
                  f"improvement of {cfg.train.monitor} in {patience} evaluations); continue it "
                  f"with `{resume} --set train.early_stopping.patience=<more>` (or =null)")
        else:
            print(f"nothing to do: {run_dir} is at step {result.step} of {cfg.train.steps}; "
                  f"continue it with `{resume} --set train.steps=<more>`")
    elif trainer.ctx.is_main and not result.interrupted:
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in result.final_eval.items())
        print(f"done: step {result.step}; eval {metrics}\nrun folder: {run_dir}")
        if cfg.output.plots:
            print(f"plots: {_run_plots(run_dir).parent}")
    return EXIT_INTERRUPTED if result.interrupted else 0


def _config_is_a_folder(path: Path) -> str:
    """The refusal of a folder given as CONFIG; a run folder (it holds a ``config.yaml``) is
    told how to continue it, or to train anew from its config."""
    if (path / "config.yaml").is_file():
        quoted = shlex.quote(str(path))
        return (f"CONFIG {path} is a run folder, not a config file; continue it with "
                f"`graded train --resume {quoted}`, or train anew from its config with "
                f"`graded train {shlex.quote(str(path / 'config.yaml'))} --set name=<new name>`")
    return f"CONFIG {path} is a folder; expected a run config file (.yaml, .yml or .toml)"


def _run_plots(run_dir: Path) -> Path:
    """The report of one finished run in ``RUN/report/`` (``graded report RUN`` without the
    morphic diagnostics): report.md with its final metrics, learning curves and grade plots."""
    from graded.train.report import write_runs_report
    from graded.train.runs import RunFolder

    RunFolder(run_dir, purpose="report").record("report")
    return write_runs_report([run_dir], run_dir / "report")
