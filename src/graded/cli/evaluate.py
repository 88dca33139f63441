"""``graded eval``: evaluate a run's checkpoint on its evaluation split, and keep the result in
``RUN/eval.json`` (or ``--out PATH``) without replacing what training wrote or writing into a
run another process holds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from graded.cli.loading import _library_entry, _load_run


def cmd_eval(args: argparse.Namespace) -> int:
    from graded.config import build_data
    from graded.train.objectives import evaluate

    run_dir = Path(args.run)
    if args.out is not None and Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a folder; expected the path of a JSON file to "
                         f"write, e.g. {Path(args.out) / 'eval.json'}")
    if args.out is not None:
        _refuse_run_file(run_dir, Path(args.out))
    cfg, task, model, ckpt, meta = _load_run(run_dir, args.checkpoint)
    train, test = build_data(cfg, task)
    metrics = evaluate(model, test.tensors, task.kind, batch_size=cfg.train.eval_batch_size)
    out: dict[str, Any] = {"checkpoint": str(ckpt), "step": meta["step"], "metrics": metrics}
    if args.baselines:  # scored by the same metrics as the model, side by side
        from graded.kinds import baseline_report

        out["baselines"] = baseline_report(train, test)
    text = json.dumps(out, indent=2, default=str)
    _keep_evaluation(run_dir, None if args.out is None else Path(args.out), text)
    print(text)
    return 0


def _refuse_run_file(run_dir: Path, out: Path) -> None:
    """ValueError when ``--out`` names a file of the run itself, or one inside such an entry
    (``RUN/config.yaml``, ``RUN/checkpoints/...``): the evaluation would replace what training
    wrote (``--out RUN/config.yaml`` left a run whose config was the evaluation's JSON).
    ``RUN/eval.json``, the default, and the user's own names inside the run are allowed."""
    entry = _library_entry(run_dir, out)
    if entry is not None and entry != "eval.json":
        inside = out.resolve().name != entry
        raise ValueError(f"--out {out} is {'inside ' if inside else ''}the run's "
                         f"own {entry}, which graded wrote there and the evaluation would "
                         f"replace; give another path, e.g. {run_dir / 'eval.json'} (the "
                         "default) or a name of yours")


def _keep_evaluation(run_dir: Path, out: Path | None, text: str) -> None:
    """Write an evaluation to ``out``, or to ``RUN/eval.json`` by default. A file inside the
    run folder is written under the run's lock (and entered in its manifest when directly
    inside it, as ``eval.json`` is). While another process holds the lock (the run is
    training) the default is not written: the result is printed only, which one line on
    stderr says; an ``out`` inside the folder is refused then, naming the holder."""
    from graded.train.checkpoint import atomic_write_text
    from graded.train.runs import RunError, RunFolder, RunLockedError

    target = run_dir / "eval.json" if out is None else out
    if not target.resolve().is_relative_to(run_dir.resolve()):
        atomic_write_text(target, text)
        return
    folder = RunFolder(run_dir, purpose="evaluation")
    try:
        with folder.lock():
            if target.resolve().parent == run_dir.resolve():
                folder.record(target.name)
            atomic_write_text(target, text)
    except RunLockedError as exc:
        if out is not None:
            raise RunError(f"--out {out} is inside run folder {run_dir}, which is in use by "
                           f"process {exc.holder} for {exc.purpose}; give a path outside it"
                           ) from None
        print(f"graded: run folder {run_dir} is in use by process {exc.holder} for "
              f"{exc.purpose}: the evaluation is printed, not written to its eval.json (--out "
              "PATH writes it elsewhere)", file=sys.stderr)
