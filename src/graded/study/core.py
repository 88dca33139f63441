"""The claims study's vocabulary: claims, findings, experiments and the statistics behind verdicts.

Every row of the report is a :class:`Finding` for one :class:`Claim` of :data:`CLAIMS` (the 28
testable claims of ``notes/seeds_001_004.md`` Part I plus 000's sample efficiency, robustness and
interpretability). An :class:`Experiment` measures one or more claims; it receives a
:class:`Context` and returns findings. Verdicts follow :func:`verdict`, whose rule the report
states before the numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from graded._io import atomic_write_text

__all__ = [
    "CLAIMS",
    "RULE",
    "Claim",
    "Context",
    "Experiment",
    "Finding",
    "Interval",
    "JobExperiment",
    "Verdict",
    "atomic_write_text",
    "bootstrap_interval",
    "cluster_bootstrap",
    "holm",
    "mean_interval",
    "paired_bootstrap",
    "paired_t_p_value",
    "replicate_values",
    "run_jobs_inline",
    "t_interval",
    "t_quantile",
    "verdict",
]

Verdict = Literal["holds", "fails", "inconclusive"]


@dataclass(frozen=True)
class Claim:
    """One testable statement of the papers."""

    id: str
    source: str
    statement: str
    prediction: str


CLAIMS: dict[str, Claim] = {c.id: c for c in (
    Claim("1", "001 Prop 3.5", "graded attention raises the rank of the attention matrix",
          "graded rank ≥ standard rank, always"),
    Claim("2", "001 Prop 3.6; 000 Prop 5.16", "aligned grading lowers sample complexity",
          "aligned grading needs fewer samples than none or misaligned"),
    Claim("3", "001 Prop 3.7", "graded models are robust to input noise",
          "‖T(X+Δ) − T(X)‖/‖Δ‖ ≤ L·λ^{q_max}"),
    Claim("4", "001 Prop 4.4", "graded positions bias attention towards early positions",
          "attention mass on early keys increases with α"),
    Claim("5", "001 Prop 4.7", "per-head grades diversify heads",
          "distinct q_h give a richer span of head outputs than shared grades"),
    Claim("6", "001 Thm 4.1, Lemmas 4.3, 4.5, Thm 4.6, Props 4.8-4.9",
          "Jacobians of graded layers are bounded", "autograd Jacobian norms within the bounds"),
    Claim("7", "001 Thm 5.1, Prop 5.2",
          "training converges; grade gradients scale as λ^{q_max} ln λ",
          "‖∂L/∂q‖ ∝ λ^{q_max} ln λ"),
    Claim("8", "001 Prop 4.10", "grading costs O(nd) extra", "wall-clock overhead negligible"),
    Claim("9", "004 Thm 5.1", "utility bounds of a morphism step",
          "ΔL ≥ a(1 − La/2)‖∇‖² > 0 for a < 2/L"),
    Claim("10", "004 Thm 5.5", "softmax routing selects the useful edge",
          "mass on the useful edge → 1 exponentially in (β/τ)·margin"),
    Claim("11", "004 §5.4 (i)", "utility histogram shifts positive with training",
          "mass moves to ΔL > 0"),
    Claim("12", "004 §5.4 (iii)", "edge ablation separates useful from useless edges",
          "loss increase > 0 for useful edges, ≈ 0 for useless ones"),
    Claim("13", "004 §5.4 (iv)", "utility estimates are calibrated",
          "P(ΔL > 0) increases monotonically with the estimate"),
    Claim("14", "004 abstract, §3.3", "routing is sparse and interpretable",
          "low entropy; the correct tool is chosen"),
    Claim("15", "004 Prop 5.6, A.6", "the adder morphism has the full pre-update NLL as utility",
          "CE after executing Π_k → its minimum"),
    Claim("16", "004 Prop 5.7", "retrieval utility", "r_{i*} ≥ 1 − e^{−γ/σ²}"),
    Claim("17", "004 Prop 5.8", "Dyck depth morphism helps on depth-sensitive positions",
          "ΔL ≥ κ when the depth is correct"),
    Claim("18", "004 Thm 4.13", "routed updates decrease the loss to first order",
          "L(z + ηΣαδ) ≤ L(z) − ηΣαΔ_e + o(η)"),
    Claim("19", "004 Prop 4.16", "usefulness principle", "dL_GT/dp_e < 0 for edges with ΔL > τ"),
    Claim("20", "004 Lemma 6.7", "KL identity of the utility",
          "E_{y~P} ΔL = KL(P‖p_z) − KL(P‖p_{z+}) exactly"),
    Claim("21", "004 Prop 6.11", "no-interference additivity under orthogonality",
          "ΔL(S) − Σ_e ΔL(e) ≈ 0"),
    Claim("22", "004 §6.3.3", "chain bound", "Δ(Π) ≥ Σ_i Δ(φ_i) − C·cross terms"),
    Claim("23", "004 Prop 6.6, Cor A.2", "idempotent round trips", "‖P² − P‖ = 0; no further gain"),
    Claim("24", "004 Props 2.9, 3.11, 4.14", "EGT is a conjugated LGT",
          "same logits, utilities and L_GT"),
    Claim("25", "004 Lemma 2.11, Cor 2.13", "blocks are identifiable",
          "LS block error ∝ sqrt(d_h d_g / N)"),
    Claim("26", "004 Props 2.14, 2.15, 4.3, 4.11; Cor 2.17", "parameter and FLOP scaling",
          "linear in |Δ|; EGT and LGT counts equal"),
    Claim("27", "004 Props 3.8, 4.9", "hard-routing limits",
          "one-hot as β → ∞, uniform over ties as τ → ∞"),
    Claim("28", "004 Prop 6.10", "Gibbs optimum of the entropy-regularised routing",
          "α* = softmax((ΔL − τ_e)/τ)"),
    Claim("000-S", "000 §5.6, Prop 5.16", "graded transformers are more sample-efficient",
          "area under the learning curve lower with aligned grades"),
    Claim("000-R", "000 Props 5.12, 6.13", "graded transformers are more robust",
          "smaller output change under noise on low-grade features"),
    Claim("000-I", "000 §5.6", "grades are interpretable",
          "learned grades order features by their true importance"),
)}


@dataclass
class Finding:
    """The measured answer to one claim: one row of the report.

    ``estimate`` is the quantity named in ``quantity`` (e.g. a paired difference of test losses,
    a ratio of Jacobian norm to bound), ``low``/``high`` its 95% interval (for a mean over
    replicates the hull of the percentile bootstrap and the t interval, :func:`mean_interval`;
    equal to the estimate for exact checks and bounds), ``seeds`` the number of independent
    replicates behind it.
    """

    claim: str
    experiment: str
    quantity: str
    control: str
    seeds: int
    estimate: float
    low: float
    high: float
    verdict: Verdict
    detail: str = ""
    figures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.claim not in CLAIMS:
            raise ValueError(f"claim={self.claim!r} is not one of {sorted(CLAIMS)}")
        if self.verdict not in ("holds", "fails", "inconclusive"):
            raise ValueError(f"verdict={self.verdict!r}; expected holds, fails or inconclusive")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Finding:
        """The finding :meth:`as_dict` wrote (``None`` read back from JSON as NaN)."""
        data = dict(data)
        for key in ("estimate", "low", "high"):
            data[key] = float("nan") if data.get(key) is None else float(data[key])
        return cls(**data)


@dataclass(frozen=True)
class Context:
    """What an experiment is given: where to write (its own folder), how big to run, how many
    seeds (the study's default for the mode unless ``seeds_given``: the user's ``--seeds``),
    and the first seed."""

    out: Path
    quick: bool
    seeds: int
    base_seed: int = 0
    seeds_given: bool = False

    def path(self, name: str) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out / name


class Experiment(Protocol):
    """One experiment of the study (E1…E9)."""

    name: str
    title: str
    claims: tuple[str, ...]

    def run(self, ctx: Context) -> list[Finding]: ...


class JobExperiment(Experiment, Protocol):
    """An experiment split into independent jobs, which the runner spreads over its workers and
    stores one by one (a job already stored is not rerun).

    Jobs come in ``stages``: :meth:`plan` returns the jobs of ``stage`` (JSON-able dicts, each
    with a unique string ``"key"``) given the results of every earlier stage (a dict key →
    result); :meth:`run_job` runs one job and returns a JSON-able result; :meth:`summarise`
    turns all results into findings. ``run(ctx)`` does the same in one process.
    """

    stages: int

    def plan(self, ctx: Context, stage: int, previous: dict[str, dict]) -> list[dict]: ...

    def run_job(self, ctx: Context, job: dict) -> dict: ...

    def summarise(self, ctx: Context, results: dict[str, dict]) -> list[Finding]: ...


def run_jobs_inline(experiment: JobExperiment, ctx: Context) -> list[Finding]:
    """``experiment.run(ctx)`` for a :class:`JobExperiment`: every stage's jobs in turn, here."""
    results: dict[str, dict] = {}
    for stage in range(experiment.stages):
        for job in experiment.plan(ctx, stage, dict(results)):
            results[job["key"]] = experiment.run_job(ctx, job)
    return experiment.summarise(ctx, results)


