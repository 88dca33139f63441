import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from graded.grading import ExponentialGrading, LinearGrading
from graded.losses import (
    ExponentiallyGradedLoss,
    GradedCrossEntropyLoss,
    GradedMSELoss,
    GradedNormLoss,
    HomogeneousLoss,
    LinearlyGradedLoss,
    MaxGradedLoss,
    exponentially_graded_loss,
    graded_cross_entropy,
    graded_mse,
    graded_norm_loss,
    homogeneous_loss,
    linearly_graded_loss,
    max_graded_loss,
)

F64 = torch.float64
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


def bce(p, y):
    return -y * math.log(p) - (1 - y) * math.log(1 - p) if 0 < p < 1 else 0.0


# -- worked examples of the papers -------------------------------------------------------------
def _degree_example():
    # 000 Ex. 5.38 / 7.2: m = 2 tokens, d = 4 (degrees 0..3); y_{1,3} = y_{2,3} = 1 with
    # predictions 0.8 and 0.9; the other coordinates are predicted exactly (zero loss).
    pred = torch.tensor([[1.0, 1.0, 1.0, 0.8], [1.0, 1.0, 1.0, 0.9]], dtype=F64)
    target = torch.ones(2, 4, dtype=F64)
    return pred, target


def test_example_5_38_linearly_graded_cross_entropy():
    pred, target = _degree_example()
    grading = LinearGrading(4, [0.0, 0.5, 1.0, 2.0], f="shift", dtype=F64)
    torch.testing.assert_close(grading.scales(), torch.tensor([1.0, 1.5, 2.0, 3.0], dtype=F64))
    loss = linearly_graded_loss(pred, target, grading, base_loss="bce", reduction="sum")
    expected = 3 * (bce(0.8, 1.0) + bce(0.9, 1.0))
    assert math.isclose(float(loss), expected, rel_tol=1e-12)
    assert math.isclose(expected, 0.985509, rel_tol=1e-5)


def test_example_7_2_exponentially_graded_loss_with_lambda_2():
    pred, target = _degree_example()
    grading = ExponentialGrading(4, [0.0, 0.5, 1.0, 2.0], base=2.0, dtype=F64)
    torch.testing.assert_close(grading.scales(),
                               torch.tensor([1.0, math.sqrt(2), 2.0, 4.0], dtype=F64))
    loss = exponentially_graded_loss(pred, target, grading, base_loss="bce", reduction="sum")
    expected = 4 * (bce(0.8, 1.0) + bce(0.9, 1.0))
    assert math.isclose(float(loss), expected, rel_tol=1e-12)
    same = exponentially_graded_loss(pred, target, torch.tensor([0.0, 0.5, 1.0, 2.0]), base=2.0,
                                     base_loss="bce", reduction="sum")
    assert math.isclose(float(same), expected, rel_tol=1e-12)
    # every term of Ex. 7.2 carries its weight 1, √2, 2, 4
    p = torch.full((1, 4), 0.7, dtype=F64)
    terms = exponentially_graded_loss(p, torch.ones(1, 4, dtype=F64), grading, base_loss="bce",
                                      reduction="none")
    torch.testing.assert_close(terms[0] / bce(0.7, 1.0),
                               torch.tensor([1.0, math.sqrt(2), 2.0, 4.0], dtype=F64))


def test_homogeneous_loss_example_on_v_2_3():
    # 000 §3.3: on V_(2,3), L_hom = (‖e_2‖⁴ + ‖e_3‖²)^{1/2}.
    e = torch.tensor([[2.0, 3.0]], dtype=F64)
    loss = homogeneous_loss(e, torch.zeros_like(e), torch.tensor([2.0, 3.0]), reduction="none")
    torch.testing.assert_close(loss, torch.tensor([math.sqrt(2.0**4 + 3.0**2)], dtype=F64))
    # with a two-dimensional grade-2 component: (‖(1, 2)‖⁴ + 3²)^{1/2} = (25 + 9)^{1/2}
    e = torch.tensor([[1.0, 3.0, 2.0]], dtype=F64)
    loss = homogeneous_loss(e, torch.zeros_like(e), torch.tensor([2.0, 3.0, 2.0]))
    assert math.isclose(float(loss), math.sqrt(34.0), rel_tol=1e-12)


# -- every loss equals a naive loop over coordinates -------------------------------------------
def naive(name, pred, target, q, reduction):
    rows = [[(p, t) for p, t in zip(pr, tr)] for pr, tr in zip(pred, target)]
    if name == "graded_mse":
        vals = [qi * (t - p) ** 2 for row in rows for (p, t), qi in zip(row, q)]
        per = vals
    elif name == "graded_norm_loss":
        per = [sum(qi * (t - p) ** 2 for (p, t), qi in zip(row, q)) for row in rows]
    elif name == "max_graded_loss":
        per = [max(math.sqrt(qi) * abs(t - p) for (p, t), qi in zip(row, q)) ** 2
               for row in rows]
    elif name == "homogeneous_loss":
        grades = sorted(set(q))
        r = len(grades)
        per = []
        for row in rows:
            total = 0.0
            for j, d in enumerate(grades, start=1):
                sq = sum((t - p) ** 2 for (p, t), qi in zip(row, q) if qi == d)
                total += math.sqrt(sq) ** (2 * (r - j + 1))
            per.append(total ** (1 / r))
    elif name == "linearly_graded_loss":
        per = [qi * abs(t - p) for row in rows for (p, t), qi in zip(row, q)]
    else:  # exponentially graded, λ = 1.5, squared error
        per = [1.5**qi * (t - p) ** 2 for row in rows for (p, t), qi in zip(row, q)]
    if reduction == "sum":
        return sum(per)
    if reduction == "mean":
        return sum(per) / len(per)
    return per


