"""E4/E5: positional bias against α (claim 4, 001 Prop 4.4) and head diversity with per-head
against shared grades (claim 5, 001 Prop 4.7).

**E4.** EGT language models (λ = 2, neutral feature grades, learned additive positions) are
trained on the lag-copy task with ungraded positions, then re-run with the graded positions
λ^{−α t}·Pe for α ∈ {0, 0.05, 0.1, 0.2, 0.3} and all other weights fixed
(:func:`graded.analysis.positional.positional_bias_sweep`). The measured quantity is the mean
attention mass of queries t ≥ k on the first k = T/4 keys; per (model, layer) instance the
least-squares slope of that mass against α. Instances are trained models and, as a second set,
the same architectures at initialisation. 001 Prop 4.4 predicts a positive slope. Fading the
positions also pushes attention towards uniform, which raises the early mass of a model that
attends to recent keys whatever the positions' order; so the control is the same model with every
position scaled by the constant RMS of λ^{−αt} over the sequence (same magnitude, no dependence
on t, :func:`matched_control_sweep`), and the estimate is the paired slope difference
graded − control.

**E5.** Pairs of models with identical weights except the attention grades: *shared*, one grade
tuple q_k = c̄·k for every head, against *per head*, q_{h,k} = c_h·k with c_h evenly spaced in
[0, 2c̄] (same mean). Both are trained on the same batches from the same initialisation; the
measured quantities are the effective rank of the concatenated head outputs and the mean
pairwise Jensen–Shannon divergence of the heads' attention maps
(:func:`graded.analysis.heads.head_diversity`), averaged over layers. 001 Prop 4.7 predicts a
richer span with distinct q_h: a positive paired difference per-head − shared.

Verdicts: :func:`graded.study.core.verdict` on the study's interval of the mean over seeds
(:func:`graded.study.statistics.mean_interval`: the hull of the percentile bootstrap and the t
interval; predicted positive); in E4 a seed's value is the mean of its (layer, trained/initial)
instances, which share the seed and are not independent.
"""

from __future__ import annotations

import numpy as np
import torch

from graded.analysis.capture import capture_attention
from graded.analysis.heads import head_diversity
from graded.analysis.positional import early_attention_mass, positional_bias_sweep
from graded.study.core import Context, Finding
from graded.study.experiments._e_common import (
    finding_from_values,
    lag_copy_batch,
    least_squares_slope,
    save_plot,
    seed_count,
    single_thread,
    tiny_lm,
    train_lm,
)
from graded.transformer.graded import head_gradings
from graded.transformer.models import InputEmbedding

__all__ = ["PositionsHeadsExperiment", "matched_control_sweep"]

ALPHAS = (0.0, 0.05, 0.1, 0.2, 0.3)
LENGTH = 16


def _eval_ids(seed: int) -> torch.Tensor:
    return lag_copy_batch(16, LENGTH, 16, 2, torch.Generator().manual_seed(20_000 + seed))[0]


class _ConstantFactor(torch.nn.Module):
    """Pe ↦ c·Pe at every position: the magnitude-matched control of λ^{−αt}·Pe."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, pe: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return pe * self.factor


def matched_control_sweep(model: torch.nn.Module, ids: torch.Tensor, alphas, *, k: int,
                          base: float) -> dict[str, list[float]]:
    """Early attention mass per self-attention layer when the positions are scaled by the
    constant c(α) = sqrt(mean_t λ^{−2αt}) over the input length (the RMS of the graded factor):
    the same overall position magnitude as λ^{−αt}·Pe without its dependence on t. The model's
    own position grading is restored afterwards."""
    embeds = [m for m in model.modules() if isinstance(m, InputEmbedding)]
    saved = [e.position_grading for e in embeds]
    t = torch.arange(ids.shape[1], dtype=torch.float64)
    layers: dict[str, list[float]] = {}
    was_training = model.training
    model.eval()
    try:
        for alpha in alphas:
            factor = float(torch.sqrt(torch.mean(base ** (-2 * alpha * t))))
            for e in embeds:
                e.position_grading = _ConstantFactor(factor)
            with torch.no_grad(), capture_attention(model) as calls:
                model(ids)
            for call in calls:
                layers.setdefault(call.name, []).append(early_attention_mass(call.weights, k))
    finally:
        for e, pg in zip(embeds, saved):
            e.position_grading = pg
        model.train(was_training)
    return layers


def _head_pair(seed: int, c_bar: float) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(shared, per_head) models with equal weights except the attention grades."""
    common = dict(grading="exponential", grading_base=2.0, grade_init="zeros")
    shared = tiny_lm(seed, **common)
    per_head = tiny_lm(seed, grades_per_head=True, **common)
    state = {k: v for k, v in shared.state_dict().items() if not k.endswith("grades")}
    per_head.load_state_dict(state, strict=False)
    for g in head_gradings(shared):
        g.set_grades(c_bar * torch.arange(g.dim, dtype=torch.float32))
    for g in head_gradings(per_head):
        c = torch.linspace(0.0, 2 * c_bar, g.num_heads)
        g.set_grades(c[:, None] * torch.arange(g.dim, dtype=torch.float32)[None, :])
    return shared, per_head


