"""The graded losses with a grading module as their grades, against sums written out with the
module's weights computed here from the grades by hand.

000 Def 5.37 (iv) weights the linearly graded loss by f(q_k) and Def 7.1 the exponentially
graded loss by λ^{q_k}; 000 §3.3's graded MSE, norm loss, cross-entropy and max-graded loss take
the grading's scales as their q_i (``graded.losses`` module doc). ``tests/test_losses.py`` checks
each loss against a loop with tensor weights and the worked examples 5.38 / 7.2 with f = q + 1
and λ = 2; here every f of SPEC C5 and a base λ other than 2, with m(q) from ``math``.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.grading import ExponentialGrading, LinearGrading
from graded.losses import (
    exponentially_graded_loss,
    graded_cross_entropy,
    graded_mse,
    graded_norm_loss,
    linearly_graded_loss,
    max_graded_loss,
)

F64 = torch.float64
SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)
F_OF = {"shift": lambda q: q + 1.0, "abs_shift": lambda q: abs(q) + 1.0,
        "softplus": lambda q: math.log1p(math.exp(q)), "identity": lambda q: q}


def grades_for(f: str, raw: list[float]) -> list[float]:
    """Grades in f's domain: q > 0 for the identity, q > −1 for q + 1."""
    if f == "identity":
        return [abs(q) + 0.1 for q in raw]
    if f == "shift":
        return [abs(q) for q in raw]
    return raw


@SETTINGS
@given(f=st.sampled_from(sorted(F_OF)),
       raw=st.lists(st.floats(-2.0, 2.0), min_size=1, max_size=4), seed=st.integers(0, 500))
def test_linear_grading_weights_are_f_of_q_in_every_loss_def_5_37(f, raw, seed):
    q = grades_for(f, raw)
    w = [F_OF[f](v) for v in q]
    grading = LinearGrading(len(q), q, f=f, dtype=F64)
    gen = torch.Generator().manual_seed(seed)
    pred = torch.randn(3, len(q), generator=gen, dtype=F64)
    target = torch.randn(3, len(q), generator=gen, dtype=F64)
    p, t = pred.tolist(), target.tolist()
    rows = range(3)
    cols = range(len(q))
    # Eq. 63, base loss |·| and (·)², summed
    l1 = sum(w[k] * abs(p[i][k] - t[i][k]) for i in rows for k in cols)
    assert float(linearly_graded_loss(pred, target, grading, base_loss="l1", reduction="sum")
                 ) == pytest.approx(l1, rel=1e-12)
    # Eq. 2 (1/n per vector, then the mean over vectors), Eq. 3, the max-graded loss
    mse = sum(sum(w[k] * (t[i][k] - p[i][k]) ** 2 for k in cols) / len(q) for i in rows) / 3
    norm = sum(sum(w[k] * (t[i][k] - p[i][k]) ** 2 for k in cols) for i in rows)
    mx = sum(max(math.sqrt(w[k]) * abs(t[i][k] - p[i][k]) for k in cols) ** 2 for i in rows)
    assert float(graded_mse(pred, target, grading)) == pytest.approx(mse, rel=1e-12)
    assert float(graded_norm_loss(pred, target, grading, reduction="sum")
                 ) == pytest.approx(norm, rel=1e-12)
    assert float(max_graded_loss(pred, target, grading, reduction="sum")
                 ) == pytest.approx(mx, rel=1e-12)
    # graded cross-entropy −Σ_i q_i y_i log ŷ_i, ŷ = softmax(pred), y = softmax(target)
    y = torch.softmax(target, -1).tolist()
    logp = torch.log_softmax(pred, -1).tolist()
    ce = sum(-sum(w[k] * y[i][k] * logp[i][k] for k in cols) for i in rows)
    assert float(graded_cross_entropy(pred, torch.softmax(target, -1), grading, reduction="sum")
                 ) == pytest.approx(ce, rel=1e-12)


@SETTINGS
@given(base=st.floats(1.05, 6.0), q=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=4),
       seed=st.integers(0, 500))
def test_exponential_grading_weights_are_lambda_to_the_q_def_7_1(base, q, seed):
    """Def 7.1: L = Σ_i Σ_k λ^{q_k} ℓ(ŷ_ik, y_ik), any λ > 1, squared-error base loss."""
    grading = ExponentialGrading(len(q), q, base=base, dtype=F64)
    gen = torch.Generator().manual_seed(seed)
    pred = torch.randn(2, len(q), generator=gen, dtype=F64)
    target = torch.randn(2, len(q), generator=gen, dtype=F64)
    p, t = pred.tolist(), target.tolist()
    want = sum(base ** q[k] * (p[i][k] - t[i][k]) ** 2 for i in range(2) for k in range(len(q)))
    got = exponentially_graded_loss(pred, target, grading, base_loss="mse", reduction="sum")
    assert float(got) == pytest.approx(want, rel=1e-11)