LOSSES = {
    "graded_mse": graded_mse,
    "graded_norm_loss": graded_norm_loss,
    "max_graded_loss": max_graded_loss,
    "homogeneous_loss": homogeneous_loss,
    "linearly_graded_loss": lambda i, t, q, **kw: linearly_graded_loss(i, t, q, base_loss="l1",
                                                                       **kw),
    "exponentially_graded_loss": lambda i, t, q, **kw: exponentially_graded_loss(i, t, q,
                                                                                 base=1.5, **kw),
}


@SETTINGS
@given(name=st.sampled_from(sorted(LOSSES)), reduction=st.sampled_from(["mean", "sum", "none"]),
       q=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]), min_size=1, max_size=4),
       rows=st.integers(1, 3), seed=st.integers(0, 1000))
def test_every_loss_equals_a_naive_loop_over_coordinates(name, reduction, q, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    pred = torch.randn(rows, len(q), generator=gen, dtype=F64)
    target = torch.randn(rows, len(q), generator=gen, dtype=F64)
    got = LOSSES[name](pred, target, torch.tensor(q, dtype=F64), reduction=reduction)
    expected = naive(name, pred.tolist(), target.tolist(), q, reduction)
    torch.testing.assert_close(got.flatten(), torch.tensor(expected, dtype=F64).flatten())


@SETTINGS
@given(reduction=st.sampled_from(["mean", "sum", "none"]), seed=st.integers(0, 1000),
       soft=st.booleans())
def test_graded_cross_entropy_equals_a_naive_loop(reduction, seed, soft):
    gen = torch.Generator().manual_seed(seed)
    q = [0.5, 1.0, 2.0]
    logits = torch.randn(4, 3, generator=gen, dtype=F64)
    if soft:
        target = torch.softmax(torch.randn(4, 3, generator=gen, dtype=F64), -1)
    else:
        target = torch.randint(0, 3, (4,), generator=gen)
    probs = torch.softmax(logits, -1).tolist()
    per = []
    for n in range(4):
        y = target[n].tolist() if soft else [float(k == int(target[n])) for k in range(3)]
        per.append(-sum(q[k] * y[k] * math.log(probs[n][k]) for k in range(3)))
    expected = {"sum": sum(per), "mean": sum(per) / 4, "none": per}[reduction]
    got = graded_cross_entropy(logits, target, torch.tensor(q), reduction=reduction)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=F64))
    from_probs = graded_cross_entropy(torch.softmax(logits, -1), target, torch.tensor(q),
                                      from_logits=False, reduction=reduction)
    torch.testing.assert_close(from_probs, torch.tensor(expected, dtype=F64))


# -- unit grades give the ungraded losses -------------------------------------------------------
def test_unit_grades_give_the_ungraded_losses():
    torch.manual_seed(0)
    pred, target = torch.randn(3, 5, 4, dtype=F64), torch.randn(3, 5, 4, dtype=F64)
    ones = torch.ones(4, dtype=F64)
    for red in ("mean", "sum", "none"):
        torch.testing.assert_close(graded_mse(pred, target, ones, reduction=red),
                                   F.mse_loss(pred, target, reduction=red))
        for base, ref in (("mse", F.mse_loss), ("l1", F.l1_loss), ("huber", F.huber_loss)):
            torch.testing.assert_close(
                linearly_graded_loss(pred, target, ones, base_loss=base, reduction=red),
                ref(pred, target, reduction=red))
            torch.testing.assert_close(   # λ^q = 1 with q = 0
                exponentially_graded_loss(pred, target, 0 * ones, base=3.0, base_loss=base,
                                          reduction=red),
                ref(pred, target, reduction=red))
    sq = ((pred - target) ** 2).sum(-1)
    torch.testing.assert_close(graded_norm_loss(pred, target, ones, reduction="none"), sq)
    torch.testing.assert_close(homogeneous_loss(pred, target, ones, reduction="none"), sq)
    inf_norm = torch.linalg.vector_norm(pred - target, ord=math.inf, dim=-1) ** 2
    torch.testing.assert_close(max_graded_loss(pred, target, ones, reduction="none"), inf_norm)
    logits, labels = torch.randn(6, 7, 4, dtype=F64), torch.randint(0, 4, (6, 7))
    labels[0, 0] = -100
    torch.testing.assert_close(graded_cross_entropy(logits, labels, ones),
                               F.cross_entropy(logits.reshape(-1, 4), labels.reshape(-1)))
    soft = torch.softmax(torch.randn(7, 4, dtype=F64), -1)
    torch.testing.assert_close(graded_cross_entropy(logits[0], soft, ones),
                               F.cross_entropy(logits[0], soft))
    neutral = LinearGrading(4, dtype=F64)  # f(q) = 1
    torch.testing.assert_close(linearly_graded_loss(pred, target, neutral),
                               F.mse_loss(pred, target))


# -- gradients into learnable grades -----------------------------------------------------------
def test_gradcheck_losses_wrt_input_and_learnable_grading_modules():
    torch.manual_seed(1)
    pred = torch.randn(3, 4, dtype=F64, requires_grad=True)
    target = torch.randn(3, 4, dtype=F64)
    lin = LinearGrading(4, [0.1, 0.6, 1.2, 2.0], f="softplus", learnable=True, dtype=F64)
    exp = ExponentialGrading(4, [0.1, 0.6, 1.2, 2.0], base=1.7, learnable=True, dtype=F64)
    checks = [
        (lambda p, q: graded_mse(p, target, lin), lin),
        (lambda p, q: graded_norm_loss(p, target, lin), lin),
        (lambda p, q: max_graded_loss(p, target, lin), lin),
        (lambda p, q: linearly_graded_loss(p, target, lin, base_loss="smooth_l1"), lin),
        (lambda p, q: exponentially_graded_loss(p, target, exp), exp),
        (lambda p, q: graded_cross_entropy(p, target.softmax(-1), exp), exp),
        (lambda p, q: homogeneous_loss(p, target, lin), lin),
    ]
    for fn, grading in checks:
        assert torch.autograd.gradcheck(fn, (pred, grading.grades))


