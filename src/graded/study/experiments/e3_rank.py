"""E3: does graded attention raise the rank of the attention matrix? (claim 1, 001 Prop 3.5).

001 Prop 3.5 says grading *always* increases the numerical rank of A = softmax(Q M Kᵀ/√d); 000
Props 5.17/6.10 say the effective rank "may increase or decrease". A grading also changes the
size of the scores, and a softmax at another temperature has another rank for that reason alone,
so the comparison that isolates the grading is the **scale-matched control**: the graded scores
rescaled to the Frobenius norm of the ungraded ones (:mod:`graded.analysis.rank`).

Instances (each a paired comparison on the same Q, K):

- random: Gaussian Q, K (n × d_k), EGT grades q = linspace(0, q_max, d_k), bases λ ∈ {1.5, 2, 4}
  (:func:`graded.analysis.rank.random_rank_study`), one instance per draw and base;
- trained: small EGT language models (fixed warm-start grades) trained on the lag-copy task,
  one instance per seed and attention layer (:func:`graded.analysis.rank.attention_rank`, which
  captures each layer's own Q, K and grading).

Estimate: the mean paired difference of the effective rank exp(H(σ/Σσ)) of the softmax attention,
graded scale-matched − ungraded, over a population's instances (the numerical rank
#{σ > 10⁻³σ₁} saturates near n for these sizes and mostly ties, so it is reported beside it
rather than used). The two populations are two findings of claim 1, each with its own interval
and verdict under the same rule: they answer different questions (any Q, K against the Q, K a
trained model makes) and have different replicates, so pooling them would let the 50 random
draws outweigh the 5 trained seeds and hide the trained models' own estimate. Within a
population the instances are not all independent: the bases λ of one random draw share its
Q, K, and the layers of one trained model share its seed, so the replicates are the draws, or
the seeds, and the interval resamples them whole
(:func:`graded.study.statistics.cluster_bootstrap`; the study's interval,
:func:`graded.study.statistics.mean_interval`, is its hull with the t interval over the
replicates, a draw's or seed's value its size-weighted mean). A population's finding holds if
its 95% interval lies above 0 (verdict rule of :func:`graded.study.core.verdict`); the
fraction of its instances with graded ≥ ungraded, the unmatched comparison and the effective
ranks are reported beside it.

The random-instance finding comes first and is claim 1's summary row: 001 Prop 3.5 states the
rise for every Q, K ("always"), which random Gaussian Q, K test directly, and a statement for
every Q, K is refuted by one population where it fails; the trained-model finding says
whether the same holds for the Q, K that training produces, and cannot restore a claim the
random instances refute.
"""

from __future__ import annotations

import numpy as np
import torch

from graded.analysis.rank import attention_rank, random_rank_study
from graded.study.core import Context, Finding
from graded.study.experiments._e_common import (
    finding_from_values,
    lag_copy_batch,
    save_plot,
    seed_count,
    single_thread,
    tiny_lm,
    train_lm,
)

__all__ = ["RankExperiment", "random_rank_differences"]

BASES = (1.5, 2.0, 4.0)
# graded − ungraded: numerical rank scale-matched and unmatched, effective rank likewise
_KEYS = ("matched", "raw", "eff_matched", "eff_raw")


def _per_matrix(comparison, condition: str, kind: str) -> np.ndarray:
    stats = comparison.attention[condition]
    t = stats.numerical_rank_per_matrix if kind == "numerical" else stats.effective_rank_per_matrix
    return t.flatten().numpy()


