"""All diagnostics of :mod:`graded.analysis` in one call, as flat numbers plus PNG files."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from graded.analysis._common import (
    Inputs,
    check_not_empty,
    eval_mode,
    input_length,
    run_model,
    same_draw,
)
from graded.analysis.capture import call_keys, capture_attention, check_calls, real_queries
from graded.analysis.concentration import measured_grading, model_feature_concentration
from graded.analysis.heads import head_diversity
from graded.analysis.lipschitz import check_lipschitz_counts, model_lipschitz
from graded.analysis.maps import (
    attention_entropy,
    attention_rollout,
    plot_attention_maps,
)
from graded.analysis.plots import plot_head_diversity, plot_rank_comparison, plot_rollout
from graded.analysis.positional import (
    check_sweep_alphas,
    check_sweep_k,
    plot_positional_bias,
    positional_bias_sweep,
    sweep_length,
)
from graded.analysis.rank import DEFAULT_RTOL, attention_rank
from graded.analysis.trajectories import plot_grade_trajectories
from graded.analysis.twin import ungraded_twin
from graded.checks import check_float
from graded.positional import TABLE_POSITIONAL, position_start
from graded.transformer.models import InputEmbedding, TransformerStack

__all__ = ["DiagnosticsReport", "default_alphas", "diagnose"]


@dataclass
class DiagnosticsReport:
    """``metrics``: flat name → float; ``plots``: name → PNG path (empty without out_dir);
    ``notes``: metric name → why that metric is absent or what it leaves out (e.g.
    ``heads/mean_js`` for a model whose layers have one head each: no pair of heads;
    ``rollout/entropy`` for a model that is not one stack; ``lipschitz`` for a morphic
    model)."""

    metrics: dict[str, float]
    plots: dict[str, Path] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def default_alphas(model: nn.Module, length: int) -> list[float]:
    """α values for the positional sweep over ``length`` positions: 0 and two values inside
    the LGT domain α·t_last < 1 (0.4/t_last, 0.8/t_last), t_last = T − 1 the last position,
    T with the 1-indexed ``sinusoidal1`` positions (:func:`~graded.positional.position_start`);
    for EGT 0, 0.25, 0.5 (λ^{−α t} needs no bound)."""
    if model.config.grading == "linear":
        last = max(length - 1 + position_start(model.config.positional), 1)
        return [0.0, 0.4 / last, 0.8 / last]
    return [0.0, 0.25, 0.5]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _head_metrics(diversity: dict[str, dict[str, Any]], prefix: str,
                  notes: dict[str, str]) -> dict[str, float]:
    """Layer means of :func:`head_diversity`'s mean JS and concatenated-head ranks. The mean
    JS is a mean over pairs of heads: a layer of one head has none and is left out of it
    (noted in ``notes``), and without any layer of two or more heads it is not reported."""
    metrics = {
        f"{prefix}concat_numerical_rank":
            _mean([float(d["numerical_rank"]) for d in diversity.values()]),
        f"{prefix}concat_effective_rank":
            _mean([float(d["effective_rank"]) for d in diversity.values()]),
    }
    name = f"{prefix}mean_js"
    single = [key for key, d in diversity.items() if d["js_matrix"].shape[0] < 2]
    if len(single) == len(diversity):
        notes[name] = ("not applicable: every attention layer has one head, so there is no "
                       "pair of heads to compare")
        return metrics
    if single:
        notes[name] = (f"mean over the layers with two or more heads; left out (one head, no "
                       f"pair): {single}")
    metrics[name] = _mean([float(d["mean_js"]) for key, d in diversity.items()
                           if key not in single])
    return metrics


def _alpha_key(alpha: float) -> str:
    return f"positional/early_mass/alpha={alpha:.4g}"


def _query_mean(values: Tensor, queries: Tensor | None) -> float:
    """Mean of per-query ``values`` (B, ..., T) over the real queries (all without a mask;
    NaN, the mean of nothing, when the mask holds none)."""
    if queries is None:
        return float(values.mean())
    m = queries.reshape(queries.shape[0], *([1] * (values.dim() - 2)), queries.shape[1])
    m = m.to(values.dtype).expand_as(values)
    return float((values * m).sum() / m.sum())  # no query: 0 / 0, NaN


def _refuse_unused(model: nn.Module, inputs: Inputs, graded: bool, sweeps: bool, *,
                   alphas: Sequence[float] | None, k: int | None, out_dir: str | Path | None,
                   grade_records: Any) -> None:
    """ValueError naming an option of :func:`diagnose` that would have no effect, and the
    setting that would use it: ``alphas`` and ``k`` without the positional sweep (a graded
    model with additive table positions, :data:`~graded.positional.TABLE_POSITIONAL`, on
    inputs of at least two positions), ``grade_records`` without ``out_dir``."""
    given = [f"{name}={value!r}" for name, value in (("alphas", alphas), ("k", k))
             if value is not None]
    if given and not sweeps:
        if not graded:
            why = (f"{type(model).__name__} is not graded (its config has no grading), and "
                   "the sweep varies the positional grading α of a graded model")
        elif model.config.positional not in TABLE_POSITIONAL:
            why = (f"the model's positional={model.config.positional!r} is not an additive "
                   f"table; the sweep runs for positional in {TABLE_POSITIONAL}")
        else:
            why = (f"the inputs have {input_length(inputs)} position, and the sweep needs at "
                   "least two (a query after the first k keys)")
        raise ValueError(f"{' and '.join(given)} {'sets' if len(given) == 1 else 'set'} the "
                         "positional sweep, which does not run "
                         f"here: {why}; leave {'it' if len(given) == 1 else 'them'} out")
    if grade_records is not None and out_dir is None:
        raise ValueError("grade_records is drawn as the grade trajectory plot, which is "
                         "written only with out_dir; give out_dir, or leave grade_records out")


def diagnose(
    model: nn.Module, inputs: Inputs, out_dir: str | Path | None = None, *,
    k: int | None = None,
    alphas: Sequence[float] | None = None, grade_records: Any = None,
    lipschitz_steps: int = 10, n_random: int = 8, rtol: float = DEFAULT_RTOL, seed: int = 0,
    **model_kwargs: Any,
) -> DiagnosticsReport:
    """Run every diagnostic on ``model`` and ``inputs`` (a tensor, or a tuple of arguments).

    Metrics are means over layers (``rank/...``, ``heads/...``, ``entropy/mean``), the
    Lipschitz estimates and bound factors (``lipschitz/...``), the early attention mass per α
    (``positional/...``, graded models with additive positions and inputs of at least two
    positions), feature concentration
    (``concentration/...``, graded models) and the same head metrics for the ungraded twin
    (``heads/ungraded/...``; ``heads/mean_js``, a mean over pairs of heads, leaves out the
    layers of one head and is absent when every layer has one, as the report's ``notes``
    say). With ``out_dir`` the plots are written there. ``grade_records``
    (a run folder, JSONL/CSV file or list of snapshots) adds the grade trajectory plot.
    ``model_kwargs`` (e.g. ``key_padding_mask``) are passed to every forward call. ``k`` (the
    sweep's number of early keys, 1 when not given) must leave a later query in every input
    sequence; it is checked, with ``alphas``, before any diagnostic runs. ``alphas`` and ``k``
    set the positional sweep only, and ``grade_records`` a plot only: given where the sweep
    does not run (an ungraded model, positions that are not an additive table, inputs of one
    position) or without ``out_dir``, they would have no effect, and are refused, naming the
    setting that uses them.

    Every forward pass of the call starts from the random state the call began in
    (:func:`~graded.analysis._common.same_draw`): with a backend that draws at each call
    (``lsh`` without a ``seed``) the maps, ranks, head metrics, sweep and estimates are all of
    one draw, that of a single forward pass from that state, and the caller's random state is
    left as it was.
    """
    # checked before any diagnostic runs: the inputs, the Lipschitz settings, α, k
    check_not_empty(inputs, "diagnose")
    check_lipschitz_counts(n_random, lipschitz_steps, "lipschitz_steps")
    if alphas is not None:
        alphas = [check_float(f"alphas[{i}]", a) for i, a in enumerate(alphas)]
        keys = [_alpha_key(a) for a in alphas]
        if len(set(keys)) < len(keys):
            raise ValueError(f"alphas={alphas} give the metric keys {keys}, some twice: the "
                             "values of α must differ in their first 4 significant digits")
    metrics: dict[str, float] = {}
    plots: dict[str, Path] = {}
    notes: dict[str, str] = {}
    graded = getattr(getattr(model, "config", None), "grading", None) is not None
    # one position has no query beyond the first k >= 1 keys: no early mass to measure
    sweeps = (graded and model.config.positional in TABLE_POSITIONAL
              and input_length(inputs) >= 2)
    _refuse_unused(model, inputs, graded, sweeps, alphas=alphas, k=k, out_dir=out_dir,
                   grade_records=grade_records)
    k = 1 if k is None else k
    if sweeps:  # k and α checked before any diagnostic runs, not after all but the sweep
        check_sweep_k(k, inputs)
        if alphas is not None:
            alphas = check_sweep_alphas(model, alphas, sweep_length(inputs, model_kwargs))

    # every forward pass below starts from one random state: a backend that draws at each
    # call (lsh without a seed) gives every metric and plot the attention of one draw
    with same_draw(model):
        with eval_mode(model), capture_attention(model) as calls:  # attention_maps, with queries
            run_model(model, inputs, **model_kwargs)
        check_calls(calls, model, "diagnose")
        keys = call_keys(calls)
        maps = {key: call.weights for key, call in zip(keys, calls, strict=True)}
        queries = [real_queries(call) for call in calls]  # each call's real query rows
        metrics["entropy/mean"] = _mean([_query_mean(attention_entropy(w), rows)
                                         for w, rows in zip(maps.values(), queries, strict=True)])
        rollout = None
        stacks = sum(1 for m in model.modules() if isinstance(m, TransformerStack))
        if stacks == 1 and len({w.shape for w in maps.values()}) == 1:  # one self-attention stack
            rollout = attention_rollout(maps)  # its rows are the tokens' (the calls' queries)
            metrics["rollout/entropy"] = _query_mean(attention_entropy(rollout), queries[0])
        else:
            notes["rollout/entropy"] = (
                f"not computed: the rollout composes the self-attention maps of one transformer "
                f"stack, and {type(model).__name__} has {stacks} graded.transformer stacks"
                if stacks != 1 else "not computed: the layers' attention maps differ in shape")

        ranks = attention_rank(model, inputs, rtol=rtol, **model_kwargs)
        per_layer = [r.to_dict() for r in ranks.values()]
        for key in per_layer[0]:
            metrics[f"rank/{key}"] = _mean([d[key] for d in per_layer])

        diversity = head_diversity(model, inputs, rtol=rtol, **model_kwargs)
        metrics.update(_head_metrics(diversity, "heads/", notes))
        if graded:
            twin = head_diversity(ungraded_twin(model), inputs, rtol=rtol, **model_kwargs)
            metrics.update(_head_metrics(twin, "heads/ungraded/", notes))

        if any(isinstance(m, InputEmbedding) for m in model.modules()):
            lip = model_lipschitz(model, inputs, compare_ungraded=graded, n_random=n_random,
                                  steps=lipschitz_steps, seed=seed, **model_kwargs)
            metrics.update({f"lipschitz/{key}": v for key, v in lip.items()})
        else:  # a morphic model: its grade-typed attention is measured, its Lipschitz constant not
            notes["lipschitz"] = (f"not measured: {type(model).__name__} has no graded.transformer "
                                  "input embedding, the input X that the estimate perturbs "
                                  "(000 §5)")

        sweep = None
        if sweeps:
            sweep = positional_bias_sweep(model, inputs,
                                          alphas if alphas is not None
                                          else default_alphas(model, sweep_length(inputs,
                                                                                  model_kwargs)),
                                          k=k,
                                          **model_kwargs)
            for a, mass in zip(sweep["alphas"], sweep["mean"]):
                metrics[_alpha_key(a)] = mass
            metrics["positional/uniform"] = sweep["uniform"]
        if graded and measured_grading(model)[0] is not None:
            conc = model_feature_concentration(model, inputs, **model_kwargs)
            metrics.update({f"concentration/{key}": v for key, v in conc.to_dict().items()})

        if out_dir is not None:
            plots["attention_maps"] = plot_attention_maps(maps, out_dir)
            plots["attention_rank"] = plot_rank_comparison(ranks, out_dir)
            plots["head_diversity"] = plot_head_diversity(diversity, out_dir)
            if rollout is not None:
                plots["attention_rollout"] = plot_rollout(rollout, out_dir)
            if sweep is not None:
                plots["positional_bias"] = plot_positional_bias(sweep, out_dir)
            if grade_records is not None:
                plots["grade_trajectories"] = plot_grade_trajectories(grade_records, out_dir)
    bad = [key for key, v in metrics.items() if isinstance(v, float) and math.isnan(v)
           and key != "concentration/lemma_bound_fraction"]
    if bad:
        raise RuntimeError(f"diagnostics produced NaN for {bad}: a mean over no query (a "
                           f"batch of padding only; for positional/..., no real query beyond "
                           f"the first k={k} positions) or NaN in the model's outputs")
    return DiagnosticsReport(metrics, plots, notes)