def test_gradients_flow_into_grades_through_the_module_wrappers():
    grading = ExponentialGrading(3, [0.0, 1.0, 2.0], learnable=True)
    loss_fn = ExponentiallyGradedLoss(grading, reduction="sum")
    assert [n for n, _ in loss_fn.named_parameters()] == ["grading.grades"]
    loss_fn(torch.randn(5, 3), torch.randn(5, 3)).backward()
    assert grading.grades.grad is not None and (grading.grades.grad != 0).all()


def test_module_wrappers_match_the_functions():
    torch.manual_seed(2)
    pred, target = torch.randn(4, 3), torch.randn(4, 3)
    q = torch.tensor([0.5, 1.0, 2.0])
    pairs = [
        (GradedMSELoss(q), graded_mse(pred, target, q)),
        (GradedNormLoss(q, "sum"), graded_norm_loss(pred, target, q, reduction="sum")),
        (HomogeneousLoss(q), homogeneous_loss(pred, target, q)),
        (MaxGradedLoss(q), max_graded_loss(pred, target, q)),
        (LinearlyGradedLoss(q, base_loss="l1"), linearly_graded_loss(pred, target, q,
                                                                     base_loss="l1")),
        (ExponentiallyGradedLoss(q, base=3.0), exponentially_graded_loss(pred, target, q,
                                                                         base=3.0)),
    ]
    for module, value in pairs:
        torch.testing.assert_close(module(pred, target), value)
    labels = torch.tensor([0, 2, 1, 1])
    torch.testing.assert_close(GradedCrossEntropyLoss(q)(pred, labels),
                               graded_cross_entropy(pred, labels, q))
    assert "grades" in dict(GradedMSELoss(q).named_buffers())


# -- bad input -------------------------------------------------------------------------------
def test_bad_input_raises_errors_naming_the_value():
    pred, target = torch.randn(2, 3), torch.randn(2, 3)
    with pytest.raises(ValueError, match=r"length 2 .* dim=3"):
        graded_mse(pred, target, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="nan at index 2"):
        graded_norm_loss(pred, target, torch.tensor([1.0, 2.0, float("nan")]))
    with pytest.raises(ValueError, match=r"q >= 0 as weights, got -1\.0 at index 0"):
        max_graded_loss(pred, target, torch.tensor([-1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match=r"base=0\.5"):
        exponentially_graded_loss(pred, target, torch.ones(3), base=0.5)
    with pytest.raises(ValueError, match=r"target shape \(2, 4\)"):
        graded_mse(pred, torch.randn(2, 4), torch.ones(3))
    with pytest.raises(ValueError, match="reduction"):
        graded_mse(pred, target, torch.ones(3), reduction="avg")
    with pytest.raises(TypeError, match="ExponentialGrading"):
        linearly_graded_loss(pred, target, ExponentialGrading(3))
    with pytest.raises(TypeError, match="LinearGrading"):
        exponentially_graded_loss(pred, target, LinearGrading(3))
    with pytest.raises(ValueError, match="own base"):
        exponentially_graded_loss(pred, target, ExponentialGrading(3), base=2.0)
    with pytest.raises(ValueError, match=r"out of range \[0, 3\): got \[5\]"):
        graded_cross_entropy(pred, torch.tensor([0, 5]), torch.ones(3))
    with pytest.raises(ValueError, match="base_loss"):
        linearly_graded_loss(pred, target, torch.ones(3), base_loss="hinge")


def test_a_reducing_base_loss_is_refused_not_broadcast_against_the_weights():
    # F.mse_loss reduces to a scalar by default; broadcast against q it gave mean(q)·MSE, the
    # weights lost; the elementwise form (reduction="none") is the weighted loss
    pred = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=F64)
    target = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 0.0]], dtype=F64)
    q = torch.tensor([0.0, 1.0, 2.0], dtype=F64)
    with pytest.raises(ValueError, match=r"base_loss returned \(\); expected elementwise "
                                         r"losses of the input's shape \(2, 3\)"):
        linearly_graded_loss(pred, target, q, base_loss=F.mse_loss)
    with pytest.raises(ValueError, match=r"base_loss returned \(2,\)"):
        exponentially_graded_loss(pred, target, q, base_loss=lambda i, t: (i - t).abs().sum(-1))
    got = linearly_graded_loss(pred, target, q, base_loss=lambda i, t: F.mse_loss(
        i, t, reduction="none"), reduction="sum")
    assert math.isclose(float(got), 0 * 1 + 1 * 4 + 2 * 9 + 0 * 0 + 1 * 0 + 2 * 1)


def test_exponentially_graded_loss_refuses_an_infinite_base():
    pred, target = torch.randn(2, 3), torch.randn(2, 3)
    # λ = ∞ gave ∞^0 · ℓ = NaN for a zero grade
    with pytest.raises(ValueError, match=r"finite base λ >= 1, got base=inf"):
        exponentially_graded_loss(pred, target, torch.tensor([0.0, 1.0, 2.0]),
                                  base=float("inf"))


