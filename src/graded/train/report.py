"""Markdown and PNG summaries of run folders (``graded report RUN...`` and the demo).

Reads only what a run wrote (``metrics.csv``, ``grades.jsonl``, ``metrics.json``,
``config.yaml``); never loads a model. Plots are matplotlib PNG files (Agg backend).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graded._io import atomic_write_text
from graded.plotting import pyplot, save_figure
from graded.train.logging import read_grades, read_metrics
from graded.train.runs import LockHolder, RunFolder

Series = list[tuple[int, float]]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value; NaNs skipped)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return float("nan"), float("nan")
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))


def _legend_label(label: str, most: int = 48) -> str:
    """``label`` as a legend shows it: cut in its middle past ``most`` characters (a long run
    name made the legend wider than the figure), keeping its start and its end."""
    if len(label) <= most:
        return label
    keep = (most - 1) // 2
    return f"{label[:keep]}…{label[-keep:]}"


def plot_curves(
    groups: Mapping[str, Sequence[Series]], out: str | Path, *, title: str, ylabel: str,
    log_y: bool = False,
) -> Path:
    """One line per group: the mean over its series (runs/seeds) with a ±1 std band; a group
    with one step is a marker."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, runs in groups.items():
        runs = [r for r in runs if r]
        if not runs:
            continue
        steps = sorted(set.intersection(*(set(s for s, _ in r) for r in runs)))
        by_run = [dict(r) for r in runs]
        stats = [mean_std([d[s] for d in by_run]) for s in steps]
        mean = [m for m, _ in stats]
        std = [sd for _, sd in stats]
        # a single point (a run evaluated once, at its end) is no line: draw it as a marker
        (line,) = ax.plot(steps, mean, label=f"{_legend_label(label)} (n={len(runs)})",
                          marker="o" if len(steps) == 1 else None)
        ax.fill_between(steps, [m - s for m, s in zip(mean, std)],
                        [m + s for m, s in zip(mean, std)], color=line.get_color(), alpha=0.2)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, out, dpi=110)
    return out


def plot_grade_trajectories(run_dir: str | Path, out: str | Path, *, title: str = "",
                            max_modules: int = 6,
                            records: Sequence[Mapping[str, Any]] | None = None) -> Path | None:
    """Every grade of the first ``max_modules`` grading modules against the step (one panel
    per module, one line per coordinate), drawn by
    :func:`graded.analysis.plot_grade_trajectories`. None when the run logged no grades.
    ``records``: the run's ``grades.jsonl`` (:func:`read_grades`) when already read."""
    from graded.analysis.trajectories import plot_grade_trajectories as plot

    records = read_grades(run_dir) if records is None else records
    if not records:
        return None
    out = Path(out)
    return plot(records, out.parent, filename=out.name, max_modules=max_modules,
                title=title or f"grade trajectories: {Path(run_dir).name}")


#: The longest :func:`file_label` in UTF-8 bytes: with a prefix (``grades_``, ``morphic_``) and
#: a suffix (``.png``) it stays within the 255 bytes a file name may have.
MAX_FILE_LABEL_BYTES = 200


def file_label(label: str) -> str:
    """A :func:`run_labels` label as a file name: its folders joined by ``_``, unique for each
    label. Joining alone is not: ``a/b_c``, ``a_b/c`` and a run named ``a_b_c`` all give
    ``a_b_c``. So a label with an ``_`` of its own ends with ``-`` and 8 hex digits of its
    hash (``lgt_seed0-…``); a label without one (``task/lgt-seed0``) keeps the joined name,
    which gives it back (every ``_`` there was a ``/``). A label longer than
    :data:`MAX_FILE_LABEL_BYTES` is cut, and ends with the hash too: two long labels that
    begin alike keep distinct file names."""
    name = label.replace("/", "_")
    if "_" not in label and len(name.encode("utf-8")) <= MAX_FILE_LABEL_BYTES:
        return name
    return _hashed(name, label)


def metric_file_labels(names: Sequence[str]) -> dict[str, str]:
    """Each metric name as a file name (``eval_<label>.png``): the name with ``/`` as ``_``
    (``accuracy/exact`` → ``accuracy_exact``), unique among ``names``. Where two names would
    give the same file name, or two that a case-insensitive file system (macOS, Windows) takes
    for one (``accuracy/exact`` and ``accuracy_exact``; ``R2`` and ``r2``), or a name is too
    long for a file, each of them ends with ``-`` and 8 hex digits of its hash instead."""
    plain = {n: n.replace("/", "_") for n in names}
    count: dict[str, int] = {}
    for label in plain.values():
        count[label.casefold()] = count.get(label.casefold(), 0) + 1
    out = {}
    for n, label in plain.items():
        if count[label.casefold()] == 1 and len(label.encode("utf-8")) <= MAX_FILE_LABEL_BYTES:
            out[n] = label
        else:
            out[n] = _hashed(label, n)
    return out


