"""E1's outputs: the learning-curve figures and the study section
(:mod:`graded.study.experiments.e1_sample_efficiency` computes what they show)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graded.plotting import pyplot, save_figure
from graded.study.core import Context, atomic_write_text
from graded.study.learning import TASKS, arms_for, supports_token_grading
from graded.study.statistics import mean_interval

__all__ = ["plot_curves", "write_section"]


def plot_curves(ctx: Context, b: dict[str, Any],
                curves: dict[tuple[str, str], dict[int, dict[int, float]]]) -> list[str]:
    """One learning-curve figure per task of ``b`` (mean test loss over seeds against n, every
    arm), saved in the study's folder; their file names."""
    plt = pyplot()
    names = []
    for task in b["tasks"]:
        fig, ax = plt.subplots(figsize=(6.0, 4.0))
        colours = plt.get_cmap("tab20").colors
        for k, arm in enumerate(arms_for(TASKS[task])):
            c = curves.get((task, arm), {})
            ns = [n for n in b["sizes"] if c.get(n)]
            if not ns:
                continue
            means = [float(np.mean(list(c[n].values()))) for n in ns]
            style = "-" if arm in ("none", "fixed_aligned", "egt", "lgt", "twin") else "--"
            ax.plot(ns, means, style, marker="o", ms=3, label=arm,
                    color=colours[(2 * k) % 20 + (2 * k) // 20])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("training examples n")
        ax.set_ylabel("test loss (mean over seeds)")
        ax.set_title(f"E1 {task}: {TASKS[task].description}", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        file = f"e1_{task}.png"
        save_figure(fig, ctx.path(file), dpi=80)
        names.append(file)
    return names


def write_section(ctx: Context, b: dict[str, Any],
                  curves: dict[tuple[str, str], dict[int, dict[int, float]]],
                  family: list[dict], figures: list[str], per_n: list[dict], *,
                  select_n: int, small_n: int) -> None:
    """E1's ``section.md``: the budget of the run (``b``; the lr chosen at n = ``select_n``),
    the AULC ``family`` and the per-n family ``per_n`` (n ≤ ``small_n``) as tables, each task's
    mean test loss by n with the smallest n that reaches the ungraded baseline's best, and the
    ``figures``."""
    lines = [f"Budget: tasks {', '.join(b['tasks'])}; n ∈ {b['sizes']}; seeds "
             f"{b['small_seeds']} at n ≤ 400 and {b['large_seeds']} above; lr grid "
             f"{b['lrs']} chosen per (task, arm) on validation at n = {select_n}; "
             f"{b['steps']} AdamW steps of batch 64 per run; validation and test sets of "
             f"{b['n_eval']}. Loss: MSE of standardised targets (≈ 1 − R²) or token "
             "cross-entropy (Dyck). Per-token arms: " + (
                 "run on Dyck." if supports_token_grading() else "not run: this version "
                 "of the transformer has no per-token grading (TransformerConfig."
                 "token_grading with TransformerLM.forward(..., token_grades=...))."), "",
             "### Paired AULC differences (arm − control; negative = the arm learns "
             "faster), Holm-corrected over this table", "",
             "| task | arm | control | seeds | ΔAULC | 95% interval | p | Holm reject |",
             "|---|---|---|---|---|---|---|---|"]
    for f in family:
        lines.append(f"| {f['task']} | {f['arm']} | {f['control']} | {len(f['diffs'])} | "
                     f"{f['est']:+.4f} | [{f['low']:+.4f}, {f['high']:+.4f}] | "
                     f"{f['p']:.3g} | {'yes' if f.get('holm') else 'no'} |")
    lines += ["", f"### Paired test-loss differences at n ≤ {small_n} (arm − control), "
              "Holm-corrected over this table", "",
              "| task | arm | control | n | seeds | Δ test loss | 95% interval | p | "
              "Holm reject |", "|---|---|---|---|---|---|---|---|---|"]
    for f in per_n:
        lines.append(f"| {f['task']} | {f['arm']} | {f['control']} | {f['n']} | "
                     f"{len(f['diffs'])} | {f['est']:+.4f} | [{f['low']:+.4f}, "
                     f"{f['high']:+.4f}] | {f['p']:.3g} | {'yes' if f['holm'] else 'no'} |")
    lines += ["", "### Mean test loss by n, and the smallest n reaching the ungraded "
              "baseline's best", ""]
    for task in b["tasks"]:
        base = curves.get((task, "none"), {})
        base_best = min((float(np.mean(list(v.values()))) for v in base.values() if v),
                        default=math.nan)
        lines += [f"**{task}** ({TASKS[task].description}); baseline best "
                  f"{base_best:.4f}", "",
                  "| arm | " + " | ".join(f"n={n}" for n in b["sizes"]) + " | reaches "
                  "baseline best at |", "|---|" + "---|" * (len(b["sizes"]) + 1)]
        for arm in arms_for(TASKS[task]):
            c = curves.get((task, arm), {})
            means = {n: float(np.mean(list(c[n].values()))) for n in b["sizes"] if c.get(n)}
            reach = next((n for n in b["sizes"] if n in means
                          and means[n] <= base_best * (1 + 1e-9)), None)
            cells = [f"{means[n]:.4f}" if n in means else "–" for n in b["sizes"]]
            lines.append(f"| {arm} | " + " | ".join(cells)
                         + f" | {reach if reach is not None else 'not reached'} |")
        lines.append("")
        # seeds where both runs have a finite test loss, as in per_size_family
        d = [(n, [c_a - c_n for s, c_a in curves.get((task, 'fixed_aligned'), {})
                  .get(n, {}).items() if (c_n := base.get(n, {}).get(s)) is not None
                  and math.isfinite(c_a) and math.isfinite(c_n)])
             for n in b["sizes"]]
        d = [(n, v) for n, v in d if v]
        if d:
            ivs = [(n, mean_interval(v), len(v)) for n, v in d]
            lines += ["Per-n paired difference, fixed aligned − none: " + "; ".join(
                f"n={n}: {iv.estimate:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}] ({k} seeds)"
                for n, iv, k in ivs), ""]
    lines += [f"![{f}]({f})" for f in figures]
    atomic_write_text(ctx.path("section.md"), "\n".join(lines) + "\n")
