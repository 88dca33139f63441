"""E4/E5 (claims 4, 5): the experiment runs in quick mode; its slope helper and its paired head
models are checked against independent constructions."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from graded.analysis.capture import capture_attention
from graded.analysis.positional import positional_bias_sweep
from graded.study.core import Context
from graded.study.experiments._e_common import lag_copy_batch, least_squares_slope, tiny_lm
from graded.study.experiments.e45_heads_positions import (
    PositionsHeadsExperiment,
    _head_pair,
    _scale_matched_control,
    _score_size_ratios,
    matched_control_sweep,
    scale_matched_grades,
)
from graded.transformer.graded import head_gradings


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_positions_heads_experiment_quick_gives_findings_for_claims_4_and_5(
    tmp_path, check_findings
):
    """Claim 4, then claim 5 twice: per-head − shared grades (the summary row) and per-head −
    the scale-matched control."""
    experiment = PositionsHeadsExperiment()
    findings = experiment.run(Context(out=tmp_path, quick=True, seeds=1))
    check_findings(findings, SimpleNamespace(name=experiment.name, claims=("4", "5", "5")),
                   tmp_path)
    shared, control = findings[1], findings[2]
    assert "− shared grades" in shared.quantity
    assert "− per-head scale-matched flat grades" in control.quantity
    assert "RMS of its per-head scales" in control.control
    assert "per-head − control after training" in control.detail
    assert control.figures == shared.figures == ["e5_head_diversity.png"]
    assert control.seeds == shared.seeds == 3  # the quick default: 3 models


def test_least_squares_slope_matches_numpy_polyfit():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=9), rng.normal(size=9)
    assert least_squares_slope(x, y) == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-12)
    with pytest.raises(ValueError, match="distinct x"):
        least_squares_slope([1.0, 1.0], [0.0, 2.0])


def test_head_pair_differs_only_in_grades_with_equal_mean_grade():
    shared, per_head = _head_pair(3, 0.25)
    a, b = shared.state_dict(), per_head.state_dict()
    for key, value in a.items():
        if not key.endswith("grades"):
            assert torch.equal(value, b[key]), key
    for gs, gp in zip(head_gradings(shared), head_gradings(per_head)):
        k = torch.arange(gs.dim, dtype=torch.float32)
        assert torch.allclose(gs.grades, 0.25 * k)
        assert gp.grades.shape == (4, gs.dim)
        # per-head slopes c_h evenly spaced in [0, 0.5]: mean slope equals the shared 0.25
        slopes = gp.grades[:, 1] - gp.grades[:, 0]
        assert torch.allclose(slopes, torch.tensor([0.0, 1 / 6, 1 / 3, 0.5]), atol=1e-6)
        assert torch.allclose(gp.grades.mean(0), gs.grades, atol=1e-6)


def _scales_by_hand(grading) -> torch.Tensor:
    """λ^q of a head grading from its grades and base, in float64."""
    return float(grading.base) ** grading.grades.detach().to(torch.float64)


def test_scale_matched_control_keeps_each_heads_scale_norm_with_flat_grades():
    """The control's head h has grades g_h at every k and the Euclidean norm of the per-head
    model's scales λ^(c_h k); its weights are the per-head model's."""
    shared, per_head = _head_pair(3, 2.0 / 7)
    control = _scale_matched_control(3, per_head)
    a, b = per_head.state_dict(), control.state_dict()
    for key, value in a.items():
        if not key.endswith("grades"):
            assert torch.equal(value, b[key]), key
    for gp, gc, gs in zip(head_gradings(per_head), head_gradings(control),
                          head_gradings(shared), strict=True):
        mp, mc, ms = _scales_by_hand(gp), _scales_by_hand(gc), _scales_by_hand(gs)
        assert gc.grades.shape == (4, 8)
        assert torch.equal(gc.grades, gc.grades[:, :1].expand(-1, 8))  # no dependence on k
        # per head, sqrt(Σ_k m²) by a loop over k, control against per-head
        for h in range(4):
            norm_p = math.sqrt(sum(float(mp[h, k]) ** 2 for k in range(8)))
            norm_c = math.sqrt(sum(float(mc[h, k]) ** 2 for k in range(8)))
            assert norm_c == pytest.approx(norm_p, rel=1e-6)
        assert float(gc.grades[0, 0]) == 0.0  # head 0 is ungraded (c_0 = 0): M = I in both
        # the shared grades give every head one norm: they do not match heads 0 and 3
        assert not torch.allclose(ms.norm(dim=-1), mp.norm(dim=-1), rtol=0.1)
        # the module's own scales agree with the hand computation
        assert torch.allclose(gc.scales().double(), mc, rtol=1e-6)


def test_scale_matched_grades_solve_lambda_g_equals_the_rms_and_are_idempotent():
    grades = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 2.0], [0.5, 0.5, 3.0]],
                          dtype=torch.float64)
    flat = scale_matched_grades(grades, 3.0)
    for h in range(3):
        rms = math.sqrt(sum(3.0 ** (2 * float(q)) for q in grades[h]) / 3)
        assert float(flat[h, 0]) == pytest.approx(math.log(rms, 3.0), rel=1e-12)
    assert torch.equal(flat[:, 0:1].expand(-1, 3), flat)
    assert torch.allclose(scale_matched_grades(flat, 3.0), flat, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="per-head grades"):
        scale_matched_grades(grades[0], 3.0)
    with pytest.raises(ValueError, match="base lambda > 1"):
        scale_matched_grades(grades, 1.0)


def test_scale_matched_control_gives_each_head_the_per_head_expected_score_size():
    """For Gaussian queries and keys (uncorrelated coordinates of equal variance), the mean
    squared Frobenius norm of Q diag(m_h) Kᵀ, control against per-head, agrees per head."""
    _, per_head = _head_pair(0, 2.0 / 7)
    control = _scale_matched_control(0, per_head)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(400, 16, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(400, 16, 8, generator=gen, dtype=torch.float64)
    for gp, gc in zip(head_gradings(per_head), head_gradings(control), strict=True):
        for h in range(4):
            size = [float(torch.einsum("ntd,d,nsd->nts", q, m[h], k).pow(2).sum((1, 2)).mean())
                    for m in (_scales_by_hand(gp), _scales_by_hand(gc))]
            assert size[1] == pytest.approx(size[0], rel=0.05), h


def test_score_size_ratios_equal_the_scores_recomputed_from_each_models_grading():
    """The ratios the finding reports, against scores recomputed per head by a loop from the
    captured queries and keys and λ^q of each model's grades, causal pairs only."""
    _, per_head = _head_pair(1, 2.0 / 7)
    control = _scale_matched_control(1, per_head)
    ids, _ = lag_copy_batch(3, 10, 16, 2, torch.Generator().manual_seed(2))
    ratios = _score_size_ratios(per_head, control, ids)
    with torch.no_grad(), capture_attention(per_head.eval()) as calls:
        per_head(ids)
    expected = []
    for call, gp, gc in zip(calls, head_gradings(per_head), head_gradings(control),
                            strict=True):
        for h in range(4):
            norms = []
            for m in (_scales_by_hand(gp)[h], _scales_by_hand(gc)[h]):
                total = 0.0
                for b in range(3):
                    for t in range(10):
                        for s in range(t + 1):
                            total += float((call.q[b, h, t].double() * m
                                            * call.k[b, h, s].double()).sum()) ** 2
                norms.append(math.sqrt(total))
            expected.append(norms[1] / norms[0])
    assert ratios == pytest.approx(expected, rel=1e-4)
    assert ratios[0] == pytest.approx(1.0, abs=1e-6)  # head 0: M = I in both