def _hashed(name: str, label: str) -> str:
    """``name`` cut to fit :data:`MAX_FILE_LABEL_BYTES`, then ``-`` and 8 hex digits of the
    hash of ``label`` (what it names)."""
    digest = hashlib.sha256(label.encode("utf-8")).hexdigest()[:8]
    head = name.encode("utf-8")[:MAX_FILE_LABEL_BYTES - 9].decode("utf-8", errors="ignore")
    return f"{head}-{digest}"


def _link(name: str) -> str:
    """``name`` as the target of a Markdown link or image: in ``<...>`` where it holds a
    space or a parenthesis (a run named ``lgt run``), which would otherwise end the target."""
    return f"<{name}>" if any(c in name for c in " ()") else name


def _cell(text: str) -> str:
    """``text`` as one cell of a Markdown table: a ``|`` in it (a run named ``a|b``) would
    split the cell, so it is escaped."""
    return text.replace("|", "\\|")


def _row(cells: Sequence[str]) -> str:
    """One Markdown table row of ``cells``."""
    return "| " + " | ".join(cells) + " |"


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "metrics.json"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} has no metrics.json: is it a finished run folder?")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path} is not a run summary: not JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path} is not a run summary: expected a JSON object, got "
                         f"{type(summary).__name__}")
    return summary


def run_labels(run_dirs: Sequence[str | Path]) -> dict[Path, str]:
    """A distinct label for each run folder: its name, with as many parent folders as tell it
    from the others (``polynomial_regression/lgt-seed0`` beside
    ``weighted_projective/lgt-seed0``, the demo's layout). Keyed by the paths as given; a run
    given twice (``runs/a`` and ``/abs/runs/a``, or through a link) is one run: the first
    spelling is the only key."""
    distinct: dict[Path, Path] = {}
    for r in run_dirs:
        distinct.setdefault(Path(r).resolve(), Path(r))
    runs = list(distinct.values())
    parts = {r: r.resolve().parts for r in runs}
    depth = dict.fromkeys(runs, 1)
    while True:
        labels = {r: "/".join(parts[r][-depth[r]:]) for r in runs}
        seen: dict[str, int] = {}
        for label in labels.values():
            seen[label] = seen.get(label, 0) + 1
        clash = [r for r in runs if seen[labels[r]] > 1 and depth[r] < len(parts[r])]
        if not clash:
            return labels
        for r in clash:
            depth[r] += 1


def _steps_cell(summary: Mapping[str, Any], holder: LockHolder | None = None) -> str:
    """The steps a run made, with how it ended where it did not make its planned steps, or
    that it is training (``holder``: the process that holds its lock to train it)."""
    end = (f"training, process {holder.pid}" if holder is not None
           else "failed" if summary.get("error") else "aborted" if _aborted(summary)
           else "interrupted" if summary.get("interrupted")
           else "stopped early" if summary.get("early_stopped") else None)
    return f"{summary.get('step')}" + ("" if end is None else f" ({end})")


def _aborted(summary: Mapping[str, Any]) -> bool:
    """Whether a second Ctrl-C ended the run (no checkpoint at its last step)."""
    return summary.get("status") == "aborted"