def random_rank_differences(*, n: int, trials: int, seed: int, d_k: int = 16,
                            q_max: float = 2.0) -> tuple[dict[str, list[float]], dict]:
    """Per random instance (draw × base λ of :data:`BASES`), graded − ungraded differences of the
    softmax attention's numerical rank (``matched``: scale-matched, ``raw``: unmatched) and
    effective rank (``eff_matched``, ``eff_raw``); and the mean effective rank per base and
    condition. Instances come base by base, draws in order within a base: instance
    ``b * trials + t`` is draw ``t`` (the same Q, K for every base)."""
    study = random_rank_study(n=n, d_k=d_k, q_max=q_max, bases=(1.0, *BASES), trials=trials,
                              seed=seed)
    rows: dict[str, list[float]] = {k: [] for k in _KEYS}
    by_base = {}
    for lam in BASES:
        cmp = study[lam]
        u_nr = _per_matrix(cmp, "ungraded", "numerical")
        u_er = _per_matrix(cmp, "ungraded", "effective")
        rows["matched"] += list(_per_matrix(cmp, "graded_matched", "numerical") - u_nr)
        rows["raw"] += list(_per_matrix(cmp, "graded", "numerical") - u_nr)
        rows["eff_matched"] += list(_per_matrix(cmp, "graded_matched", "effective") - u_er)
        rows["eff_raw"] += list(_per_matrix(cmp, "graded", "effective") - u_er)
        by_base[lam] = {c: cmp.attention[c].effective_rank for c in cmp.attention}
    return rows, by_base


def _fractions_text(rows: dict[str, list[float]]) -> str:
    """The fraction of instances with graded ≥ ungraded and the mean difference, numerical and
    effective rank, scale-matched and unmatched."""
    def frac_ge(v: list[float]) -> float:
        return float(np.mean(np.asarray(v) >= 0))

    return (f"Fraction of instances with graded ≥ ungraded numerical rank: scale-matched "
            f"{frac_ge(rows['matched']):.2f}, unmatched {frac_ge(rows['raw']):.2f}; effective "
            f"rank: scale-matched {frac_ge(rows['eff_matched']):.2f}, unmatched "
            f"{frac_ge(rows['eff_raw']):.2f}. Mean numerical-rank difference: scale-matched "
            f"{np.mean(rows['matched']):+.2f}, unmatched {np.mean(rows['raw']):+.2f}; mean "
            f"effective-rank difference: scale-matched {np.mean(rows['eff_matched']):+.2f}, "
            f"unmatched {np.mean(rows['eff_raw']):+.2f}.")


