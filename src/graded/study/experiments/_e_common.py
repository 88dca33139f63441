"""Shared pieces of the study's experiments E3–E9: a small sequence task, small graded language
models and their training, rank statistics, and the finding and figure helpers.

The sequence task is a *lag copy*: random tokens x_0..x_{T−1} from a vocabulary of V symbols,
target y_t = x_{t−lag} for t ≥ lag (earlier positions are not scored). Solving it needs attention
to a fixed relative position, so attention weights, positions and heads all matter.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from graded.study.core import Context, Finding, verdict
from graded.study.statistics import mean_interval, paired_t_p_value, replicate_values
from graded.transformer.config import TransformerConfig
from graded.transformer.models import TransformerLM

__all__ = [
    "IGNORE",
    "equivalence_verdict",
    "exact_verdict",
    "finding_from_values",
    "lag_copy_batch",
    "least_squares_slope",
    "nan_max",
    "p_value_against_zero",
    "save_plot",
    "seed_count",
    "single_thread",
    "spearman",
    "t_test_note",
    "tiny_lm",
    "train_lm",
]

IGNORE = -100


def seed_count(ctx: Context, quick: int, full: int) -> int:
    """The user's ``--seeds`` when given, else the experiment's default for the mode: each
    experiment passes its ``default_seeds = (quick, full)``, which the report's note lists."""
    return ctx.seeds if ctx.seeds_given else (quick if ctx.quick else full)


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One intra-op thread for the duration (these models are too small to gain from more, and
    the study's workers share the cores); the previous setting is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def lag_copy_batch(batch: int, length: int, vocab: int, lag: int,
                   generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Input ids (B, T) uniform over ``vocab`` symbols and targets (B, T) with y_t = x_{t−lag}
    for t ≥ lag and ``IGNORE`` before."""
    if not 0 < lag < length:
        raise ValueError(f"lag must lie in [1, {length - 1}] for sequences of {length}, got {lag}")
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    targets = torch.full_like(ids, IGNORE)
    targets[:, lag:] = ids[:, :-lag]
    return ids, targets


def tiny_lm(seed: int, **overrides: Any) -> TransformerLM:
    """A small decoder-only LM (d_model 32, 2 layers, 4 heads, vocabulary 16, length ≤ 32),
    initialised from ``seed``; ``overrides`` are :class:`TransformerConfig` fields."""
    fields: dict[str, Any] = dict(vocab_size=16, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                                  max_len=32, positional="learned", init_std=0.1)
    fields.update(overrides)
    torch.manual_seed(seed)
    return TransformerLM(TransformerConfig(**fields))


def train_lm(model: TransformerLM, *, steps: int, seed: int, lag: int = 2, length: int = 16,
             batch: int = 32, lr: float = 3e-3) -> float:
    """Train ``model`` on the lag-copy task with Adam; returns the mean loss of the last 10
    steps."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    vocab = model.config.vocab_size
    losses: list[float] = []
    model.train()
    for _ in range(steps):
        ids, targets = lag_copy_batch(batch, length, vocab, lag, gen)
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    tail = losses[-10:]
    return sum(tail) / max(len(tail), 1)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); nan when either side is constant."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"spearman needs two equal-length sequences of >= 2 values, got "
                         f"{a.size} and {b.size}")

    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(v.size)
        r[order] = np.arange(v.size, dtype=np.float64)
        for value in np.unique(v):  # average ranks over ties
            tie = v == value
            r[tie] = r[tie].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def least_squares_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Slope of the ordinary least-squares line of y on x."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.size < 2 or np.ptp(a) == 0:
        raise ValueError(f"least_squares_slope needs >= 2 distinct x values, got {a.tolist()}")
    a0 = a - a.mean()
    return float((a0 * (b - b.mean())).sum() / (a0 * a0).sum())


def nan_max(*values: float) -> float:
    """The largest of ``values``, NaN when any is NaN. Python's ``max`` keeps or drops a NaN
    by its position (``max(0.0, nan)`` is 0.0), so a deviation that could not be measured
    would pass an exact check."""
    if not values:
        raise ValueError("nan_max needs at least one value")
    return float(np.max(np.asarray(values, dtype=np.float64)))


def exact_verdict(holds: bool) -> str:
    """The rule of exact checks: the statement holds on every instance, or it fails."""
    return "holds" if holds else "fails"