def write_runs_report(run_dirs: Sequence[str | Path], out_dir: str | Path) -> Path:
    """``report.md`` in ``out_dir``: final metrics per run, learning curves, grade plots; each
    run under its :func:`run_labels` label (a run given twice is reported once).

    A run whose lock another process holds to train it (:meth:`RunFolder.holder`) is
    training: resumed, as a first run has no ``metrics.json`` yet. Its row says so, with its
    figures from the ``metrics.json`` of its previous end, whatever that end was (interrupted,
    failed, finished); its curves go on to the last step it logged. A lock held for another
    purpose (an evaluation writing ``eval.json``, a report) does not change the run: it is
    reported by its end, and a line names the holder.

    Every run's files are read before anything is written: a run whose ``metrics.json``,
    ``metrics.csv`` or ``grades.jsonl`` does not read is refused before ``out_dir`` is made."""
    out_dir = Path(out_dir)
    labels = run_labels(run_dirs)
    runs = list(labels)
    summaries = {r: read_summary(r) for r in runs}
    metrics = {r: read_metrics(r) for r in runs}
    grades = {r: read_grades(r) for r in runs}
    out_dir.mkdir(parents=True, exist_ok=True)
    held = {r: RunFolder(r).holder() for r in runs}
    holders = {r: h if h is not None and h.training else None for r, h in held.items()}
    names = sorted({k for s in summaries.values() for k in s.get("eval", {})})
    header = ["run", "steps", "train loss", *(f"eval {_cell(n)}" for n in names)]
    lines = ["# Run report", "", _row(header), "|" + "---|" * len(header)]
    graded = {r for r, s in summaries.items() if s.get("train_objective") == "graded"}
    for r, s in summaries.items():
        ev = s.get("eval", {})
        cells = [f"{ev[n]:.4g}" if n in ev else "–" for n in names]
        loss = s.get("train_loss")
        mark = " (graded)" if r in graded else ""
        lines.append(_row([_cell(labels[r]), _steps_cell(s, holders[r]),
                           "–" if loss is None else f"{loss:.4g}{mark}", *cells]))
    lines.append("")
    training = [f"- {labels[r]} is training (process {holders[r].pid} holds it); its figures are "
                f"from step {s.get('step')}, where it last stopped" for r, s in summaries.items()
                if holders[r] is not None]
    if training:
        lines += ["Runs in training (report them again once they end):", "", *training, ""]
    in_use = [f"- {labels[r]} is in use by {h}" for r, h in held.items()
              if h is not None and not h.training]
    if in_use:
        lines += ["Runs that another command is using (their figures are their last "
                  "training's):", "", *in_use, ""]
    ended = {r: s for r, s in summaries.items() if holders[r] is None}
    failed = [f"- {labels[r]} failed at step {s.get('step')}: {str(s['error']).splitlines()[0]}"
              for r, s in ended.items() if s.get("error")]
    if failed:  # its last figures are those before the failure, not a finished run's
        lines += ["Runs that ended with an error (their figures are from before it):", "",
                  *failed, ""]
    interrupted = [f"- {labels[r]} was {'aborted' if _aborted(s) else 'interrupted'} at step "
                   f"{s.get('step')} of {s.get('steps')}" for r, s in ended.items()
                   if s.get("interrupted") and not s.get("error")]
    if interrupted:  # metrics.json is written on Ctrl-C too: the run may be resumed, not finished
        lines += ["Runs that were interrupted (resume them with `graded train --resume RUN`; "
                  "their figures are from before the interruption):", "", *interrupted, ""]
    if graded:
        lines += ["A training loss marked (graded) is the recipe's graded loss (000 Def 5.37: "
                  "each item weighted by its grade), larger than the plain loss where the "
                  "weights exceed 1 and not comparable with another run's; the eval loss is the "
                  "plain loss in every run.", ""]
    train = {labels[r] + (" (graded)" if r in graded else ""):
             [metrics[r].get("train", {}).get("loss", [])] for r in runs}
    plot_curves(train, out_dir / "train_loss.png", title="training loss", ylabel="loss")
    lines += ["## Learning curves", "", "![training loss](train_loss.png)", ""]
    # the curves of every metric an evaluation logged: a run that stopped before its first
    # evaluation since a resume has none in metrics.json, and its earlier ones in metrics.csv
    logged = sorted({*names, *(n for r in runs for n in metrics[r].get("eval", {}))})
    metric_files = metric_file_labels(logged)
    for metric in logged:
        curves = {labels[r]: [metrics[r].get("eval", {}).get(metric, [])] for r in runs}
        png = f"eval_{metric_files[metric]}.png"
        plot_curves(curves, out_dir / png, title=f"evaluation {metric}", ylabel=metric)
        lines += [f"![eval {metric}]({_link(png)})", ""]
    grade_lines = []
    for r in runs:
        png = plot_grade_trajectories(r, out_dir / f"grades_{file_label(labels[r])}.png",
                                      title=f"grade trajectories: {labels[r]}",
                                      records=grades[r])
        if png is not None:
            grade_lines += [f"![grades {labels[r]}]({_link(png.name)})", ""]
    if grade_lines:
        lines += ["## Grade trajectories", "", *grade_lines]
    report = out_dir / "report.md"
    atomic_write_text(report, "\n".join(lines) + "\n")  # a Ctrl-C leaves the old one
    return report
