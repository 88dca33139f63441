"""The study's report: ``report.md`` (rule and predictions before the numbers, one row per
claim, then every finding and each experiment's section) and ``results.json``.

The summary row of a claim is its *primary* finding: the first finding for that claim of the
experiment named in :data:`PRIMARY`, else of the first experiment (in registry order) that
measured it; every other finding is listed in the
experiment sections. A claim that no experiment of the folder measured gets a row saying so.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graded.study.core import CLAIMS, RULE, Finding, atomic_write_text

if TYPE_CHECKING:
    from graded.study.runner import StudyRun

__all__ = ["PRIMARY", "claim_rows", "default_seeds_note", "write_report"]

# Claims measured by several experiments whose summary row belongs to a later one: the layer
# Jacobian bounds (6) and the grade-gradient scaling (7) are E6's subject; E2 (the model-level
# bound) and E1 (convergence) add secondary rows.
PRIMARY = {"6": "E6", "7": "E6"}


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def default_seeds_note(quick: bool) -> str:
    """How many replicates each experiment takes in the mode when ``--seeds`` is not given:
    the ``default_seeds = (quick, full)`` of every experiment that declares them (grouped by
    count, in registry order) and E1's seeds per training size from its budget."""
    from graded.study.experiments import e1_sample_efficiency as e1
    from graded.study.experiments import registry

    by_count: dict[int, list[str]] = {}
    for name, experiment in registry().items():
        declared = getattr(experiment, "default_seeds", None)
        if declared is not None:
            by_count.setdefault(declared[0 if quick else 1], []).append(name)
    parts = [f"{_names(names)} {'takes' if len(names) == 1 else 'take'} {count}"
             for count, names in by_count.items()]
    b = e1.budget(quick)
    small, large = b["small_seeds"], b["large_seeds"]
    if small == large:
        parts.append(f"E1 takes {small} at every training size")
    else:
        upto = max(n for n in b["sizes"] if e1.seeds_at(b, n) == small)
        parts.append(f"E1 takes {small} at n ≤ {upto} and {large} above")
    return f" (default of the mode: {'; '.join(parts)})"


