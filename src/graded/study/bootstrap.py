"""Percentile bootstrap intervals of a mean over replicates: :func:`bootstrap_interval` of a
mean, :func:`paired_bootstrap` of a mean paired difference, :func:`cluster_bootstrap` for values
that come in dependent clusters (Davison & Hinkley 1997, *Bootstrap Methods and their
Application*, §3.8, strategy 1), and :func:`two_stage_bootstrap` for values on a grid of tasks
and seeds, resampling both.

Labels (clusters, tasks, seeds, strata) are coded by the order of their first value
(:func:`_codes`), so a resampling depends on that order and not on the labels. The study's
interval (:func:`graded.study.statistics.mean_interval`) takes the hull of these with the t
interval: the percentile interval alone is too narrow for few replicates.
"""

from __future__ import annotations

import numpy as np

from graded.checks import check_int
from graded.study.distributions import _check_level

__all__ = ["bootstrap_interval", "cluster_bootstrap", "paired_bootstrap", "two_stage_bootstrap"]


def _check_resampling(n_boot: int, level: float, caller: str) -> None:
    """A bootstrap's number of resamples is a positive integer and its level lies in (0, 1)."""
    check_int("n_boot", n_boot, minimum=1)
    _check_level(level, caller)


def bootstrap_interval(values, *, n_boot: int = 10_000, level: float = 0.95,
                       seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile bootstrap interval."""
    _check_resampling(n_boot, level, "bootstrap_interval")
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    if x.size == 1:
        return float(x[0]), float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return float(x.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def _codes(labels: list) -> np.ndarray:
    """Each label's index among the distinct labels, taken in the order of their first value
    (so a resampling depends on that order, not on the labels themselves)."""
    index: dict = {}
    return np.array([index.setdefault(c, len(index)) for c in labels], dtype=np.int64)


def _cluster_sums(x: np.ndarray, clusters, caller: str) -> tuple[np.ndarray, np.ndarray]:
    """The sum and the number of the values of each cluster (:func:`_codes` order)."""
    labels = list(clusters)
    if len(labels) != x.size:
        raise ValueError(f"{caller} needs one cluster label per value, got {x.size} "
                         f"values and {len(labels)} labels")
    member = _codes(labels)
    k = int(member.max()) + 1 if member.size else 0
    return (np.bincount(member, weights=x, minlength=k),
            np.bincount(member, minlength=k).astype(np.float64))


def cluster_bootstrap(values, clusters, *, n_boot: int = 10_000, level: float = 0.95,
                      seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile bootstrap interval when the values come in
    clusters that are not independent within (the layers or tools of one seed, the bases of one
    random draw, the tasks of one seed): whole clusters are resampled, ``clusters[i]`` naming
    the cluster of ``values[i]`` (the cluster bootstrap, Davison & Hinkley 1997 §3.8, strategy
    1: resample clusters, keep each cluster's values as they are).

    The estimate is the mean over all values; a resample's statistic is the mean over all
    values of its clusters (Σ cluster sums / Σ cluster sizes, so with equal sizes the mean of
    the cluster means). Clusters are taken in the order of their first value, so the resampling
    depends on that order and not on the labels. With one value per cluster this is
    :func:`bootstrap_interval`, draw for draw."""
    _check_resampling(n_boot, level, "cluster_bootstrap")
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("cluster_bootstrap needs at least one value")
    sums, sizes = _cluster_sums(x, clusters, "cluster_bootstrap")
    k = sums.size
    if k == 1:
        return float(x.mean()), float(x.mean()), float(x.mean())
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, k, size=(n_boot, k))
    if np.all(sizes == 1.0):  # singletons: exactly bootstrap_interval's arithmetic
        means = sums[draw].mean(axis=1)
    else:
        means = sums[draw].sum(axis=1) / sizes[draw].sum(axis=1)
    tail = (1.0 - level) / 2.0
    return float(x.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def two_stage_bootstrap(values, tasks, seeds, *, n_boot: int = 10_000, level: float = 0.95,
                        seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile bootstrap interval when the tasks, too, are treated
    as a sample: ``values[i]`` was measured on task ``tasks[i]`` with seed ``seeds[i]``, and
    each bootstrap replicate resamples the tasks with replacement (stage 1), then the seeds
    with replacement (stage 2), and takes the mean over every value of the drawn (task, seed)
    cells (a task or seed drawn twice counts twice; a cell holding several values weighs them
    all, Σ sums / Σ counts, as :func:`cluster_bootstrap` does). The two-stage bootstrap of
    Davison & Hinkley 1997 §3.8 (strategy 2) and Field & Welsh 2007 ("Bootstrapping clustered
    data", JRSS B 69), with one departure: the seeds are drawn **once** per replicate and
    shared by every drawn task, not drawn afresh within each, because here a seed index is
    one training seed on every task (the same subset order, minibatch order and
    initialisation), so tasks and seeds are crossed factors, not nested ones. Resampling both
    crossed factors is Owen's pigeonhole bootstrap (Owen 2007, *Ann. Appl. Stat.* 1(2);
    McCullagh 2000, *Bernoulli* 6, shows that no bootstrap of a crossed array is exact; this
    one errs wide). Drawing seeds afresh within each task would count one seed's shared effect
    as k independent ones and shrink its part of the spread by √k; with identical tasks it
    would be √k narrower than the bootstrap of the seeds, while this one then draws exactly
    what ``cluster_bootstrap(values, seeds)`` draws.

    The estimate is the mean over all values. Tasks and seeds are taken in the order of their
    first value; the seeds are drawn first from the generator, then the tasks. A percentile
    interval over only k = 3 or 4 tasks is itself too narrow (the narrowness bias of
    :func:`mean_interval`'s docstring, at k rather than at the number of seeds): read it as
    the least a sample of tasks would add, not as a verdict interval."""
    _check_resampling(n_boot, level, "two_stage_bootstrap")
    x = np.asarray(values, dtype=np.float64).ravel()
    task_labels, seed_labels = list(tasks), list(seeds)
    if x.size == 0:
        raise ValueError("two_stage_bootstrap needs at least one value")
    if not len(task_labels) == len(seed_labels) == x.size:
        raise ValueError(f"two_stage_bootstrap needs one task and one seed label per value, got "
                         f"{x.size} values, {len(task_labels)} tasks and {len(seed_labels)} "
                         "seeds")
    t, s = _codes(task_labels), _codes(seed_labels)
    k, m = int(t.max()) + 1, int(s.max()) + 1
    sums = np.zeros((k, m))
    counts = np.zeros((k, m))
    np.add.at(sums, (t, s), x)
    np.add.at(counts, (t, s), 1.0)
    rng = np.random.default_rng(seed)
    seed_draw = rng.integers(0, m, size=(n_boot, m))
    task_draw = rng.integers(0, k, size=(n_boot, k))
    # how often each seed and each task is drawn in each replicate
    seed_times = np.zeros((n_boot, m))
    np.add.at(seed_times, (np.arange(n_boot)[:, None], seed_draw), 1.0)
    task_times = np.zeros((n_boot, k))
    np.add.at(task_times, (np.arange(n_boot)[:, None], task_draw), 1.0)
    total = np.einsum("bi,ij,bj->b", task_times, sums, seed_times)
    number = np.einsum("bi,ij,bj->b", task_times, counts, seed_times)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = total / number
    means = means[number > 0]  # a replicate of missing cells only has no mean
    tail = (1.0 - level) / 2.0
    return float(x.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def paired_bootstrap(arm, control, **kwargs) -> tuple[float, float, float]:
    """Mean paired difference ``arm − control`` (same seeds, same data) with its interval."""
    a = np.asarray(arm, dtype=np.float64).ravel()
    c = np.asarray(control, dtype=np.float64).ravel()
    if a.shape != c.shape:
        raise ValueError(f"paired values need equal lengths, got {a.size} and {c.size}")
    return bootstrap_interval(a - c, **kwargs)