@pytest.mark.parametrize("soft", [False, True])
def test_graded_cross_entropy_zero_weight_class_with_zero_probability_counts_zero(soft):
    # probabilities with p_0 = 0 on a class of weight q_0 = 0: its term 0·y·log 0 is 0, not NaN
    probs = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]], dtype=F64)
    q = torch.tensor([0.0, 1.0, 2.0], dtype=F64)
    target = (torch.tensor([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]], dtype=F64) if soft
              else torch.tensor([0, 1]))
    expected = ([-(1.0 * 0.5 * math.log(0.5)), -math.log(0.3)] if soft
                else [0.0, -math.log(0.3)])
    got = graded_cross_entropy(probs, target, q, from_logits=False, reduction="none")
    torch.testing.assert_close(got, torch.tensor(expected, dtype=F64))
    # learnable weights get finite gradients there, and an ignored target adds nothing
    grading = LinearGrading(3, [-1.0, 0.0, 1.0], f="shift", learnable=True, dtype=F64)
    index = torch.tensor([-100, 1])
    loss = graded_cross_entropy(probs, index, grading, from_logits=False, reduction="sum")
    assert math.isclose(float(loss.detach()), -1.0 * math.log(0.3))  # f(0) = 1, class 1
    loss.backward()
    assert torch.isfinite(grading.grades.grad).all()


def test_an_integer_input_is_refused_not_weighted_by_truncated_grades():
    # the weights took the input's dtype: q = (0.5, 1.5, 2.5) became (0, 1, 2) and graded_mse
    # of the errors (1, 2, 3) summed to 22 instead of 0.5·1 + 1.5·4 + 2.5·9 = 29
    pred, target = torch.tensor([[1, 2, 3]]), torch.tensor([[0, 0, 0]])
    q = torch.tensor([0.5, 1.5, 2.5])
    assert math.isclose(float(graded_mse(pred.double(), target.double(), q, reduction="sum")),
                        0.5 * 1 + 1.5 * 4 + 2.5 * 9)
    for fn in (graded_mse, graded_norm_loss, max_graded_loss, homogeneous_loss):
        with pytest.raises(TypeError, match=r"floating-point tensor, got torch\.int64"):
            fn(pred, target, q)
    with pytest.raises(TypeError, match=r"target must be a tensor .* got list"):
        graded_cross_entropy(torch.randn(2, 3), [0, 1], torch.ones(3))


def test_max_graded_loss_of_vectors_without_coordinates_is_zero():
    # max over no terms: amax raised IndexError; the other losses sum no terms to 0
    empty = torch.zeros(4, 0, dtype=F64)
    q = torch.zeros(0, dtype=F64)
    torch.testing.assert_close(max_graded_loss(empty, empty, q, reduction="none"),
                               graded_norm_loss(empty, empty, q, reduction="none"))
    assert float(max_graded_loss(empty, empty, q, reduction="sum")) == 0.0


def test_homogeneous_loss_of_vectors_without_coordinates_is_zero():
    # no grade at all (r = 0): torch.stack of no groups raised RuntimeError; the per-vector
    # losses that sum their terms give 0 for each vector, and so does the loss of one grade
    empty = torch.zeros(4, 0, dtype=F64)
    q = torch.zeros(0, dtype=F64)
    torch.testing.assert_close(homogeneous_loss(empty, empty, q, reduction="none"),
                               graded_norm_loss(empty, empty, q, reduction="none"))
    assert float(homogeneous_loss(empty, empty, q, reduction="sum")) == 0.0


def test_homogeneous_loss_with_large_errors_is_finite_in_float32():
    # ten distinct grades and errors of 100: Σ_j ‖e_{d_j}‖^{2(r-j+1)} is 10^40 > float32's max,
    # so the loss was inf with zero gradients; the loss itself is about 10^4
    q = torch.arange(1.0, 11.0)
    pred = torch.full((2, 10), 100.0, requires_grad=True)
    pred64 = pred.detach().double()
    naive = sum(float(pred64[0, j]) ** (2 * (10 - j)) for j in range(10)) ** (1 / 10)
    got = homogeneous_loss(pred, torch.zeros_like(pred), q)
    assert math.isclose(float(got.detach()), naive, rel_tol=1e-5)
    got.backward()
    expected_grad = torch.func.grad(
        lambda p: (p**2).pow(torch.arange(10, 0, -1, dtype=F64)).sum(-1).pow(0.1).mean()
    )(pred64)
    torch.testing.assert_close(pred.grad.double(), expected_grad, rtol=1e-4, atol=1e-30)


def test_homogeneous_loss_of_a_nan_error_is_nan_and_of_an_infinite_error_inf():
    # a NaN error gave the loss 0 (NaN > 0 is False: read as a zero error), so a diverged
    # prediction trained on silently; an infinite one gave NaN (∞/∞) where the loss is ∞,
    # as the plain formula (‖e_1‖⁶ + ‖e_2‖⁴ + ‖e_3‖²)^{1/3} says
    q = torch.tensor([1.0, 2.0, 3.0])
    pred = torch.tensor([[1.0, math.nan, 2.0], [math.inf, 1.0, 1.0], [1.0, 1.0, -math.inf],
                         [2.0, 0.0, 1.0]])
    target = torch.zeros_like(pred)
    got = homogeneous_loss(pred, target, q, reduction="none")
    sq = (pred - target) ** 2
    plain = (sq[:, 0] ** 3 + sq[:, 1] ** 2 + sq[:, 2]) ** (1 / 3)
    torch.testing.assert_close(got, plain, equal_nan=True)
    assert math.isnan(float(got[0])) and float(got[1]) == float(got[2]) == math.inf
    assert math.isnan(float(homogeneous_loss(pred, target, q)))