def _diversity(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, float]:
    """The effective rank of the concatenated heads averaged over the attention layers, and
    the mean pairwise JS divergence averaged over the layers that have a pair of heads: a
    layer of one head has none (its ``mean_js`` is NaN, :func:`head_diversity`) and is left
    out of that mean, which is NaN only when no layer has two heads."""
    out = head_diversity(model, ids)
    js = [v["mean_js"] for v in out.values() if not np.isnan(v["mean_js"])]
    return (float(np.mean([v["effective_rank"] for v in out.values()])),
            float(np.mean(js)) if js else float("nan"))


def _mean_js_text(values: list[float]) -> str:
    """The mean of the seeds' JS differences that have one (a model of one-head layers has
    none), with their count when some lack one."""
    kept = [v for v in values if not np.isnan(v)]
    if not kept:
        return "none (no layer with two heads)"
    count = "" if len(kept) == len(values) else f" (over {len(kept)} of {len(values)} seeds)"
    return f"{np.mean(kept):+.4f}{count}"


class PositionsHeadsExperiment:
    """E4 (claim 4) positional bias against α; E5 (claim 5) per-head against shared grades."""

    name = "E4/E5"
    title = "Positional bias against α and head diversity with per-head grades"
    claims = ("4", "5")

    def run(self, ctx: Context) -> list[Finding]:
        steps = 120 if ctx.quick else 400
        n_models = seed_count(ctx, 3, 5)
        with single_thread():
            return [self._positions(ctx, steps, n_models), self._heads(ctx, steps, n_models)]

    # ------------------------------------------------------------------ E4
    def _positions(self, ctx: Context, steps: int, n_models: int) -> Finding:
        k = LENGTH // 4
        trained, initial, curves, uniform, losses = [], [], [], 0.0, []
        paired: dict[str, list[float]] = {"initial": [], "trained": []}
        per_seed: list[float] = []  # the replicate: a seed's mean over its layers and states
        control_curves: list[list[float]] = []
        for i in range(n_models):
            seed = ctx.base_seed + i
            ids = _eval_ids(seed)
            seed_diffs: list[float] = []
            for label, store in (("initial", initial), ("trained", trained)):
                model = tiny_lm(seed, grading="exponential", grading_base=2.0)
                if label == "trained":
                    losses.append(train_lm(model, steps=steps, seed=seed, length=LENGTH))
                sweep = positional_bias_sweep(model, ids, ALPHAS, k=k)
                control = matched_control_sweep(model, ids, ALPHAS, k=k, base=2.0)
                uniform = sweep["uniform"]
                for name, masses in sweep["layers"].items():
                    slope = least_squares_slope(ALPHAS, masses)
                    store.append(slope)
                    paired[label].append(slope - least_squares_slope(ALPHAS, control[name]))
                    seed_diffs.append(paired[label][-1])
                if label == "trained":
                    curves.append(sweep["mean"])
                    control_curves.append(list(np.mean(list(control.values()), axis=0)))
            per_seed.append(float(np.mean(seed_diffs)))
        above = sum(c[-1] > uniform for c in curves)
        caveat = ("" if above == len(curves) else
                  ": a rise that stays below uniform is what fading positions (attention tending "
                  "to uniform) give, as well as a preference for early keys")
        fig = save_plot(ctx, "e4_positional_bias.png", lambda ax: self._draw_positions(
            ax, curves, control_curves, uniform, k))
        detail = (
            f"{n_models} EGT LMs (λ=2), {steps} lag-copy steps (final loss "
            f"{np.mean(losses):.3f}), 2 layers each; graded positions λ^(−αt) installed for α in "
            f"{ALPHAS} with all other weights fixed; early mass = attention of queries t ≥ {k} "
            f"on keys < {k} (uniform reference {uniform:.3f}). Slope of early mass per unit α: "
            f"trained {np.mean(trained):+.3f} (instances {[round(s, 3) for s in trained]}), at "
            f"initialisation {np.mean(initial):+.3f} "
            f"(instances {[round(s, 3) for s in initial]}). At the largest α the trained "
            f"models' mean early mass exceeds the uniform reference in {above}/{len(curves)}"
            f"{caveat}. The control scales every position by the constant RMS of λ^(−αt) (same "
            f"magnitude, no dependence on t); slope graded − control: trained "
            f"{np.mean(paired['trained']):+.3f}, at initialisation "
            f"{np.mean(paired['initial']):+.3f}. Replicates: seeds, each the mean paired slope "
            "difference over its layers, trained and at initialisation (these share the seed, "
            "so they are not counted as independent). Rule: holds if the 95% interval of the "
            "mean lies above 0.")
        return finding_from_values(
            claim="4", experiment=self.name,
            quantity="slope of attention mass on the first T/4 keys against α, graded positions "
                     "− magnitude-matched constant scaling (per unit α)",
            control="positions scaled by the constant RMS of λ^(−αt) in the same model",
            values=per_seed, predicted="positive", detail=detail,
            figures=[fig], seed=ctx.base_seed)

    @staticmethod
    def _draw_positions(ax, curves, control_curves, uniform: float, k: int) -> None:
        for i, (c, m) in enumerate(zip(curves, control_curves)):
            ax.plot(ALPHAS, c, "o-", color=f"C{i}", label=f"model {i}")
            ax.plot(ALPHAS, m, "x:", color=f"C{i}", label="matched control" if i == 0 else None)
        ax.axhline(uniform, color="grey", ls="--", lw=1, label="uniform")
        ax.set_xlabel("position grading α (λ^(−αt))")
        ax.set_ylabel(f"attention mass on first {k} keys")
        ax.legend(fontsize=7)

    # ------------------------------------------------------------------ E5
    def _heads(self, ctx: Context, steps: int, n_models: int) -> Finding:
        c_bar = 2.0 / 7  # shared q_max = 2 over head_dim 8
        rank_diff, js_diff, rank0_diff, js0_diff, pairs = [], [], [], [], []
        for i in range(n_models):
            seed = ctx.base_seed + i
            ids = _eval_ids(seed)
            shared, per_head = _head_pair(seed, c_bar)
            r0s, j0s = _diversity(shared, ids)
            r0p, j0p = _diversity(per_head, ids)
            rank0_diff.append(r0p - r0s)
            js0_diff.append(j0p - j0s)
            train_lm(shared, steps=steps, seed=seed, length=LENGTH)
            train_lm(per_head, steps=steps, seed=seed, length=LENGTH)
            rs, js = _diversity(shared, ids)
            rp, jp = _diversity(per_head, ids)
            rank_diff.append(rp - rs)
            js_diff.append(jp - js)
            pairs.append((rs, rp, js, jp))
        fig = save_plot(ctx, "e5_head_diversity.png", lambda ax: self._draw_heads(ax, pairs))
        detail = (
            f"{n_models} paired models (4 heads, head_dim 8, λ=2): shared q_k = {c_bar:.3f}·k "
            f"against per-head q_(h,k) = c_h·k, c_h in linspace(0, {2 * c_bar:.3f}, 4); same "
            f"initial weights and batches, {steps} lag-copy steps. Paired differences per-head "
            f"− shared after training: effective rank of concatenated heads "
            f"{np.mean(rank_diff):+.3f}, mean pairwise JS {_mean_js_text(js_diff)} nats; at "
            f"initialisation (grades only differ): effective rank {np.mean(rank0_diff):+.3f}, "
            f"JS {_mean_js_text(js0_diff)}. Rule: holds if the 95% interval of the mean "
            "effective-rank difference lies above 0.")
        return finding_from_values(
            claim="5", experiment=self.name,
            quantity="paired difference in effective rank of the concatenated head outputs, "
                     "per-head grades − shared grades (trained)",
            control="same weights and training with one grade tuple shared by all heads",
            values=rank_diff, predicted="positive", detail=detail, figures=[fig],
            seed=ctx.base_seed)

    @staticmethod
    def _draw_heads(ax, pairs) -> None:
        for rs, rp, _, _ in pairs:
            ax.plot([0, 1], [rs, rp], "o-", color="C0", alpha=0.7)
        ax.set_xticks([0, 1], ["shared q", "per-head q_h"])
        ax.set_ylabel("effective rank of [head_1 | … | head_H]")