RULE = (
    "Each finding is a mean over independent replicates (seeds, draws or instances) of the "
    "quantity its row names. Its 95% interval is the hull (union) of the percentile bootstrap "
    "interval (10,000 resamples of the replicates; paired differences resample the per-seed "
    "differences; values that share a seed or a random draw, such as a seed's layers, tools or "
    "tasks, are resampled together as one replicate) and the Student t interval "
    "mean ± t₀.₉₇₅,ₖ₋₁·s/√k over the k replicates (a shared seed's or draw's value is its mean, "
    "size-weighted where such groups differ in size). The percentile interval alone is too "
    "narrow for few replicates (about 0.63 times the t interval's width at k = 5; Efron & "
    "Tibshirani 1993, ch. 13; Hesterberg 2015, on its narrowness bias), and the t interval alone "
    "drops the bootstrap's asymmetry. A claim **holds** when "
    "the whole interval lies on the side its prediction names (beyond the stated margin, 0 "
    "unless given), **fails** when the whole interval lies on the other side (for a predicted "
    "effect, also when it lies inside ±margin), and is **inconclusive** otherwise. Exact checks "
    "(a bound or identity verified on every instance) hold or fail outright, whatever the "
    "descriptive bootstrap interval of their fraction; a bound compared "
    "with estimated (lower-bound) constants holds when every instance lies within it and is "
    "inconclusive otherwise. Families of paired "
    "comparisons also carry two-sided paired t-test p-values, Holm-corrected at level 0.05 "
    "within the family."
)