def test_exponentially_graded_loss_of_an_exact_prediction_is_zero_beyond_the_dtype_range():
    # λ^q = 2^130 is inf in float32 (2^16 in float16) and inf·0 was NaN: a perfect prediction
    # had loss NaN. Σ λ^{q_k} ℓ_k with ℓ = 0 is 0; an error of weight 2^130 whose term is beyond
    # float32 stays ∞ (2^130·1; 2^130·0.25 = 2^128 is float32's overflow threshold itself, where
    # the rounding of q·ln λ decides between ∞ and the largest float)
    q = torch.tensor([0.0, 130.0])
    pred = torch.tensor([[1.0, 2.0], [1.0, 3.0]])
    target = torch.tensor([[1.5, 2.0], [1.0, 2.0]])
    got = exponentially_graded_loss(pred, target, q, reduction="none")
    torch.testing.assert_close(got[0], torch.tensor([0.25, 0.0]))
    assert got[1, 0] == 0.0 and got[1, 1] == math.inf
    assert float(exponentially_graded_loss(pred[:1], target[:1], q, reduction="sum")) == 0.25
    half = torch.tensor([[1.0, 2.0]], dtype=torch.float16)
    loss = exponentially_graded_loss(half, half, torch.tensor([0.0, 16.0]))
    assert loss.dtype == torch.float16 and float(loss) == 0.0


def _exp_graded_reference(x, y, q, base=2.0):
    """Σ λ^q (x − y)² / n in float64 from the plain formula, where λ^q of these tests fits."""
    return (base ** q * (x - y) ** 2).mean()


def test_exponentially_graded_loss_is_finite_where_the_weighted_term_is_though_the_weight_is_not():
    # λ^q = 2^130 is inf in float32, and λ^q·ℓ was inf for every ℓ > 0 though 2^130·2^-120 is
    # 2^10; the loss and its gradients (input, learnable grades) match float64, where 2^130 fits
    gen = torch.Generator().manual_seed(0)
    scale = torch.tensor([1.0, 2.0**-50, 2.0**-60])  # errors ~ 1, 2^-50, 2^-60
    x = ((1 + torch.rand(4, 3, generator=gen)) * scale).requires_grad_()
    y = torch.zeros(4, 3)
    q = torch.tensor([0.0, 100.0, 130.0], requires_grad=True)
    loss = exponentially_graded_loss(x, y, q, base=2.0)
    loss.backward()
    x64, q64 = x.detach().double().requires_grad_(), q.detach().double().requires_grad_()
    expected = _exp_graded_reference(x64, y.double(), q64)
    expected.backward()
    assert math.isclose(float(loss.detach()), float(expected.detach()), rel_tol=1e-5)
    # ∂L/∂ℓ = 2^130/12 fits float32: so do the input's gradients, up to 2^130·2^-59/6
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=0)
    torch.testing.assert_close(q.grad.double(), q64.grad, rtol=1e-5, atol=0)


def test_exponentially_graded_loss_gradcheck_in_float64_beyond_the_weights_range():
    # λ^q = 2^1026 and 2^1025 are inf in float64; the errors 2^-500·p keep the terms near 2^26
    # and ∂L/∂ℓ = 2^1026/8 finite, so the gradients in p and q are finite and checkable
    gen = torch.Generator().manual_seed(1)
    p = (1 + torch.rand(4, 2, generator=gen, dtype=F64)).requires_grad_()
    q = torch.tensor([1026.0, 1025.0], dtype=F64, requires_grad=True)
    zeros = torch.zeros(4, 2, dtype=F64)

    def loss(p, q):
        return exponentially_graded_loss(p * 2.0**-500, zeros, q, base=2.0)

    # the plain formula, with λ^q·(2^-500·p)² = 2^(q - 1000)·p², all within float64's range
    expected = (2.0 ** (q.detach() - 1000) * p.detach() ** 2).mean()
    assert math.isclose(float(loss(p, q).detach()), float(expected), rel_tol=1e-12)
    assert torch.autograd.gradcheck(loss, (p, q))


def test_exponentially_graded_loss_of_a_float32_grading_weights_a_float16_input():
    # the float32 scales 2^16 and 2^20 were cast to float16 (max 65504) as inf: every term of
    # those coordinates was inf though 2^20·2^-14 = 64; the loss, the grades' and the input's
    # gradients match float64 (within float16's rounding)
    gen = torch.Generator().manual_seed(2)
    scale = torch.tensor([1.0, 2.0**-7, 2.0**-7])
    x = ((1 + torch.rand(8, 3, generator=gen)) * scale).half().requires_grad_()
    y = torch.zeros(8, 3, dtype=torch.float16)
    grading = ExponentialGrading(3, [0.0, 16.0, 20.0], base=2.0, learnable=True)
    loss = exponentially_graded_loss(x, y, grading)
    loss.backward()
    x64 = x.detach().double().requires_grad_()
    q64 = torch.tensor([0.0, 16.0, 20.0], dtype=F64, requires_grad=True)
    expected = _exp_graded_reference(x64, y.double(), q64)
    expected.backward()
    assert loss.dtype == torch.float16
    assert math.isclose(float(loss.detach()), float(expected.detach()), rel_tol=2e-3)
    torch.testing.assert_close(grading.grades.grad.double(), q64.grad, rtol=1e-2, atol=0)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-2, atol=0)


