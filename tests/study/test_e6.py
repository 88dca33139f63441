"""E6 (claims 6, 7): the experiment runs in quick mode; its Jacobians and grade gradients are
checked against closed forms and finite differences, and Thm 4.6's score is measured with the
grading applied once (qᵀMk) and twice (qᵀM²k, the library's queries_keys variant)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.autograd.functional import jacobian
from torch.nn import functional as F

from graded.attention.graded import GradedMultiheadAttention
from graded.grading import ExponentialGrading
from graded.study.core import Context
from graded.study.experiments._e_common import (
    IGNORE,
    equivalence_verdict,
    lag_copy_batch,
    tiny_lm,
)
from graded.study.experiments.e6_gradients import (
    ONCE_KEYS,
    TWICE_KEYS,
    GradientsExperiment,
    _score_gradient_norms,
    _set_grading,
    grade_gradient_norm,
    jacobian_bound_ratios,
)
from graded.transformer.graded import GradedFeatures


@pytest.mark.slow  # the quick experiment (3 to 4 s on 2 cores): `pytest -m slow`
def test_gradients_experiment_quick_gives_two_claim_6_findings_and_claim_7(
    tmp_path, check_findings, monkeypatch
):
    """Claim 6 twice: Thm 4.6 with the grading applied once among every component (the summary
    row), then the twice-graded queries_keys score against λ^(2q_max)·C; then claim 7. Each
    claim-6 estimate is the largest of its own keys over the instances."""
    import graded.study.experiments.e6_gradients as e6

    rows = []

    def recording(gen):
        rows.append(jacobian_bound_ratios(gen))
        return rows[-1]

    monkeypatch.setattr(e6, "jacobian_bound_ratios", recording)
    experiment = GradientsExperiment()
    findings = experiment.run(Context(out=tmp_path, quick=True, seeds=1, seeds_given=True))
    check_findings(findings, SimpleNamespace(name=experiment.name, claims=("6", "6", "7")),
                   tmp_path)
    once, twice = findings[0], findings[1]
    assert once.seeds == twice.seeds == len(rows) == 30
    assert once.estimate == max(r[k] for r in rows for k in ONCE_KEYS)
    assert twice.estimate == max(r[k] for r in rows for k in TWICE_KEYS)
    assert "qᵀ M² k" in twice.quantity and "λ^(2q_max)·C" in twice.control
    assert "applied once" in once.detail and "second finding" in once.detail
    assert "does not bound the twice-graded score" in twice.detail
    assert once.verdict == twice.verdict == "holds"
    assert max(r["queries_keys_once_bound"] for r in rows) > 1  # the once-constant is exceeded


def _np_scales(q: np.ndarray, lam: float) -> np.ndarray:
    return lam ** q


@pytest.mark.parametrize("variant,power", [("scores", 1), ("queries_keys", 2)])
def test_score_gradient_norms_match_the_closed_form_gradient_of_q_m_power_k(variant, power):
    """s = qᵀ M^p k has ∇_q s = M^p k, ∇_k s = M^p q (p = 1 for scores, 2 for queries_keys):
    the Euclidean norm of both together and the larger of the two, in NumPy."""
    gen = torch.Generator().manual_seed(4)
    grades = torch.rand(6, generator=gen, dtype=torch.float64) * 2
    grading = ExponentialGrading(6, grades, base=2.5, dtype=torch.float64)
    qk = torch.randn(12, generator=gen, dtype=torch.float64)
    q, k = qk[:6].numpy(), qk[6:].numpy()
    m = _np_scales(grades.numpy(), 2.5) ** power
    euclid, larger = _score_gradient_norms(variant, grading, qk)
    assert euclid == pytest.approx(math.sqrt(np.sum((m * k) ** 2) + np.sum((m * q) ** 2)),
                                   rel=1e-12)
    assert larger == pytest.approx(max(np.linalg.norm(m * k), np.linalg.norm(m * q)),
                                   rel=1e-12)


def test_queries_keys_score_is_the_attention_modules_own_score():
    """The twice-graded score is what the library's queries_keys attention computes: its
    logits, read from the attention weights of one query over two keys, against qᵀM²k/√d."""
    torch.manual_seed(0)
    grades = torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=torch.float64)
    attn = GradedMultiheadAttention(4, 1, grading="exponential", grades=grades, base=3.0,
                                    variant="queries_keys", batch_first=True,
                                    bias=False).double()
    x = torch.randn(1, 3, 4, dtype=torch.float64)
    _, weights = attn(x[:, :1], x[:, 1:], x[:, 1:], need_weights=True)
    q = x[0, 0] @ attn.in_proj_weight[:4].T
    keys = x[0, 1:] @ attn.in_proj_weight[4:8].T
    m2 = torch.diag(3.0 ** (2 * grades))
    logits = torch.stack([q @ m2 @ kj for kj in keys]) / 2.0
    assert torch.allclose(weights[0, 0], torch.softmax(logits, 0), atol=1e-12)


@pytest.mark.parametrize("variant,power", [("scores", 1), ("queries_keys", 2)])
def test_thm_4_6_constant_is_attained_by_q_and_k_on_the_top_grade_axis(variant, power):
    """With q and k of norm C along the coordinate of grade q_max, ‖∇_q s‖ = ‖M^p k‖ =
    λ^(p q_max)·C exactly: the printed-norm constant λ^(p q_max)·C is tight."""
    grades = torch.tensor([0.0, 0.7, 1.5], dtype=torch.float64)
    grading = ExponentialGrading(3, grades, base=2.0, dtype=torch.float64)
    c = 1.7
    qk = torch.tensor([0.0, 0.0, c, 0.0, 0.0, c], dtype=torch.float64)
    euclid, larger = _score_gradient_norms(variant, grading, qk)
    assert larger / (2.0 ** (power * 1.5) * c) == pytest.approx(1.0, rel=1e-14)
    assert euclid / (math.sqrt(2) * 2.0 ** (power * 1.5) * c) == pytest.approx(1.0, rel=1e-14)


def test_grading_jacobian_ratio_is_exactly_one_lemma_4_3():
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        ratios = jacobian_bound_ratios(gen)
        assert ratios["lemma_4_3_grading"] == pytest.approx(1.0, abs=1e-12)
        assert ratios["thm_4_6_score"] == pytest.approx(ratios["score_printed"] / math.sqrt(2))


def test_normalized_input_jacobian_matches_the_closed_form():
    q = torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=torch.float64)
    grading = ExponentialGrading(4, q, base=3.0, dtype=torch.float64)
    x = torch.tensor([0.7, -1.2, 0.4, 0.9], dtype=torch.float64)
    m = torch.diag(3.0 ** q)
    u = m @ x
    y = u / u.norm()
    closed = (torch.eye(4, dtype=torch.float64) - torch.outer(y, y)) @ m / u.norm()
    auto = jacobian(GradedFeatures(grading, normalize=True), x)
    assert torch.allclose(auto, closed, atol=1e-12)


def test_grade_gradient_norm_matches_central_finite_differences():
    model = tiny_lm(0, grading="exponential", learnable_grades=True, grade_init="zeros",
                    n_layers=1).double()
    ids, targets = lag_copy_batch(4, 8, 16, 2, torch.Generator().manual_seed(1))
    auto = grade_gradient_norm(model, ids, targets, 2.0, 1.0)
    params = _set_grading(model, 2.0, 1.0)

    def loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(model(ids).flatten(0, 1), targets.flatten(),
                                         ignore_index=IGNORE))

    # central differences; forward ones at q = 0, where grades cannot go below 0
    h, total, center = 1e-6, 0.0, loss()
    for p in params:
        flat = p.data.view(-1)
        for i in range(flat.numel()):
            keep = float(flat[i])
            flat[i] = keep + h
            up = loss()
            if keep - h >= 0:
                flat[i] = keep - h
                slope = (up - loss()) / (2 * h)
            else:
                slope = (up - center) / h
            flat[i] = keep
            total += slope**2
    assert auto == pytest.approx(math.sqrt(total), rel=1e-4)


def test_equivalence_verdict_reads_an_interval_against_a_band():
    assert equivalence_verdict(0.9, 1.1, 0.8, 1.25) == "holds"
    assert equivalence_verdict(1.3, 1.5, 0.8, 1.25) == "fails"
    assert equivalence_verdict(1.0, 1.5, 0.8, 1.25) == "inconclusive"
    assert equivalence_verdict(float("nan"), 1.0, 0.8, 1.25) == "inconclusive"


@pytest.mark.parametrize("nan_at", [0, 3])
@pytest.mark.parametrize("key,which", [("lemma_4_3_grading", 0), ("thm_4_6_queries_keys", 1)])
def test_a_ratio_that_is_nan_makes_its_claim_6_finding_inconclusive_wherever_it_falls(
    nan_at, key, which, tmp_path, monkeypatch
):
    """Python's ``max`` keeps a NaN in first place and drops it elsewhere: a NaN ratio made
    claim 6 "fails" or vanished from its worst ratio, by its position. A NaN among one
    finding's keys leaves the other finding as it was."""
    import graded.study.experiments.e6_gradients as e6

    calls = []

    def ratios(gen):
        out = jacobian_bound_ratios(gen)
        if len(calls) == nan_at:
            out[key] = math.nan
        calls.append(1)
        return out

    monkeypatch.setattr(e6, "jacobian_bound_ratios", ratios)
    findings = GradientsExperiment()._jacobians(Context(out=tmp_path, quick=True, seeds=1,
                                                        seeds_given=True))
    hit, other = findings[which], findings[1 - which]
    assert hit.verdict == "inconclusive" and math.isnan(hit.estimate)
    assert other.verdict == "holds" and math.isfinite(other.estimate)