class RankExperiment:
    """E3 (claim 1): attention rank, graded against ungraded, with the scale-matched control."""

    name = "E3"
    title = "Attention rank: graded vs ungraded, random and trained, scale-matched control"
    claims = ("1",)
    # Replicates without --seeds: (quick, full study); the report's note reads them.
    default_seeds = (2, 5)

    def run(self, ctx: Context) -> list[Finding]:
        with single_thread():
            return self._run(ctx)

    def _run(self, ctx: Context) -> list[Finding]:
        trials = 16 if ctx.quick else 50
        n = 32 if ctx.quick else 64
        steps = 150 if ctx.quick else 400
        n_models = seed_count(ctx, *self.default_seeds)
        rows, by_base = random_rank_differences(n=n, trials=trials, seed=ctx.base_seed)
        # the replicate of each instance: its random draw (shared by the bases) or its seed
        # (shared by the layers); the interval resamples these whole
        draws = [f"draw {t}" for _ in BASES for t in range(trials)]
        trained, seeds, losses = self._trained_differences(ctx, n_models, steps)
        fig = save_plot(ctx, "e3_rank.png", lambda ax: self._draw(ax, by_base), size=(5, 3.2))
        rule = ("Rule: holds if the 95% interval of the population's mean paired difference "
                "lies above 0.")
        random_detail = (
            f"Random instances: {len(rows['matched'])} (n={n}, d_k=16, q=linspace(0,2,16), "
            f"λ∈{BASES}, {trials} Gaussian draws of Q, K each). {_fractions_text(rows)} "
            "Mean effective rank of A by λ (ungraded/graded/matched): "
            + "; ".join(f"λ={lam}: {v['ungraded']:.1f}/{v['graded']:.1f}/"
                        f"{v['graded_matched']:.1f}" for lam, v in by_base.items())
            + f". Replicates: the {trials} random draws, each with its {len(BASES)} bases on "
            "the same Q, K, resampled whole; the estimate is the mean over the instances. "
            "This is claim 1's summary row: 001 Prop 3.5 states the rise for every Q, K; "
            "the trained models are claim 1's second finding, with their own interval. " + rule)
        trained_detail = (
            f"Trained instances: {len(trained['matched'])} (seed, layer) pairs of {n_models} "
            f"EGT LMs (λ=2, warm-start grades q_k = 2k/31, {steps} steps of lag-copy, final "
            f"loss {np.mean(losses):.3f}), each the mean over its layer's attention matrices "
            f"(one per head and sequence; 8 lag-copy sequences of 16 tokens). "
            f"{_fractions_text(trained)} "
            f"Replicates: the {n_models} seeds, each with its layers, resampled whole; the "
            "estimate is the mean over the instances. The random instances are claim 1's "
            "first finding (its summary row). " + rule)
        quantity = ("mean paired difference in effective rank of softmax attention, graded "
                    "scale-matched − ungraded, {}")
        control = "same Q, K ungraded; graded scores rescaled to the ungraded Frobenius norm"
        return [
            finding_from_values(
                claim="1", experiment=self.name,
                quantity=quantity.format("random Gaussian Q, K"), control=control,
                values=rows["eff_matched"], predicted="positive", clusters=draws,
                detail=random_detail, figures=[fig], seed=ctx.base_seed),
            finding_from_values(
                claim="1", experiment=self.name,
                quantity=quantity.format("trained EGT language models' own Q, K"),
                control=control, values=trained["eff_matched"], predicted="positive",
                clusters=seeds, detail=trained_detail, figures=[fig], seed=ctx.base_seed),
        ]

    @staticmethod
    def _trained_differences(ctx: Context, n_models: int, steps: int
                             ) -> tuple[dict[str, list[float]], list[str], list[float]]:
        """Per (seed, attention layer) of ``n_models`` trained EGT LMs, the graded − ungraded
        differences of :func:`random_rank_differences`' keys (each the mean over the layer's
        attention matrices); the seed label of each, and each model's final loss."""
        trained: dict[str, list[float]] = {k: [] for k in _KEYS}
        seeds: list[str] = []
        losses = []
        for i in range(n_models):
            seed = ctx.base_seed + i
            model = tiny_lm(seed, grading="exponential", grading_base=2.0,
                            grade_init="warm_start", grade_init_value=2.0 / 31)
            losses.append(train_lm(model, steps=steps, seed=seed))
            ids, _ = lag_copy_batch(8, 16, model.config.vocab_size, 2,
                                    torch.Generator().manual_seed(10_000 + seed))
            for cmp in attention_rank(model, ids).values():
                u_nr = _per_matrix(cmp, "ungraded", "numerical")
                u_er = _per_matrix(cmp, "ungraded", "effective")
                for key, cond, kind in (("matched", "graded_matched", "numerical"),
                                        ("raw", "graded", "numerical"),
                                        ("eff_matched", "graded_matched", "effective"),
                                        ("eff_raw", "graded", "effective")):
                    base = u_nr if kind == "numerical" else u_er
                    trained[key].append(float(np.mean(_per_matrix(cmp, cond, kind) - base)))
                seeds.append(f"seed {seed}")
        return trained, seeds, losses

    @staticmethod
    def _draw(ax, by_base: dict[float, dict[str, float]]) -> None:
        lams = list(by_base)
        for cond, style in (("ungraded", "k--"), ("graded", "o-"), ("graded_matched", "s-")):
            ax.plot(lams, [by_base[lam][cond] for lam in lams], style, label=cond)
        ax.set_xlabel("grading base λ (q = linspace(0, 2, d_k))")
        ax.set_ylabel("effective rank of softmax A")
        ax.set_xscale("log")
        ax.legend(fontsize=7)