def equivalence_verdict(low: float, high: float, lo: float, hi: float) -> str:
    """A predicted *value*: holds when the interval lies inside [lo, hi], fails when it lies
    wholly outside it, inconclusive otherwise. The band needs lo < hi."""
    if not lo < hi:
        raise ValueError(f"equivalence_verdict needs a band [lo, hi] with lo < hi, got "
                         f"lo={lo!r}, hi={hi!r}")
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        return "inconclusive"
    if lo <= low and high <= hi:
        return "holds"
    if high < lo or low > hi:
        return "fails"
    return "inconclusive"


def p_value_against_zero(values: Sequence[float]) -> float:
    """The two-sided t-test p-value of "the mean is 0"
    (:func:`graded.study.statistics.paired_t_p_value`), or 1.0 when one value cannot test
    anything."""
    return paired_t_p_value(values) if len(values) >= 2 else 1.0


def t_test_note(values: Sequence[float], clusters: Sequence[Any] | None = None) -> str:
    """A finding's sentence for a prediction against 0: the two-sided t-test of the seeds'
    values against 0, over the values the t interval is taken over
    (:func:`graded.study.statistics.replicate_values`: the seeds' means when ``clusters`` names
    each value's seed, size-weighted when the seeds bring different numbers of values)."""
    u = replicate_values(values, clusters)
    if clusters is None:
        kind = "values"
    else:
        sizes = [list(clusters).count(c) for c in set(clusters)]
        kind = "means" if len(set(sizes)) == 1 else "size-weighted values (as in the interval)"
    return (f"Two-sided t-test of the {u.size} seeds' {kind} against 0: "
            f"p = {p_value_against_zero(list(u)):.3g}.")


def finding_from_values(
    *, claim: str, experiment: str, quantity: str, control: str, values: Sequence[float],
    predicted: str, margin: float = 0.0, seeds: int | None = None, detail: str = "",
    figures: Sequence[str] = (), seed: int = 0, clusters: Sequence[Any] | None = None,
    bounds: tuple[float, float] | None = None, t_test: bool = False,
    items_per_replicate: int | None = None,
) -> Finding:
    """A finding whose estimate is the mean of ``values`` with the study's 95% interval
    (:func:`graded.study.statistics.mean_interval`: the hull of the percentile bootstrap and the t
    interval, both shown in the detail) and the verdict of :func:`graded.study.core.verdict`
    (``predicted`` "positive" or "negative").

    ``clusters`` (one label per value) names the replicate each value belongs to when several
    values share one (a seed's tools or layers): the interval then resamples whole clusters
    (:func:`graded.study.statistics.cluster_bootstrap`) and ``seeds`` defaults to their number.
    Non-finite values are left out, with their labels. ``bounds``: the range the quantity can
    take, to which the interval is cut (an accuracy [0, 1], a correlation [−1, 1]). ``t_test``:
    where the prediction is against 0 (``margin`` 0), the detail also gives
    :func:`t_test_note`. ``items_per_replicate``: for accuracies, the number of distinct
    items each replicate (cluster) answers; the interval then also takes the exact binomial
    interval over all replicates' items (``mean_interval(trials=...)``), so that replicates
    without spread (every run right on every item) do not make the accuracy certain."""
    if clusters is not None and len(clusters) != len(values):
        raise ValueError(f"one cluster label per value: {len(values)} values, "
                         f"{len(clusters)} labels")
    labels = list(clusters) if clusters is not None else list(range(len(values)))
    kept = [(float(v), c) for v, c in zip(values, labels) if math.isfinite(float(v))]
    if not kept:
        return Finding(claim, experiment, quantity, control, 0, float("nan"), float("nan"),
                       float("nan"), "inconclusive", detail + " No finite value was measured.",
                       list(figures))
    values = [v for v, _ in kept]
    trials = (None if items_per_replicate is None
              else len({c for _, c in kept}) * items_per_replicate)
    interval = mean_interval(values, None if clusters is None else [c for _, c in kept],
                             seed=seed, bounds=bounds, trials=trials)
    n = seeds if seeds is not None else interval.replicates
    if t_test and margin == 0.0:
        detail += " " + t_test_note(values, None if clusters is None else [c for _, c in kept])
    return Finding(claim, experiment, quantity, control, n, interval.estimate, interval.low,
                   interval.high,
                   verdict(interval.low, interval.high, predicted=predicted, margin=margin),
                   f"{detail} {interval.note()}", list(figures))


def save_plot(ctx: Context, name: str, draw: Callable[[Any], None], *,
              size: tuple[float, float] = (5.0, 3.4)) -> str:
    """Draw a one-axes figure with ``draw(ax)`` and save it as ``ctx.path(name)``; returns the
    file name."""
    from graded.plotting import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=size)
    draw(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, ctx.path(name), dpi=80)
    return name
