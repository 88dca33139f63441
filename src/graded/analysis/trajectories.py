"""Grade trajectories: the grades of every grading module against the training step.

000 §5.4 and §7 (Algorithms 5.1, 7.1) learn the grades; the trainer records a snapshot of
every grading module's grades at each logging step (``grades.jsonl`` in a run folder: one
JSON object ``{"step": int, "grades": {module name: nested list}}`` a line). This module reads
those snapshots (or a list of them, or a CSV), turns them into one (steps, grades) series per
module and plots one line per grade.

CSV format (long, one row per grade): columns ``step``, ``module``, ``index`` and ``grade``
(``index`` counts the module's grades in row-major order, so per-head grades (H, D) have
indices 0..H·D−1).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from graded._io import read_jsonl
from graded.analysis._common import pyplot, save_figure
from graded.checks import check_int

__all__ = ["GradeTrajectory", "grade_trajectories", "load_grade_records",
           "plot_grade_trajectories"]

Records = Sequence[Mapping[str, Any]]
CSV_COLUMNS = ("step", "module", "index", "grade")


@dataclass
class GradeTrajectory:
    """``steps`` (S,) and ``grades`` (S, n): the module's n grades at each recorded step."""

    steps: Tensor
    grades: Tensor


def _flatten(values: Any) -> list[float]:
    if isinstance(values, (list, tuple)):
        return [x for v in values for x in _flatten(v)]
    return [float(values)]


def _grades_of(record: Mapping[str, Any], name: str) -> list[float]:
    """Module ``name``'s grades in a snapshot, flattened; an error names the module and step."""
    try:
        return _flatten(record["grades"][name])
    except (TypeError, ValueError):
        raise ValueError(f"module {name!r} at step {record['step']}: grades must be a number or "
                         f"a nested list of numbers, got {record['grades'][name]!r}") from None


def _records_from_csv(path: Path) -> list[dict[str, Any]]:
    by_step: dict[int, dict[str, dict[int, float]]] = {}
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path} lacks the column(s) {missing}; a grade CSV has columns "
                             f"{list(CSV_COLUMNS)}")
        for row in reader:
            try:
                step, index, grade = int(row["step"]), int(row["index"]), float(row["grade"])
            except (TypeError, ValueError):
                raise ValueError(
                    f"{path}:{reader.line_num}: expected an int step, an int index and a number "
                    f"grade, got step={row['step']!r}, index={row['index']!r}, "
                    f"grade={row['grade']!r}") from None
            grades = by_step.setdefault(step, {}).setdefault(row["module"], {})
            if index in grades:
                raise ValueError(f"{path}:{reader.line_num}: a second grade for step={step}, "
                                 f"module={row['module']!r}, index={index}")
            grades[index] = grade
    for step, mods in by_step.items():  # a module's indices count its grades: 0..n-1
        for module, grades in mods.items():
            if sorted(grades) != list(range(len(grades))):
                raise ValueError(
                    f"{path}: module {module!r} at step {step} has grade indices "
                    f"{sorted(grades)}; expected 0..{len(grades) - 1} (one row per grade)")
    return [{"step": step, "grades": {m: [v[i] for i in range(len(v))] for m, v in mods.items()}}
            for step, mods in sorted(by_step.items())]


def load_grade_records(source: str | Path | Records) -> list[dict[str, Any]]:
    """Grade snapshots from a run folder (its ``grades.jsonl``), a ``.jsonl`` file, a ``.csv``
    file (columns step, module, index, grade) or an in-memory list of snapshots."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            path = path / "grades.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"no grade records at {path}")
        if path.suffix == ".csv":
            return _records_from_csv(path)
        return read_jsonl(path, "a JSON grade snapshot {'step': int, 'grades': {module: list}}")
    for r in source:
        if not isinstance(r, Mapping):
            raise ValueError(f"a grade snapshot is {{'step': int, 'grades': {{module: list}}}}, "
                             f"got {r!r}")
    return [dict(r) for r in source]


def grade_trajectories(source: str | Path | Records) -> dict[str, GradeTrajectory]:
    """One :class:`GradeTrajectory` per grading module of any snapshot (a module missing from
    some snapshots has the steps of those that hold it), steps in increasing order."""
    records = load_grade_records(source)
    if not records:
        raise ValueError("no grade snapshots to plot: the source is empty")
    for r in records:
        step = r.get("step")
        if (not isinstance(step, int) or isinstance(step, bool)
                or not isinstance(r.get("grades"), Mapping)):
            raise ValueError(f"a grade snapshot is {{'step': int, 'grades': {{module: list}}}},"
                             f" got {r!r}")
    records = sorted(records, key=lambda r: r["step"])
    # every module of any snapshot, in order of first appearance
    names = dict.fromkeys(name for r in records for name in r["grades"])
    out: dict[str, GradeTrajectory] = {}
    for name in names:
        rows = [(r["step"], _grades_of(r, name)) for r in records if name in r["grades"]]
        width = len(rows[0][1])
        other = next(((s, v) for s, v in rows if len(v) != width), None)
        if other is not None:
            raise ValueError(f"module {name!r} changes its number of grades between snapshots: "
                             f"{width} at step {rows[0][0]}, {len(other[1])} at step {other[0]}")
        out[name] = GradeTrajectory(
            steps=torch.tensor([s for s, _ in rows], dtype=torch.long),
            grades=torch.tensor([v for _, v in rows], dtype=torch.float64),
        )
    return out


def plot_grade_trajectories(
    source: str | Path | Records | Mapping[str, GradeTrajectory], out_dir: str | Path, *,
    filename: str = "grade_trajectories.png", max_modules: int = 8, title: str = "",
) -> Path:
    """One panel per grading module (the first ``max_modules``), one line per grade against
    the step. Returns the PNG path."""
    max_modules = check_int("max_modules", max_modules, minimum=1)
    if isinstance(source, Mapping) and all(isinstance(v, GradeTrajectory)
                                           for v in source.values()):
        traj = dict(source)
    else:
        traj = grade_trajectories(source)
    if not traj:
        raise ValueError("no grade trajectories to plot")
    names = list(traj)[:max_modules]
    plt = pyplot()
    cols = min(2, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        t = traj[name]
        for i in range(t.grades.shape[1]):
            ax.plot(t.steps.numpy(), t.grades[:, i].numpy(), lw=0.9,
                    marker="." if len(t.steps) < 3 else None)
        ax.set_title(name, fontsize=7)
        ax.set_xlabel("step", fontsize=7)
        ax.set_ylabel("grade", fontsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(title or "grade trajectories (one line per grade)", fontsize=9)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.12, top=0.86, wspace=0.3, hspace=0.6)
    return save_figure(fig, out_dir, filename)
