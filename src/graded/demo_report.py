"""The report of ``graded demo``: tables, verdicts, budget and plots in ``report.md``.

:func:`write_demo_report` writes, per task, a table of every metric per model (mean ± sample
std over the seeds, :func:`_fmt`) beside the simple baselines, the learning curves and the
grade trajectories; :func:`_verdict` says in plain sentences which model won and whether LGT or
EGT differs from the ungraded transformer by more than two standard errors, and
:func:`_summary` counts those comparisons in one sentence.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from graded._io import atomic_write_text
from graded.demo_runs import MODELS, TASKS
from graded.train.report import mean_std

__all__ = ["write_demo_report"]


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
    from graded.train.options import monitor_mode_of

    finite = {m: [v for v in vals if v is not None and math.isfinite(v)]
              for m, vals in by_model.items()}
    means = {m: mean_std(v) for m, v in finite.items() if v}
    if not means:
        return [f"- **{task}**: no model finished with a finite {metric}."]
    mode = monitor_mode_of(metric)  # loss and perplexity too: a lower one is better
    if mode is None:
        raise ValueError(f"the demo's headline metric {metric!r} is not an evaluation metric; "
                         "expected loss, perplexity or one of graded.evaluation.METRICS")
    sign = 1.0 if mode == "max" else -1.0
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