def test_exponentially_graded_loss_of_a_subnormal_loss_far_beyond_the_weights_range():
    # float32: 2^270·2^-149 = 2^121 (ℓ the smallest subnormal; λ^q needs three finite factors),
    # 2^300·2^-149 = 2^151 is beyond float32 (inf), and ℓ = 0 gives 0 whatever λ^q (2^1000)
    x = torch.tensor([[2.0**-149, 2.0**-149, 0.0]])
    q = torch.tensor([270.0, 300.0, 1000.0])
    got = exponentially_graded_loss(x, torch.zeros_like(x), q, base=2.0, base_loss="l1",
                                    reduction="none")
    expected = (2.0 ** q.double() * x.double()).float()  # exact powers of two, then rounded
    assert expected.tolist() == [[2.0**121, math.inf, 0.0]]
    # q·ln λ ≈ 187 in float32 carries a relative error ~1e-5 into λ^q, as it did below 88.7
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=0)
    # the grade of the exact coordinate gets the gradient 0 = ln λ·λ^q·0, not NaN (0·inf)
    q_learn = q.clone().requires_grad_()
    exponentially_graded_loss(x[:, [0, 2]], torch.zeros(1, 2), q_learn[[0, 2]], base=2.0,
                              base_loss="l1", reduction="sum").backward()
    torch.testing.assert_close(q_learn.grad, torch.tensor([math.log(2) * 2.0**121, 0.0, 0.0]),
                               rtol=1e-4, atol=0)


def test_exponentially_graded_loss_passes_the_gradient_of_a_term_whose_loss_is_zero():
    # a signed base loss ℓ = ŷ − y is 0 at ŷ = y with ∂ℓ/∂ŷ = 1: ∂(Σ λ^q ℓ)/∂ŷ = λ^q there,
    # but the guard for ℓ = 0 (a where) gave that term the gradient 0
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=F64, requires_grad=True)
    q = torch.tensor([0.0, 1.0, 3.0], dtype=F64)
    loss = exponentially_graded_loss(x, x.detach(), q, base=1.5, base_loss=lambda i, t: i - t,
                                     reduction="sum")
    assert float(loss.detach()) == 0.0
    loss.backward()
    torch.testing.assert_close(x.grad, torch.tensor([[1.0, 1.5, 1.5**3]], dtype=F64))


# -- an empty batch reduces as torch does: "mean" of nothing is NaN, "sum" of nothing is 0 ------
C = 3
EMPTY_REFERENCES = {  # graded loss with unit weights (q = 0 for λ^q) -> torch's loss or reduction
    "graded_mse": (graded_mse, 1.0, F.mse_loss),
    "linearly_graded_loss": (lambda i, t, q, **kw: linearly_graded_loss(i, t, q, base_loss="l1",
                                                                        **kw), 1.0, F.l1_loss),
    "exponentially_graded_loss": (lambda i, t, q, **kw: exponentially_graded_loss(
        i, t, q, base=1.5, **kw), 0.0, F.mse_loss),
    # the per-vector losses: one value per vector, here none, reduced by torch
    "graded_norm_loss": (graded_norm_loss, 1.0, None),
    "homogeneous_loss": (homogeneous_loss, 1.0, None),
    "max_graded_loss": (max_graded_loss, 1.0, None),
}


def torch_reduce(x, reduction):
    return {"mean": x.mean(), "sum": x.sum(), "none": x}[reduction]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", list(EMPTY_REFERENCES))
def test_every_loss_of_an_empty_batch_reduces_as_torch_does(name, reduction):
    loss, grade, reference = EMPTY_REFERENCES[name]
    pred, target = torch.zeros(0, C, dtype=F64), torch.zeros(0, C, dtype=F64)
    got = loss(pred, target, torch.full((C,), grade, dtype=F64), reduction=reduction)
    expected = (reference(pred, target, reduction=reduction) if reference is not None
                else torch_reduce(torch.zeros(0, dtype=F64), reduction))
    torch.testing.assert_close(got, expected, equal_nan=True)
    if reduction == "mean":
        assert math.isnan(float(got))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("target", ["indices", "probabilities", "all ignored"])
def test_graded_cross_entropy_of_no_sample_is_that_of_torch(target, reduction):
    # the mean over class indices was per.sum() / max(kept, 1) = 0 where F.cross_entropy
    # (reduction "mean") gives NaN: an empty batch, or one whose targets are all ignored
    if target == "all ignored":
        logits = torch.randn(4, C, dtype=F64, generator=torch.Generator().manual_seed(0))
        labels = torch.full((4,), -100)
    else:
        logits = torch.zeros(0, C, dtype=F64)
        labels = (torch.zeros(0, dtype=torch.long) if target == "indices"
                  else torch.zeros(0, C, dtype=F64))
    ours = logits.clone().requires_grad_()
    theirs = logits.clone().requires_grad_()
    grading = LinearGrading(C, learnable=True, dtype=F64)  # f(q) = 1: unit weights
    got = graded_cross_entropy(ours, labels, grading, reduction=reduction)
    expected = F.cross_entropy(theirs, labels, reduction=reduction)
    torch.testing.assert_close(got, expected, equal_nan=True)
    got.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)  # no NaN reaches the gradients
    assert torch.equal(grading.grades.grad, torch.zeros(C, dtype=F64))
    loss = GradedCrossEntropyLoss(torch.ones(C, dtype=F64), reduction=reduction)
    torch.testing.assert_close(loss(logits, labels), expected.detach(), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16])
def test_graded_cross_entropy_reads_class_indices_of_any_integer_dtype(dtype):
    # gather takes int64 (or int32) indices only: a uint8 target, which F.cross_entropy takes,
    # failed inside torch with "gather(): Expected dtype int32/int64 for index"
    torch.manual_seed(0)
    logits, labels = torch.randn(6, 4, dtype=F64), torch.randint(0, 4, (6,))
    q = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=F64)
    expected = -(q[labels] * F.log_softmax(logits, -1)[torch.arange(6), labels]).mean()
    torch.testing.assert_close(graded_cross_entropy(logits, labels.to(dtype), q), expected)