def _num(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
        return f"{x:.3g}"
    return f"{x:.4f}"


def _interval(f: Finding) -> str:
    if not math.isfinite(f.estimate):
        return "–"
    return f"{_num(f.estimate)} [{_num(f.low)}, {_num(f.high)}]"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def claim_rows(findings: dict[str, list[Finding]], errors: dict[str, str],
               experiments_of: dict[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    """One row per claim of :data:`CLAIMS`, in its order: the primary finding's fields, or
    ``verdict = "not measured"`` with the reason."""
    rows = []
    for cid, claim in CLAIMS.items():
        names = sorted(findings, key=lambda n: n != PRIMARY.get(cid))  # stable: owner first
        primary = next((f for name in names for f in findings[name] if f.claim == cid), None)
        row: dict[str, Any] = {"claim": cid, "source": claim.source,
                               "statement": claim.statement, "prediction": claim.prediction}
        if primary is not None:
            row.update(primary.as_dict())
            row["findings"] = sum(f.claim == cid for fs in findings.values() for f in fs)
        else:
            failed = [n for n, cl in experiments_of.items() if cid in cl and n in errors]
            row.update(experiment="–", quantity="–", control="–", seeds=0,
                       estimate=math.nan, low=math.nan, high=math.nan,
                       verdict="not measured", findings=0,
                       detail=(f"experiment {', '.join(failed)} failed in this run" if failed
                               else "no experiment of this study run measured it"))
        rows.append(row)
    return rows


def _rewrite_figures(text: str, folder: str) -> str:
    """Links to an experiment's own files (``](x.png)``) made relative to the study folder."""
    return re.sub(r"\]\(([^)/:]+)\)", lambda m: f"]({folder}/{m.group(1)})", text)


def write_report(study: StudyRun, *, machine: dict[str, Any]) -> Path:
    """Write ``report.md`` and ``results.json`` for ``study``; returns the report's path."""
    from graded.study.experiments import registry
    from graded.study.storage import experiment_dir, slug

    every = registry()
    experiments_of = {n: tuple(e.claims) for n, e in every.items()}
    order = [n for n in every if n in study.findings or n in study.errors]
    findings = {n: study.findings[n] for n in order if n in study.findings}
    rows = claim_rows(findings, study.errors, experiments_of)
    counts = {v: sum(r["verdict"] == v for r in rows)
              for v in ("holds", "fails", "inconclusive", "not measured")}

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    mode = ("quick mode: tiny budgets, a smoke test, not evidence" if study.quick
            else "full study")
    lines = ["# The claims study", "",
             f"Produced by `{study.command}` on {when} ({mode}). "
             f"Wall time {study.total_wall:.0f} s with {study.workers} worker process(es) on "
             f"{machine['cpus']} CPU(s) ({machine['processor']}, {machine['platform']}), Python "
             f"{machine['python']}, torch {machine['torch']}. Seeds: {study.seeds}"
             f"{' (given)' if study.seeds_given else default_seeds_note(study.quick)}, first seed "
             f"{study.base_seed}.", "",
             "## The verdict rule", "", RULE, "",
             "## Predictions (stated before the numbers)", "",
             "| claim | source | statement | prediction |", "|---|---|---|---|"]
    for cid, c in CLAIMS.items():
        lines.append(f"| {cid} | {_cell(c.source)} | {_cell(c.statement)} | "
                     f"{_cell(c.prediction)} |")
    lines += ["", "## Summary: one row per claim", "",
              f"{counts['holds']} hold, {counts['fails']} fail, {counts['inconclusive']} "
              f"inconclusive, {counts['not measured']} not measured (of {len(rows)}).", "",
              "| claim | source | experiment | quantity | control | seeds | estimate [95% "
              "interval] | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        est = ("–" if r["verdict"] == "not measured"
               else _interval(Finding.from_dict({k: r[k] for k in Finding.__dataclass_fields__})))
        verdict = r["verdict"] if r["verdict"] != "not measured" else f"not measured: {r['detail']}"
        lines.append(f"| {r['claim']} | {_cell(r['source'])} | {r['experiment']} | "
                     f"{_cell(r['quantity'])} | {_cell(r['control'])} | {r['seeds']} | {est} | "
                     f"**{verdict}** |")
    lines += ["", "## Experiments", ""]
    for name in order:
        exp = every[name]
        folder = slug(name)
        reused = " (stored result of an earlier call)" if study.reused.get(name) else ""
        jobs = (f"; {study.job_seconds[name]:.0f} s of training jobs in all, over every "
                "call that added to this folder" if name in study.job_seconds else "")
        lines += [f"### {name}: {exp.title}", "",
                  f"Claims {', '.join(exp.claims)}; wall time "
                  f"{study.wall.get(name, 0.0):.0f} s{reused}{jobs}.", ""]
        if name in study.errors:
            last = study.errors[name].strip().splitlines()[-1]
            lines += [f"**Failed**: `{_cell(last)}` (traceback in the command's output).", ""]
            continue
        lines += ["| claim | quantity | control | seeds | estimate [95% interval] | verdict |"
                  " detail |", "|---|---|---|---|---|---|---|"]
        figures: list[str] = []
        for f in findings[name]:
            lines.append(f"| {f.claim} | {_cell(f.quantity)} | {_cell(f.control)} | {f.seeds} | "
                         f"{_interval(f)} | **{f.verdict}** | {_cell(f.detail)} |")
            figures += [g for g in f.figures if g not in figures]
        lines.append("")
        section = experiment_dir(study.out, name) / "section.md"
        if section.exists():
            text = section.read_text(encoding="utf-8")
            lines += [_rewrite_figures(text, folder), ""]
            figures = [g for g in figures if f"]({g})" not in text]
        lines += [f"![{g}]({folder}/{g})" for g in figures if (study.out / folder / g).exists()]
        lines.append("")
    report = Path(study.out) / "report.md"
    atomic_write_text(report, "\n".join(lines) + "\n")
    from graded.study.storage import _json_safe

    results = {"command": study.command, "settings": study.settings(), "machine": machine,
               "wall_s": study.total_wall, "rule": RULE, "claims": rows,
               "findings": [f.as_dict() for n in order if n in findings for f in findings[n]],
               "experiments": {n: {"wall_s": study.wall.get(n), "reused": study.reused.get(n),
                                   "job_seconds": study.job_seconds.get(n),
                                   "error": study.errors.get(n)} for n in order}}
    atomic_write_text(Path(study.out) / "results.json",
                      json.dumps(_json_safe(results), indent=1, ensure_ascii=False))
    return report
