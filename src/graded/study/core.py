"""The claims study's vocabulary: claims, findings, experiments and the rule behind verdicts.

Every row of the report is a :class:`Finding` for one :class:`Claim` of :data:`CLAIMS` (the 28
testable claims of ``notes/seeds_001_004.md`` Part I plus 000's sample efficiency, robustness and
interpretability). An :class:`Experiment` measures one or more claims; it receives a
:class:`Context` and returns findings. Verdicts follow :func:`verdict`, whose rule the report
states before the numbers (:data:`RULE`); the intervals it reads come from
:mod:`graded.study.statistics`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from graded._io import atomic_write_text
from graded.checks import check_int

__all__ = [
    "CLAIMS",
    "RULE",
    "Claim",
    "Context",
    "Experiment",
    "Finding",
    "JobExperiment",
    "Verdict",
    "atomic_write_text",
    "run_jobs_inline",
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
    replicates the hull of the percentile bootstrap and the t interval,
    :func:`graded.study.statistics.mean_interval`; equal to the estimate for exact checks and
    bounds), ``seeds`` the number of independent replicates behind it.
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
        """The finding :meth:`as_dict` wrote (``None`` read back from JSON as NaN). A field of
        another type (a stored file edited by hand) is refused by name (``TypeError``), not
        left for the report to fail on."""
        if not isinstance(data, dict):
            raise TypeError(f"a finding is {data!r}; expected a JSON object of its fields")
        data = dict(data)
        for key in ("estimate", "low", "high"):
            try:
                data[key] = float("nan") if data.get(key) is None else float(data[key])
            except (TypeError, ValueError):
                raise TypeError(f"{key} is {data[key]!r}; expected a number") from None
        texts = [k for k in ("claim", "experiment", "quantity", "control", "verdict", "detail")
                 if k in data and not isinstance(data[k], str)]
        if texts:
            raise TypeError(f"{texts[0]} is {data[texts[0]]!r}; expected a string")
        if "seeds" in data:
            data["seeds"] = check_int("seeds", data["seeds"], minimum=0)
        figures = data.get("figures", [])
        if not (isinstance(figures, (list, tuple)) and all(isinstance(g, str) for g in figures)):
            raise TypeError(f"figures is {figures!r}; expected a list of file names")
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
    turns all results into findings. ``run(ctx)`` does the same in one process. An optional
    ``result_fields`` names the fields every result holds: a stored job that lacks one (a file
    edited by hand) is refused by name rather than reused.
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
    "drops the bootstrap's asymmetry. A mean accuracy over a known number of distinct items "
    "(claims 14 and 15) also takes into the hull the exact binomial (Clopper–Pearson) interval "
    "of its successes over those items (items that several runs of one replicate answer "
    "count once): replicates without spread, every run right on every item, would otherwise "
    "make the accuracy certain. The interval is cut to the range its quantity can take "
    "(an accuracy to [0, 1], a correlation to [−1, 1]). A claim **holds** when "
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


def verdict(low: float, high: float, *, predicted: Literal["positive", "negative"],
            margin: float = 0.0) -> Verdict:
    """The study's rule: a claim holds when the whole interval lies on the predicted side of
    ``margin``, fails when it lies wholly on the other side (or inside ±margin for a predicted
    effect), and is inconclusive otherwise. ``margin`` is a finite width ≥ 0."""
    if predicted not in ("positive", "negative"):
        raise ValueError(f"predicted={predicted!r}; expected 'positive' or 'negative'")
    if not (math.isfinite(margin) and margin >= 0.0):
        raise ValueError(f"margin={margin!r}; expected a finite width >= 0 (the band ±margin "
                         "around 0)")
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        return "inconclusive"
    if predicted == "positive":
        if low > margin:
            return "holds"
        return "fails" if high <= margin else "inconclusive"
    if high < -margin:
        return "holds"
    return "fails" if low >= -margin else "inconclusive"