def test_graded_cross_entropy_names_a_bool_target():
    with pytest.raises(TypeError, match=r"class indices .* or class probabilities .*torch\.bool"):
        graded_cross_entropy(torch.randn(3, 2), torch.tensor([True, False, True]), torch.ones(2))


# -- a grading's scales beyond the input's dtype -------------------------------------------------
_WEIGHTED_BY_SCALES = {
    "linearly_graded_loss": (linearly_graded_loss, lambda w, e: (w * e**2).mean()),
    "graded_mse": (graded_mse, lambda w, e: (w * e**2).mean()),
    "max_graded_loss": (max_graded_loss, lambda w, e: (w * e**2).amax(-1).mean()),
    "graded_norm_loss": (graded_norm_loss, lambda w, e: (w * e**2).sum(-1).mean()),
}


@pytest.mark.parametrize("name", sorted(_WEIGHTED_BY_SCALES))
def test_a_float32_linear_scale_beyond_float16_gives_zero_for_an_exact_prediction(name):
    # the scale 10^5 of a float32 LinearGrading was cast to float16 (max 65504) as inf, and
    # inf·0 made the loss of an exact prediction NaN; Σ w·0 is 0 whatever the weights
    loss_fn, _ = _WEIGHTED_BY_SCALES[name]
    grading = LinearGrading(2, [0.0, 1e5 - 1], f="shift")
    x = torch.tensor([[1.0, 2.0], [3.0, -4.0]], dtype=torch.float16)
    for reduction in ("mean", "sum"):
        loss = loss_fn(x, x, grading, reduction=reduction)
        assert loss.dtype == torch.float16 and float(loss) == 0.0


def test_linearly_graded_loss_of_a_representable_product_of_a_scale_beyond_float16_is_finite():
    # 10^5 · 10^-4 (l1) is 10 in float16, but the scale alone is not: it was inf
    grading = LinearGrading(2, [0.0, 1e5 - 1], f="shift")
    x = torch.tensor([[0.5, 1e-4], [0.25, 0.0]], dtype=torch.float16)
    got = linearly_graded_loss(x, torch.zeros_like(x), grading, base_loss="l1",
                               reduction="none")
    expected = (torch.tensor([1.0, 1e5], dtype=F64) * x.double()).half()  # rounded once
    assert torch.equal(got, expected)
    assert math.isclose(float(got[0, 1]), 10.0, rel_tol=1e-3)
    # a term beyond float16 stays inf, as the true product is: 10^5 · 1 > 65504
    one = torch.tensor([[0.0, 1.0]], dtype=torch.float16)
    got = linearly_graded_loss(one, torch.zeros_like(one), grading, base_loss="l1",
                               reduction="none")
    assert float(got[0, 0]) == 0.0 and float(got[0, 1]) == math.inf


@pytest.mark.parametrize("name", sorted(_WEIGHTED_BY_SCALES))
def test_a_learnable_float32_linear_grading_weights_a_float16_input_as_float64_does(name):
    # scales 1, 2^16 + 1 and 10^5 (two beyond float16) with errors near 2^-7: the loss, the
    # grades' and the input's gradients match the plain formula in float64
    loss_fn, reference = _WEIGHTED_BY_SCALES[name]
    gen = torch.Generator().manual_seed(3)
    scale = torch.tensor([1.0, 2.0**-7, 2.0**-7])
    x = ((1 + torch.rand(8, 3, generator=gen)) * scale).half().requires_grad_()
    y = torch.zeros(8, 3, dtype=torch.float16)
    grades = [0.0, 2.0**16, 1e5 - 1]
    grading = LinearGrading(3, grades, f="shift", learnable=True)
    loss = loss_fn(x, y, grading)
    loss.backward()
    x64 = x.detach().double().requires_grad_()
    q64 = torch.tensor(grades, dtype=F64, requires_grad=True)
    expected = reference(q64 + 1.0, x64 - y.double())
    expected.backward()
    assert loss.dtype == torch.float16 and math.isfinite(float(loss.detach()))
    assert math.isclose(float(loss.detach()), float(expected.detach()), rel_tol=2e-3)
    torch.testing.assert_close(grading.grades.grad.double(), q64.grad, rtol=1e-2, atol=0)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-2, atol=0)


