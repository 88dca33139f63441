"""What a run writes to its folder: metrics as CSV and TensorBoard, grade trajectories, summary.

Files in the run folder (rank 0 only):

- ``metrics.csv``  long format ``step,split,name,value`` (one row per scalar; pivot for plots);
- ``tensorboard/`` event files from :class:`torch.utils.tensorboard.SummaryWriter`;
- ``grades.jsonl`` one JSON line per logging step: the grades of every grading module
  (000 §5.4: grade trajectories are how a user sees what learnable grades did);
- ``metrics.json`` the final figures, written by the trainer at the end.

On resume the logger drops rows past the resume step, so the files read as one clean run, and
TensorBoard hides the events past it (a purge marker, written whether the resumed run logs to
TensorBoard or not). A new run in a folder that holds an earlier run's files (one that ended
before its first checkpoint) starts them afresh, and hides every earlier TensorBoard event.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import torch

from graded._io import read_jsonl
from graded.train.checkpoint import atomic_write_text

CSV_FIELDS = ("step", "split", "name", "value")


def grading_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Every submodule that carries grades (``.grades`` tensor and a ``.scales()`` method)."""
    found = {}
    for name, module in model.named_modules():
        grades = getattr(module, "grades", None)
        if isinstance(grades, torch.Tensor) and callable(getattr(module, "scales", None)):
            found[name or "<root>"] = module
    return found


def collect_grades(model: torch.nn.Module,
                   modules: Mapping[str, torch.nn.Module] | None = None) -> dict[str, list]:
    """The current grades of every grading module, as nested lists keyed by module name
    (``modules``: :func:`grading_modules` of ``model``, when the caller keeps them)."""
    if modules is None:
        modules = grading_modules(model)
    return {name: module.grades.detach().float().cpu().tolist()
            for name, module in modules.items()}


def _truncate_csv(path: Path, after_step: int) -> None:
    """Keep the rows up to ``after_step``, rewritten atomically (a Ctrl-C or crash during the
    rewrite leaves the old file, not a truncated history); a row cut short by a writer that
    died mid-line (a full disk, a kill) is not a row and is dropped."""
    import io

    with path.open(newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if _csv_row_step(r) is not None
                and _csv_row_step(r) <= after_step]
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, out.getvalue())


def _csv_row_step(row: Mapping[str, Any]) -> int | None:
    """The step of a whole ``metrics.csv`` row; None for a row cut short."""
    if row.get(None) or any(row.get(k) in (None, "") for k in CSV_FIELDS):
        return None
    try:
        float(row["value"])
        return int(row["step"])
    except ValueError:
        return None


def _truncate_jsonl(path: Path, after_step: int) -> None:
    """Keep the lines up to ``after_step``, rewritten atomically; a line cut short by a
    writer that died mid-line is dropped."""
    kept = []
    for ln in path.read_text(encoding="utf-8").splitlines():
        try:
            step = json.loads(ln)["step"] if ln.strip() else None
        except (ValueError, KeyError, TypeError):
            step = None
        if isinstance(step, int) and step <= after_step:
            kept.append(ln)
    atomic_write_text(path, "".join(ln + "\n" for ln in kept))


class RunLogger:
    """Scalars to CSV and TensorBoard, grades to JSONL; a no-op when ``enabled`` is False."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._tb = None
        self._grades_fh: TextIO | None = None  # opened at the first grades written
        # the model of the last grades() call and its grading modules, found once: the
        # modules of a model in training do not change, and walking them costs more than
        # reading their grades
        self._grading: tuple[torch.nn.Module, dict[str, torch.nn.Module]] | None = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.run_dir / "metrics.csv"
        self.grades_path = self.run_dir / "grades.jsonl"
        if resume_step is not None:
            if self.csv_path.exists():
                _truncate_csv(self.csv_path, resume_step)
            if self.grades_path.exists():
                _truncate_jsonl(self.grades_path, resume_step)
        else:
            for p in (self.csv_path, self.grades_path):
                p.unlink(missing_ok=True)
        new = not self.csv_path.exists()
        self._csv_fh = self.csv_path.open("a", newline="", encoding="utf-8")
        self._csv = csv.DictWriter(self._csv_fh, fieldnames=CSV_FIELDS)
        if new:
            self._csv.writeheader()
        events = self.run_dir / "tensorboard"
        if tensorboard or events.is_dir():
            from torch.utils.tensorboard import SummaryWriter

            # a writer opened with purge_step first writes the marker that hides the events of
            # steps >= purge_step: those of the future a resume abandons, or every event of an
            # earlier run that a new run in this folder replaces (as it replaces metrics.csv);
            # without TensorBoard now, that marker is all it writes
            purge = None
            if events.is_dir():
                purge = 0 if resume_step is None else resume_step + 1
            writer = SummaryWriter(str(events), purge_step=purge)
            if tensorboard:
                self._tb = writer
            else:
                writer.close()

    def scalars(self, step: int, split: str, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        for name, value in values.items():
            value = float(value)
            self._csv.writerow({"step": step, "split": split, "name": name, "value": repr(value)})
            if self._tb is not None and math.isfinite(value):
                self._tb.add_scalar(f"{split}/{name}", value, step)
        self._csv_fh.flush()

    def grades(self, step: int, model: torch.nn.Module) -> None:
        if not self.enabled:
            return
        if self._grading is None or self._grading[0] is not model:
            self._grading = (model, grading_modules(model))
        grades = collect_grades(model, self._grading[1])
        if not grades:
            return
        if self._grades_fh is None:
            self._grades_fh = self.grades_path.open("a", encoding="utf-8")
        self._grades_fh.write(json.dumps({"step": step, "grades": grades}) + "\n")
        self._grades_fh.flush()
        if self._tb is not None:
            for name, values in grades.items():
                self._tb.add_histogram(f"grades/{name}", torch.tensor(values), step)

    def summary(self, values: dict[str, Any]) -> None:
        if self.enabled:
            atomic_write_text(self.run_dir / "metrics.json", json.dumps(values, indent=2))

    def close(self) -> None:
        if not self.enabled:
            return
        self._csv_fh.close()
        if self._grades_fh is not None:
            self._grades_fh.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str | Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``metrics.csv`` as ``{split: {name: [(step, value), ...]}}`` (for reports and tests); a
    row cut short by a writer that died mid-line is not a row (as on resume) and is skipped."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    with (Path(run_dir) / "metrics.csv").open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            step = _csv_row_step(row)
            if step is None:
                continue
            series = out.setdefault(row["split"], {}).setdefault(row["name"], [])
            series.append((step, float(row["value"])))
    return out


def read_grades(run_dir: str | Path) -> list[dict[str, Any]]:
    """``grades.jsonl`` as a list of ``{"step": int, "grades": {module: nested list}}``; a
    line that is not JSON (cut short by a killed writer) is a ValueError naming the file and
    the line, as :func:`graded.analysis.trajectories.load_grade_records` reads it."""
    path = Path(run_dir) / "grades.jsonl"
    if not path.exists():
        return []
    return read_jsonl(path, "a JSON grade snapshot {'step': int, 'grades': {module: list}}")
