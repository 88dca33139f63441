"""E2: robustness of graded models (claims 3, 6 (the model-level bound), 000-R).

Models: the E1 arms ``none``, ``fixed_aligned``, ``twin`` and ``egt`` (000 Alg 7.1) trained
by :func:`graded.study.learning.fit` on the structured polynomial task (``poly_e5``, feature
grades = monomial degree 0..3) at n = ``N_TRAIN`` with E1's budget, one model per seed and arm,
the same seeds for every arm. E2 trains its own models (E1 keeps only figures), with the same
code and seeds as E1's runs at that n.

Measurements, per seed:

- **noise on low- vs high-grade features** (000-R, 000 Props 5.12, 6.13): Gaussian noise of
  standard deviation ``SIGMA`` (targets and features are standardised) on the low-grade
  features (degrees 0, 1) or the high-grade ones (2, 3) of the test inputs; the RMS change of
  the output. Estimate: log(change of the graded model / change of the ungraded model) under
  low-grade noise, paired by seed (:func:`log_change_ratio`); 000's claim predicts it
  negative. A model whose output does not change at all (RMS change exactly 0, e.g. one that
  ignores those features) gives a log ratio of −∞ (graded unchanged), +∞ (ungraded unchanged)
  or none (both): no value a mean can take, so that seed is left out of the interval and
  counted, with its direction, in the finding's detail.
- **size split** (000-R): models trained on 4–6 polynomials per example and tested on 7–8;
  estimate: the paired difference of test loss, graded (EGT) − ungraded; predicted negative.
- **Lipschitz estimates** (claims 3 and 6): :func:`graded.analysis.model_lipschitz` of each
  graded model (the constant of the output with respect to its input X, here the raw features
  that the input grading acts on before the projection (001 Def 3.1, 000 Def 5.19); random and
  adversarial directions) against its ungraded twin (same weights, M = I). 001 Prop 3.7 bounds
  the ratio by λ^{q_max} (claim 3), 000 Props 5.12/6.13 by s^{Nh+3} (claim 6) for every
  model; estimate: the largest log(ratio / factor) over the models (:func:`bound_finding`):
  holds when every value is ≤ 0, inconclusive otherwise — both are comparisons of lower bounds
  on the constants (see :mod:`graded.analysis.lipschitz`), so an estimate above the bound is
  not proof of a violation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from graded.analysis.lipschitz import model_lipschitz
from graded.study.core import Context, Finding, atomic_write_text, verdict
from graded.study.experiments._e_common import t_test_note
from graded.study.experiments.e1_sample_efficiency import budget as e1_budget
from graded.study.learning import TASKS, TaskData, fit, make_data
from graded.study.statistics import mean_interval
from graded.tasks.polynomial_regression import PolynomialRegression

__all__ = ["RobustnessExperiment", "bound_finding", "log_change_ratio", "log_excess",
           "output_change", "size_split_data"]

ARMS = ("none", "fixed_aligned", "twin", "egt")
GRADED = ("fixed_aligned", "egt")
SIGMA = 0.3
N_TRAIN = 800
LR = 3e-3


def bound_finding(claim: str, quantity: str, control: str, log_excess: list[float],
                  detail: str, figures: list[str]) -> Finding:
    """A bound checked on every model: ``log_excess`` holds log(ratio / bound factor) per model.

    The estimate is the largest value (no interval: a bound is a statement about every
    instance, not about their mean). Rule, stated in ``docs/study.md``: **holds** when every
    value is ≤ 0. The ratios are ratios of two lower-bound estimates (random and adversarial
    directions, :mod:`graded.analysis.lipschitz`), so a value above 0 may come from an
    underestimated ungraded constant as well as from a violated bound: it makes the claim
    **inconclusive**, not failed. An infinite value (a ratio over an ungraded constant of
    0) lies above the bound like any other; a NaN one (a model not measured) is left out of the
    values, and the bound, then not checked on every model, is **inconclusive** too."""
    values = [v for v in log_excess if not math.isnan(v)]
    unmeasured = len(log_excess) - len(values)
    if not values or not any(math.isfinite(v) for v in values):
        return Finding(claim, "E2", quantity, control, 0, math.nan, math.nan, math.nan,
                       "inconclusive", detail + " No finite value.", list(figures))
    worst = max(values)
    above = sum(v > 0 for v in values)
    verdict_ = "holds" if above == 0 and not unmeasured else "inconclusive"
    missing = (f" {unmeasured} model(s) not measured (NaN), so the bound is not checked on "
               "every model." if unmeasured else "")
    detail = (f"{detail} Values {[round(v, 4) for v in values]}; mean {np.mean(values):+.4f}; "
              f"{above}/{len(values)} above 0 (estimate above the bound).{missing} Rule: holds "
              "if every value is ≤ 0; a value above 0 makes it inconclusive (both constants are "
              "lower-bound estimates).")
    return Finding(claim, "E2", quantity, control, len(values), worst, worst, worst, verdict_,
                   detail, list(figures))


def log_excess(ratio: float, factor: float) -> float:
    """log(ratio / factor) of a Lipschitz ratio ≥ 0 over a bound factor > 0: −∞ for a ratio of 0
    or an infinite factor (a finite ratio lies within it), +∞ for an infinite ratio under a
    finite factor, NaN where either is NaN or both are infinite (not measured)."""
    if math.isnan(ratio) or math.isnan(factor) or (math.isinf(ratio) and math.isinf(factor)):
        return math.nan
    if ratio == 0 or math.isinf(factor):
        return -math.inf
    return math.inf if math.isinf(ratio) else math.log(ratio / factor)


def log_change_ratio(graded: float, ungraded: float) -> float:
    """log(graded / ungraded) of two output changes ≥ 0, with the zero changes spelled out:
    −∞ when only the graded output is unchanged (0), +∞ when only the ungraded one is, NaN when
    both are (0/0) or either is NaN."""
    if math.isnan(graded) or math.isnan(ungraded):
        return math.nan
    if graded < 0 or ungraded < 0:
        raise ValueError(f"output changes are RMS values >= 0, got graded={graded!r}, "
                         f"ungraded={ungraded!r}")
    if graded == 0 or ungraded == 0:
        return math.nan if graded == ungraded else (-math.inf if graded == 0 else math.inf)
    return math.log(graded / ungraded)


def _left_out_note(log_ratios: list[float]) -> str:
    """The detail's sentence on the seeds whose :func:`log_change_ratio` no mean can take (empty
    when there are none)."""
    left = {"−∞ (graded output unchanged)": sum(v == -math.inf for v in log_ratios),
            "+∞ (control output unchanged)": sum(v == math.inf for v in log_ratios),
            "undefined (both unchanged, or not measured)": sum(math.isnan(v)
                                                               for v in log_ratios)}
    if not any(left.values()):
        return ""
    return (f" Left out of the interval: {sum(left.values())} of {len(log_ratios)} seeds whose "
            "log ratio is " + ", ".join(f"{k}: {n}" for k, n in left.items() if n) + ".")


def output_change(model: torch.nn.Module, data: dict[str, torch.Tensor], columns: list[int],
                  sigma: float, seed: int) -> float:
    """RMS change of the model's output when N(0, σ²) noise is added to the feature
    ``columns`` of the (unpadded) inputs; the noise draw depends on ``seed`` only."""
    if not columns:
        raise ValueError("output_change needs at least one feature column")
    x, mask = data["inputs"], data.get("key_padding_mask")
    g = torch.Generator().manual_seed(seed)
    noise = torch.zeros_like(x)
    noise[..., columns] = sigma * torch.randn(x[..., columns].shape, generator=g)
    if mask is not None:
        noise = noise.masked_fill(mask[..., None], 0.0)
    with torch.no_grad():
        args = (mask,) if mask is not None else ()
        clean, noisy = model(x, *args), model(x + noise, *args)
    return float((noisy - clean).square().mean().sqrt())


def size_split_data(n_eval: int, pool: int = 3200) -> TaskData:
    """poly_e5 with training and validation examples of 4–6 polynomials and test examples of
    7–8 (:meth:`PolynomialRegression.size_configs`), standardised by the training pool."""
    short, long = PolynomialRegression(emphasis=5.0).size_configs()
    keep = ("inputs", "targets", "key_padding_mask")

    def gen(task: PolynomialRegression, n: int, seed: int) -> dict[str, torch.Tensor]:
        d = {k: v for k, v in task.generate(n, seed=seed).tensors.items() if k in keep}
        width = long.max_polys  # pad every set to the longest length
        if d["inputs"].shape[1] < width:
            extra = width - d["inputs"].shape[1]
            d["inputs"] = torch.nn.functional.pad(d["inputs"], (0, 0, 0, extra))
            d["key_padding_mask"] = torch.nn.functional.pad(d["key_padding_mask"], (0, extra),
                                                            value=True)
        return d

    sets = [gen(short, pool, 1), gen(short, n_eval, 2), gen(long, n_eval, 3)]
    y = sets[0]["targets"]
    mean, std = y.mean(), y.std().clamp(min=1e-8)
    for d in sets:
        d["targets"] = (d["targets"] - mean) / std
    spec = dataclasses.replace(TASKS["poly_e5"], name="poly_e5_size_split",
                               description="polynomial regression, train 4–6, test 7–8 terms")
    return TaskData(spec, *sets, grades=[float(k) for k in range(4)],
                    importance=short.degree_weights.tolist(), input_dim=4,
                    max_len=long.max_polys)


class RobustnessExperiment:
    """E2: noise on high/low-grade features, size split, Lipschitz against the twin."""

    name = "E2"
    title = "Robustness: feature noise by grade, size split, Lipschitz against the ungraded twin"
    claims = ("3", "6", "000-R")

    def run(self, ctx: Context) -> list[Finding]:
        torch.set_num_threads(1)
        b = e1_budget(ctx.quick, ctx.seeds if ctx.seeds_given else None)
        seeds = [ctx.base_seed + s for s in range(ctx.seeds)]
        n_train = 400 if ctx.quick else N_TRAIN
        data = make_data(TASKS["poly_e5"], n_eval=b["n_eval"])
        split = size_split_data(b["n_eval"])
        low = [i for i, q in enumerate(data.grades) if q < 2]
        high = [i for i, q in enumerate(data.grades) if q >= 2]
        rows: list[dict[str, Any]] = []
        for seed in seeds:
            for arm in ARMS:
                model, res = fit(data, arm, n=n_train, seed=seed, lr=LR, steps=b["steps"])
                row = {"seed": seed, "arm": arm, "test": res["test"],
                       "low": output_change(model, data.test, low, SIGMA, 50_000 + seed),
                       "high": output_change(model, data.test, high, SIGMA, 50_000 + seed)}
                if arm in GRADED:
                    inputs = (data.test["inputs"][:64], data.test["key_padding_mask"][:64])
                    lip = model_lipschitz(model, inputs, n_random=4 if ctx.quick else 8,
                                          steps=5 if ctx.quick else 10, seed=seed)
                    row.update(lipschitz_ratio=lip["ratio"], factor_3_7=lip["prop_3_7_factor"],
                               factor_5_12=lip["prop_5_12_factor"],
                               graded_estimate=lip["graded/estimate"],
                               ungraded_estimate=lip["ungraded/estimate"])
                if arm in ("none", "egt"):
                    _, r2 = fit(split, arm, n=n_train, seed=seed, lr=LR, steps=b["steps"])
                    row["size_split_test"] = r2["test"]
                rows.append(row)
        return self._findings(ctx, rows, seeds, n_train, b)

    def _findings(self, ctx: Context, rows: list[dict[str, Any]], seeds: list[int],
                  n_train: int, b: dict[str, Any]) -> list[Finding]:
        by = {(r["seed"], r["arm"]): r for r in rows}
        fig = self._plot(ctx, rows)
        findings = []

        def add(claim: str, quantity: str, control: str, values: list[float], predicted: str,
                detail: str) -> None:
            values = [v for v in values if math.isfinite(v)]
            if not values:
                findings.append(Finding(claim, self.name, quantity, control, 0, math.nan,
                                        math.nan, math.nan, "inconclusive",
                                        detail + " No finite value.", [fig]))
                return
            iv = mean_interval(values)
            findings.append(Finding(claim, self.name, quantity, control, len(values),
                                    iv.estimate, iv.low, iv.high,
                                    verdict(iv.low, iv.high, predicted=predicted),
                                    f"{detail} {t_test_note(values)} {iv.note()}", [fig]))

        def change_ratios(arm: str, control: str) -> tuple[list[float], str]:
            values = [log_change_ratio(by[(s, arm)]["low"], by[(s, control)]["low"])
                      for s in seeds]
            return values, _left_out_note(values)

        setting = (f"poly_e5, n = {n_train}, {b['steps']} AdamW steps (lr {LR}), noise σ = "
                   f"{SIGMA} on standardised features of degrees 0–1 (low grade) or 2–3 (high)")
        values, note = change_ratios("egt", "none")
        add("000-R", "log(output change EGT / output change ungraded), low-grade noise",
            "ungraded model trained on the same data and seed", values,
            "negative", setting + ". Negative = the graded model is less sensitive." + note)
        values, note = change_ratios("fixed_aligned", "none")
        add("000-R", "log(output change fixed-aligned / ungraded), low-grade noise",
            "ungraded model, same data and seed", values, "negative", setting + "." + note)
        values, note = change_ratios("fixed_aligned", "twin")
        add("000-R", "log(output change fixed-aligned / twin), low-grade noise",
            "preconditioning twin (same function at initialisation)", values,
            "negative", setting + "; separates the grading from its initial scale." + note)
        add("000-R", "paired Δ test loss on longer inputs (size split), EGT − ungraded",
            "ungraded model, same seed", [by[(s, "egt")]["size_split_test"]
                                          - by[(s, "none")]["size_split_test"] for s in seeds],
            "negative", "Trained on 4–6 polynomials per example, tested on 7–8.")
        ratios = [(r["lipschitz_ratio"], r["factor_3_7"], r["factor_5_12"]) for r in rows
                  if "lipschitz_ratio" in r]
        findings.append(bound_finding(
            "3", "largest log(Lipschitz ratio graded/ungraded twin ÷ λ^{q_max}) over models",
            "the ungraded twin (same weights, M = I)",
            [log_excess(r, f) for r, f, _ in ratios],
            "Fixed-aligned and EGT models of every seed (two models per seed); the bound of "
            "001 Prop 3.7 must hold for every model.", [fig]))
        findings.append(bound_finding(
            "6", "largest log(Lipschitz ratio graded/ungraded twin ÷ s^{Nh+3}) over models",
            "the ungraded twin", [log_excess(r, f) for r, _, f in ratios],
            "The model-level bound of 000 Props 5.12 / 6.13 (the layer Jacobians are E6); it "
            "must hold for every model.", [fig]))
        lines = ["| seed | arm | test loss | output change, low-grade noise | high-grade noise "
                 "| Lipschitz ratio | λ^{q_max} | size-split test loss |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            cell = {k: (f"{r[k]:.{d}f}" if k in r else "–") for k, d in (
                ("lipschitz_ratio", 3), ("factor_3_7", 2), ("size_split_test", 4))}
            lines.append(f"| {r['seed']} | {r['arm']} | {r['test']:.4f} | {r['low']:.4f} | "
                         f"{r['high']:.4f} | {cell['lipschitz_ratio']} | {cell['factor_3_7']} | "
                         f"{cell['size_split_test']} |")
        atomic_write_text(ctx.path("section.md"), "\n".join(lines) + f"\n\n![{fig}]({fig})\n")
        return findings

    @staticmethod
    def _plot(ctx: Context, rows: list[dict[str, Any]]) -> str:
        from graded.plotting import pyplot, save_figure

        plt = pyplot()
        fig, ax = plt.subplots(figsize=(5.0, 3.4))
        x = np.arange(len(ARMS))
        for k, (key, label) in enumerate((("low", "noise on degrees 0–1"),
                                          ("high", "noise on degrees 2–3"))):
            means = [np.mean([r[key] for r in rows if r["arm"] == a]) for a in ARMS]
            ax.bar(x + (k - 0.5) * 0.38, means, width=0.38, label=label)
        ax.set_xticks(x, ARMS)
        ax.set_ylabel(f"RMS output change (σ = {SIGMA})")
        ax.set_title("E2: output change under feature noise, poly_e5", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        save_figure(fig, ctx.path("e2_noise.png"), dpi=80)
        return "e2_noise.png"