@pytest.mark.parametrize("base_loss", ["mse", "l1", "smooth_l1", "huber", "bce",
                                       "bce_with_logits"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_linear_scale_within_the_dtype_weights_as_its_value_rounded_to_that_dtype(
        base_loss, dtype):
    # scales that fit the input's dtype are rounded to it and multiply there, as before the
    # wide product of scales beyond it: bit for bit the plain w.to(dtype) · ℓ of torch's loss
    gen = torch.Generator().manual_seed(4)
    grading = LinearGrading(4, [0.0, 0.37, 1.3, 9.1], f="softplus")
    x = torch.rand(5, 4, generator=gen).clamp(0.05, 0.95).to(dtype)
    y = torch.rand(5, 4, generator=gen).to(dtype)
    base = {"mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss,
            "huber": F.huber_loss, "bce": F.binary_cross_entropy,
            "bce_with_logits": F.binary_cross_entropy_with_logits}[base_loss]
    terms = F.softplus(grading.grades.detach()).to(dtype) * base(x, y, reduction="none")
    for reduction, expected in (("none", terms), ("sum", terms.sum()), ("mean", terms.mean())):
        got = linearly_graded_loss(x, y, grading, base_loss=base_loss, reduction=reduction)
        assert torch.equal(got, expected)


def test_graded_cross_entropy_with_a_linear_scale_beyond_float16_matches_float64():
    # the scale 10^5 was cast to float16 as inf: a zero probability on its class gave
    # inf·0 = NaN, and 10^5·10^-3 (q·y) gave inf; with class indices, a confident correct
    # prediction of its class gave inf·0 = NaN
    grading = LinearGrading(2, [0.0, 1e5 - 1], f="shift")
    scales = torch.tensor([1.0, 1e5], dtype=F64)
    logits = torch.tensor([[1.0, 2.0], [0.5, -0.5]], dtype=torch.float16)
    logp64 = F.log_softmax(logits.double(), -1)
    for probs in ([[1.0, 0.0], [1.0, 0.0]], [[0.999, 0.001], [0.9, 0.1]]):
        target = torch.tensor(probs, dtype=torch.float16)
        got = graded_cross_entropy(logits, target, grading, reduction="none")
        drop = target.double() == 0
        expected = -(scales * target.double() * logp64.masked_fill(drop, 0.0)).sum(-1)
        assert got.dtype == torch.float16 and bool(got.isfinite().all())
        torch.testing.assert_close(got.double(), expected, rtol=3e-3, atol=0)
    confident = torch.tensor([[-20.0, 20.0]], dtype=torch.float16)  # log p(class 1) = 0 in fp16
    got = graded_cross_entropy(confident, torch.tensor([1]), grading, reduction="sum")
    assert float(got) == 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_graded_cross_entropy_with_scales_within_the_dtype_weights_as_their_rounded_values(dtype):
    # bit for bit the plain formula with the scales rounded to the input's dtype, as before
    # scales beyond the dtype were weighted in the wider one
    gen = torch.Generator().manual_seed(5)
    grading = LinearGrading(4, [0.0, 0.37, 1.3, 9.1], f="softplus")
    w = F.softplus(grading.grades.detach()).to(dtype)
    logits = torch.randn(6, 4, generator=gen).to(dtype)
    probs = torch.softmax(torch.randn(6, 4, generator=gen), -1).to(dtype)
    logp = F.log_softmax(logits, -1)
    expected = -(w * probs * logp).sum(-1)
    assert torch.equal(graded_cross_entropy(logits, probs, grading, reduction="none"), expected)
    labels = torch.randint(0, 4, (6,), generator=gen)
    expected = -(w[labels] * logp[torch.arange(6), labels])
    assert torch.equal(graded_cross_entropy(logits, labels, grading, reduction="none"), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_homogeneous_loss_groups_by_the_gradings_scales_not_their_rounding_to_the_input(dtype):
    # scales 2, 2.0001 and 3 in float32 are three grades; cast to bfloat16 or float16 the first
    # two became one (2.0), so r was 2 and the loss (‖(1, 2)‖⁴ + 3²)^{1/2} = √34 ≈ 5.83 where
    # the three grades give (1⁶ + 2⁴ + 3²)^{1/3} = 26^{1/3} ≈ 2.96
    grading = LinearGrading(3, [1.0, 1.0001, 2.0], f="shift")
    scales = grading.scales().detach().double()
    assert len(set(scales.tolist())) == 3 and len(set(scales.to(dtype).tolist())) == 2
    pred = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], dtype=dtype)
    target = torch.zeros_like(pred)
    e = (pred - target).double()
    naive = []  # a plain loop in float64 over the distinct scales, smallest first
    for row in e:
        distinct = sorted(set(scales.tolist()))
        r = len(distinct)
        norms = [sum(float(row[i]) ** 2 for i in range(3) if float(scales[i]) == d)
                 for d in distinct]
        naive.append(sum(n ** (r - j) for j, n in enumerate(norms)) ** (1 / r))
    got = homogeneous_loss(pred, target, grading, reduction="none")
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), torch.tensor(naive, dtype=F64), rtol=1e-2, atol=0)
    assert math.isclose(naive[0], 26 ** (1 / 3), rel_tol=1e-12)


def test_homogeneous_loss_groups_a_list_of_grades_in_float64():
    # grades 1 and 1 + 1e-9 given as Python floats are two grades; read as float32 they were
    # one (r = 2): (‖(1, 2)‖⁴ + 3²)^{1/2} = √34 where the three give 26^{1/3}
    pred = torch.tensor([[1.0, 2.0, 3.0]], dtype=F64)
    got = homogeneous_loss(pred, torch.zeros_like(pred), [1.0, 1.0 + 1e-9, 2.0])
    assert math.isclose(float(got), (1.0 + 2.0**4 + 3.0**2) ** (1 / 3), rel_tol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("as_list", [False, True])
def test_tensor_grades_weight_a_half_input_by_lambda_to_the_q_rounded_once(
        dtype, as_list):
    # λ^q was exp(q·ln λ) computed in the input's dtype, ln 2 rounded first: bfloat16 weighted
    # grade 10 by 1000 and grade 5 by 31.625 (float16: 1026 and 32.03), not 1024 and 32
    q = [0.0, 1.0, 2.5, 5.0, 10.0]
    x = torch.ones(2, 5, dtype=dtype)
    y = torch.zeros(2, 5, dtype=dtype)
    terms = exponentially_graded_loss(x, y, q if as_list else torch.tensor(q), base=2.0,
                                      reduction="none")
    expected = (2.0 ** torch.tensor(q, dtype=F64)).to(dtype).expand(2, 5)
    assert terms.dtype == dtype
    assert torch.equal(terms, expected)