def test_matched_control_equals_a_model_with_rescaled_position_table():
    model = tiny_lm(0, grading="exponential", grading_base=2.0)
    ids, _ = lag_copy_batch(4, 12, 16, 2, torch.Generator().manual_seed(0))
    control = matched_control_sweep(model, ids, [0.0, 0.2], k=3, base=2.0)
    graded = positional_bias_sweep(model, ids, [0.0], k=3)["layers"]
    for name in graded:  # α = 0: factor 1, the model itself
        assert control[name][0] == pytest.approx(graded[name][0], abs=1e-12)
    # α = 0.2: the same as scaling the learned position table by sqrt(mean_t 2^(−0.4 t))
    t = torch.arange(12, dtype=torch.float64)
    factor = float(torch.sqrt(torch.mean(2.0 ** (-0.4 * t))))
    scaled = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in scaled.named_parameters():
            if "positions" in name:
                p.mul_(factor)
    rescaled = positional_bias_sweep(scaled, ids, [0.0], k=3)["layers"]
    for name in graded:
        assert control[name][1] == pytest.approx(rescaled[name][0], abs=1e-6)


class _OneAndFourHeads(torch.nn.Module):
    """Embedding, then a self-attention layer of one head and one of four: the JS mean over
    layers has one layer without a pair of heads."""

    def __init__(self) -> None:
        super().__init__()
        from graded.attention.multihead import MultiheadAttention

        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(16, 8)
        self.one = MultiheadAttention(8, 1, batch_first=True)
        self.four = MultiheadAttention(8, 4, batch_first=True)

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.one(x, x, x, need_weights=False)[0]
        return x + self.four(x, x, x, need_weights=False)[0]


def _kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p ‖ q) in nats, 0·log 0 = 0."""
    keep = p > 0
    return float((p[keep] * (p[keep] / q[keep]).log()).sum())


def _naive_mean_js(weights: torch.Tensor) -> float:
    """Mean JS divergence (nats) over ordered pairs of distinct heads, batch items and query
    rows of (B, H, Tq, Tk) attention weights, by loops."""
    w = weights.to(torch.float64)
    b, h, tq, _ = w.shape
    total, count = 0.0, 0
    for i in range(h):
        for j in range(h):
            if i == j:
                continue
            for n in range(b):
                for t in range(tq):
                    p, q = w[n, i, t], w[n, j, t]
                    m = (p + q) / 2
                    total += 0.5 * _kl(p, m) + 0.5 * _kl(q, m)
                    count += 1
    return total / count


def test_head_js_averages_over_the_layers_with_a_pair_of_heads():
    """A one-head layer's mean_js is NaN (no pair): the layer mean was NaN; it is now the
    four-head layer's mean JS, recomputed here by loops."""
    from graded.analysis.capture import capture_attention
    from graded.study.experiments.e45_heads_positions import _diversity

    model = _OneAndFourHeads().eval()
    ids = torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture_attention(model) as calls:
        model(ids)
    assert [c.weights.shape[1] for c in calls] == [1, 4]
    _, js = _diversity(model, ids)
    assert js == pytest.approx(_naive_mean_js(calls[1].weights), rel=1e-9)


def test_head_js_of_a_model_without_a_pair_of_heads_is_nan_and_said_so():
    from graded.study.experiments.e45_heads_positions import _diversity, _mean_js_text

    model = tiny_lm(0, n_heads=1)
    ids, _ = lag_copy_batch(2, 8, 16, 2, torch.Generator().manual_seed(0))
    rank, js = _diversity(model, ids)
    assert np.isfinite(rank) and np.isnan(js)
    assert _mean_js_text([js, js]) == "none (no layer with two heads)"
    assert _mean_js_text([0.25, js, 0.5]) == "+0.3750 (over 2 of 3 seeds)"