def bootstrap_interval(values, *, n_boot: int = 10_000, level: float = 0.95,
                       seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile bootstrap interval."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    if x.size == 1:
        return float(x[0]), float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return float(x.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


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
    x = np.asarray(values, dtype=np.float64).ravel()
    labels = list(clusters)
    if x.size == 0:
        raise ValueError("cluster_bootstrap needs at least one value")
    if len(labels) != x.size:
        raise ValueError(f"cluster_bootstrap needs one cluster label per value, got {x.size} "
                         f"values and {len(labels)} labels")
    index: dict = {}
    member = np.array([index.setdefault(c, len(index)) for c in labels])
    k = len(index)
    sums = np.bincount(member, weights=x, minlength=k)
    sizes = np.bincount(member, minlength=k).astype(np.float64)
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


def paired_bootstrap(arm, control, **kwargs) -> tuple[float, float, float]:
    """Mean paired difference ``arm − control`` (same seeds, same data) with its interval."""
    a = np.asarray(arm, dtype=np.float64).ravel()
    c = np.asarray(control, dtype=np.float64).ravel()
    if a.shape != c.shape:
        raise ValueError(f"paired values need equal lengths, got {a.size} and {c.size}")
    return bootstrap_interval(a - c, **kwargs)


def t_quantile(p: float, nu: float) -> float:
    """The ``p`` quantile of Student's t with ``nu`` degrees of freedom: the root of
    F(t) = p, F(t) = 1 − ½·I_{ν/(ν+t²)}(ν/2, ½) for t ≥ 0 (and symmetric), by bisection."""
    if not 0.0 < p < 1.0 or nu <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and nu > 0, got p={p}, nu={nu}")
    if p < 0.5:
        return -t_quantile(1.0 - p, nu)
    if p == 0.5:
        return 0.0
    tail = 2.0 * (1.0 - p)  # the two-sided tail mass beyond the quantile

    def two_sided(t: float) -> float:
        return _incomplete_beta(nu / 2.0, 0.5, nu / (nu + t * t))

    low, high = 0.0, 1.0
    while two_sided(high) > tail:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if two_sided(mid) > tail:
            low = mid
        else:
            high = mid
        if high - low <= 1e-13 * high:
            break
    return (low + high) / 2.0


def t_interval(values, *, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and its Student t interval mean ± t_{(1+level)/2, n−1}·s/√n (s with
    n − 1 in the denominator); one value gives the point."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("t_interval needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return mean, mean, mean
    half = t_quantile((1.0 + level) / 2.0, x.size - 1.0) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def replicate_values(values, clusters=None) -> np.ndarray:
    """One value per replicate, whose mean is the finding's estimate: ``values`` themselves
    without ``clusters``; otherwise, for cluster c with sum S_c of m_c values,
    u_c = R + (S_c − R·m_c)/m̄, with R = ΣS/Σm (the mean over all values, the estimate) and m̄
    the mean cluster size. With equal sizes u_c is the cluster mean; with unequal sizes it is
    the linearised contribution of the cluster to the ratio estimate R, so that the t interval
    of the u_c is R ± t·s.e., s.e. the cluster-robust (ratio-estimator) standard error
    (Cochran 1977, *Sampling Techniques*, ch. 6). Clusters are taken in the order of their
    first value."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if clusters is None:
        return x
    labels = list(clusters)
    if len(labels) != x.size:
        raise ValueError(f"replicate_values needs one cluster label per value, got {x.size} "
                         f"values and {len(labels)} labels")
    index: dict = {}
    member = np.array([index.setdefault(c, len(index)) for c in labels], dtype=np.int64)
    sums = np.bincount(member, weights=x, minlength=len(index))
    sizes = np.bincount(member, minlength=len(index)).astype(np.float64)
    if np.all(sizes == sizes[0]):
        return sums / sizes
    ratio = float(sums.sum() / sizes.sum())
    return ratio + (sums - ratio * sizes) / sizes.mean()


@dataclass(frozen=True)
class Interval:
    """A finding's estimate and its verdict interval [low, high]: the hull of the percentile
    bootstrap interval ``bootstrap`` and the Student t interval ``t`` over ``replicates``
    replicates (see :data:`RULE`)."""

    estimate: float
    low: float
    high: float
    bootstrap: tuple[float, float]
    t: tuple[float, float]
    replicates: int

    def note(self, fmt: str = ".4f") -> str:
        """The two intervals behind [low, high], for a finding's detail."""
        b, t = self.bootstrap, self.t
        return (f"Interval: the hull of the percentile bootstrap [{b[0]:{fmt}}, {b[1]:{fmt}}] "
                f"and the t interval [{t[0]:{fmt}}, {t[1]:{fmt}}] ({self.replicates - 1} df).")


def mean_interval(values, clusters=None, *, n_boot: int = 10_000, level: float = 0.95,
                  seed: int = 0) -> Interval:
    """The study's interval of a mean over replicates (:data:`RULE`): the hull of the
    percentile bootstrap (:func:`bootstrap_interval`, or :func:`cluster_bootstrap` when
    ``clusters`` names each value's replicate) and the Student t interval
    (:func:`t_interval`) of the :func:`replicate_values`.

    The percentile bootstrap alone is too narrow for few replicates: it estimates the spread
    with divisor k rather than k − 1 and uses normal-like rather than t quantiles, so with
    k = 5 it is about 0.63 times as wide as the t interval (1.96·√(4/5) against
    t_{0.975,4} = 2.776) and covers the mean far less than 95% of the time (Efron &
    Tibshirani 1993, ch. 13; Hesterberg 2015's narrowness bias). The t interval alone would
    drop the bootstrap's asymmetry for skewed replicates; the hull keeps both."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if clusters is None:
        est, b_low, b_high = bootstrap_interval(x, n_boot=n_boot, level=level, seed=seed)
    else:
        est, b_low, b_high = cluster_bootstrap(x, clusters, n_boot=n_boot, level=level,
                                               seed=seed)
    u = replicate_values(x, clusters)
    _, t_low, t_high = t_interval(u, level=level)
    return Interval(est, min(b_low, t_low), max(b_high, t_high), (b_low, b_high),
                    (t_low, t_high), int(u.size))


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) by its continued fraction (Lentz's
    method, Numerical Recipes §6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side only
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * h


def paired_t_p_value(differences) -> float:
    """Two-sided p-value of the paired t-test of "the mean difference is 0": t = mean/(s/√n)
    with n − 1 degrees of freedom, p = I_{ν/(ν+t²)}(ν/2, 1/2). Needs at least two
    differences; a constant sample gives 1.0 at 0 and 0.0 elsewhere."""
    d = np.asarray(differences, dtype=np.float64).ravel()
    if d.size < 2:
        raise ValueError(f"paired_t_p_value needs at least two differences, got {d.size}")
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return 1.0 if float(d.mean()) == 0.0 else 0.0
    t = float(d.mean()) / (sd / math.sqrt(d.size))
    nu = d.size - 1.0
    return float(_incomplete_beta(nu / 2.0, 0.5, nu / (nu + t * t)))


def holm(p_values, level: float = 0.05) -> list[bool]:
    """Holm's step-down rejections for a family of p-values (True = rejected at ``level``).

    A non-finite p-value (a comparison that could not be tested, e.g. a diverged run) counts
    as 1: it is never rejected and still counts in the family's size."""
    p = np.asarray(p_values, dtype=np.float64).ravel()
    p = np.where(np.isfinite(p), p, 1.0)
    order = np.argsort(p)
    reject = [False] * p.size
    for rank, i in enumerate(order):
        if p[i] > level / (p.size - rank):
            break
        reject[int(i)] = True
    return reject


def verdict(low: float, high: float, *, predicted: Literal["positive", "negative"],
            margin: float = 0.0) -> Verdict:
    """The study's rule: a claim holds when the whole interval lies on the predicted side of
    ``margin``, fails when it lies wholly on the other side (or inside ±margin for a predicted
    effect), and is inconclusive otherwise."""
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        return "inconclusive"
    if predicted == "positive":
        if low > margin:
            return "holds"
        return "fails" if high <= margin else "inconclusive"
    if high < -margin:
        return "holds"
    return "fails" if low >= -margin else "inconclusive"
