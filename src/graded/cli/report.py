"""``graded report``: the Markdown and PNG summary of finished runs (and the 004 §5.4
diagnostics of morphic ones), every input checked before the first write."""

from __future__ import annotations

import argparse
import errno
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graded.cli.command import _fail
from graded.cli.loading import _is_run_config, _library_entry, _load_run


def _morphic_diagnostics(run_dir: Path) -> Callable[[Path], Any]:
    """004 §5.4 diagnostics (utilities, routing, calibration, ablation) of a morphic run, through
    ``graded.morphic.diagnostics.write_report``: loads the best checkpoint, the initial weights
    and up to 256 evaluation examples now (a checkpoint that does not load is an error before
    anything is written) and returns the function that writes them into a folder."""
    import torch

    from graded.config import build_data, build_model
    from graded.morphic.diagnostics import write_report

    cfg, task, model, _, _ = _load_run(run_dir, "best")
    torch.manual_seed(cfg.seed)  # the run's initial weights, built as config.build_run builds them
    before = build_model(cfg, task)
    _, test = build_data(cfg, task)
    n = min(len(test), 256)
    batches = [(test.inputs[:n], test.targets[:n])]
    return lambda target: write_report(model, batches, target, before=before)


def cmd_report(args: argparse.Namespace) -> int:
    from graded.config import load_run_config
    from graded.train.report import file_label, run_labels, write_runs_report
    from graded.train.runs import LockHolder, RunFolder, RunLockedError

    given = [Path(r) for r in args.runs]
    absent = [str(path) for path in given if not path.exists()]
    if absent:
        return _fail(f"no such folder: {', '.join(absent)}; expected run folders, or folders "
                     "holding run folders")
    runs, missing = [], []
    for path in given:
        inside = [path] if (path / "metrics.json").exists() else _finished_runs_in(path)
        runs.extend(inside)
        if not inside:
            missing.append(str(path))
    if missing:
        return _fail(_not_finished(missing))
    runs = list(run_labels(runs))  # a run given twice, by two spellings, is one run
    # every check before the first write: a report is written whole or not at all
    first_is_run = runs[0] == given[0]
    out = Path(args.out) if args.out else (runs[0] if first_is_run else given[0]) / "report"
    for run in runs:  # into a run's own entry (checkpoints/): removed with it, unannounced
        entry = _library_entry(run, out)
        if entry not in (None, "report"):
            return _fail(f"--out {out} is {'inside ' if out.resolve().name != entry else ''}"
                         f"the run's own {entry}, which graded wrote there and replaces or "
                         f"removes (a resume, output.overwrite); give another folder, e.g. "
                         f"{run / 'report'} (the default) or a name of yours")
    for run in runs:  # a run in training is read, but nothing is written into it
        holder = RunFolder(run).holder()
        if holder is not None and out.resolve().is_relative_to(run.resolve()):
            return _fail(_report_in_use(run, holder, args.out))
    if out.exists() and not out.is_dir():  # before the run's manifest names it as its report
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(out))
    _read_reported(runs)
    morphic = {r: _morphic_diagnostics(r) for r in runs if (r / "config.yaml").is_file()
               and _is_run_config(r) and load_run_config(r).model.architecture == "morphic"}
    if args.out is None and first_is_run:
        try:
            RunFolder(runs[0], purpose="report").record("report")
        except RunLockedError as exc:  # another process took it since the check
            return _fail(_report_in_use(runs[0], LockHolder(exc.holder, exc.purpose), None))
    report = write_runs_report(runs, out)
    labels = run_labels(runs)
    extra = []
    for r, write_diagnostics in morphic.items():
        morphic_dir = out / f"morphic_{file_label(labels[r])}"
        write_diagnostics(morphic_dir)
        link = f"{morphic_dir.name}/report.json"
        extra.append(f"- {labels[r]}: [{link}]({link}), utility histograms, calibration and "
                     "edge ablation PNGs")
    if extra:
        with report.open("a", encoding="utf-8") as fh:
            fh.write("\n## Morphic diagnostics (004 §5.4)\n\n" + "\n".join(extra) + "\n")
    print(f"report: {report}")
    return 0


def _read_reported(runs: list[Path]) -> None:
    """Read every file of ``runs`` that :func:`~graded.train.report.write_runs_report` reads
    (``metrics.json``, ``metrics.csv``, ``grades.jsonl``), so that a damaged or missing one is
    refused before the report folder is made and the first run's manifest records it (it was
    refused after both: ``graded report RUN DAMAGED`` left an empty ``RUN/report/``)."""
    from graded.train.logging import read_grades, read_metrics
    from graded.train.report import read_summary

    for run in runs:
        read_summary(run)
        read_metrics(run)
        read_grades(run)


def _not_finished(missing: list[str]) -> str:
    """Why ``graded report`` has nothing to read in ``missing``: a run training for the first
    time (its lock held by the trainer; ``metrics.json`` is written when the run ends) is
    named with its process; otherwise these are not finished runs, nor folders of them."""
    from graded.train.runs import RunFolder

    for path in map(Path, missing):
        holder = RunFolder(path).holder() if (path / "config.yaml").is_file() else None
        if holder is not None and holder.training:
            return (f"run folder {path} is being trained by process {holder.pid} and has no "
                    "metrics.json until that run ends (or is interrupted); report it then")
    return (f"not finished run folders (no metrics.json), nor folders holding finished runs: "
            f"{missing}")


def _report_in_use(run: Path, holder: Any, out: str | None) -> str:
    """The refusal of a report written into ``run`` while another process (``holder``, a
    :class:`~graded.train.runs.LockHolder`) holds it: how to write it elsewhere (``--out``),
    as ``graded eval`` of a run in use does."""
    base = run if run.name not in ("", "..") else run.resolve()  # "." names no folder
    example = shlex.join(["graded", "report", str(run), "--out",
                          str(base.parent / (base.name + "-report"))])
    if out is not None:
        return (f"--out {out} is inside run folder {run}, which is in use by {holder}; give "
                f"--out DIR outside it, e.g. {example}")
    return (f"run folder {run} is in use by {holder}: its report is read from it but not "
            f"written into it meanwhile; give --out DIR outside it, e.g. {example}")


def _finished_runs_in(folder: Path) -> list[Path]:
    """The finished run folders (with metrics.json) directly inside ``folder``, by name."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if (p / "metrics.json").is_file())
