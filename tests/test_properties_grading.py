"""Properties of the grading maps (``graded.grading``): LGT diag(f(q)) (000 Def 5.1, Lemma 5.5)
and EGT diag(λ^q) (000 Def 6.1, Prop 6.5), for random grades, dtypes and settings.

What the papers state: the scales are positive (f: R → R^+, λ^q > 0 for λ > 1); the grading
emphasises higher grades (000 Ex. 5.4, Def 5.37 iv; Prop 6.7), so λ^q is increasing in q
for λ > 1 and in λ for q > 0, and f ∈ {q + 1, softplus, q} is increasing in q (|q| + 1 in |q|);
the neutral grade (q = 0 for EGT, the documented one of each f for LGT) gives M = I. What the
package documents (``graded.grading``): scales computed in float32 at least and rounded once
to the grades' dtype, every EGT scale finite in the compute dtype (the squared ones too under
the default cap), learnable grades floored so that every scale is positive, ``scale_of`` the
same function as ``scales`` of fixed grades, casts (``.to``, ``.double()``) equal to a
grading built in the target dtype.

References are float64 values computed independently (``math``), rounded once to the dtype.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from graded.grading import ExponentialGrading, LinearGrading, stacked_scales

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
DTYPES = [F16, BF16, F32, F64]
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)

# Fixed grades each f accepts, within limits every dtype holds (softplus(q) underflows to 0
# in float16 below about −17: such grades are refused there, tested in test_grading.py).
DOMAINS = {"shift": (-0.99, 1e4), "abs_shift": (-1e4, 1e4), "softplus": (-15.0, 1e4),
           "identity": (1e-3, 1e4)}


def naive_f(f: str, q: float) -> float:
    if f == "shift":
        return q + 1.0
    if f == "abs_shift":
        return abs(q) + 1.0
    if f == "softplus":
        return math.log1p(math.exp(q)) if q < 30 else q + math.log1p(math.exp(-q))
    return q


def rounded(values, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``values`` rounded once to ``dtype``."""
    return torch.as_tensor(values, dtype=F64).to(dtype)


def ulp_tolerance(dtype: torch.dtype) -> dict:
    """One unit in the last place of ``dtype`` (relative), for values computed in float32 and
    rounded once: a float64 reference near a tie may round to the other neighbour."""
    return {"rtol": torch.finfo(dtype).eps, "atol": 0.0}


def grades_in(lo: float, hi: float, size: int = 4):
    return st.lists(st.floats(lo, hi, allow_nan=False), min_size=1, max_size=size)


@SETTINGS
@given(f=st.sampled_from(list(DOMAINS)), dtype=st.sampled_from(DTYPES), data=st.data())
def test_linear_scales_are_f_of_each_grade_positive_finite_and_rounded_once(f, dtype, data):
    lo, hi = DOMAINS[f]
    grades = rounded(data.draw(grades_in(lo, hi)), dtype)
    assume(bool((grades.double() > lo - 1e-9).all()))  # rounding may leave the domain
    g = LinearGrading(len(grades), grades, f=f, dtype=dtype)
    s = g.scales()
    want = rounded([naive_f(f, q) for q in grades.double().tolist()], dtype)
    assert s.dtype == dtype and s.shape == grades.shape
    assert bool(torch.isfinite(s).all()) and bool((s > 0).all())
    if f == "softplus":
        torch.testing.assert_close(s, want, **ulp_tolerance(dtype))
    else:  # one addition, or none, rounded once: exactly the float64 value rounded
        assert torch.equal(s, want)
    torch.testing.assert_close(g.inverse_scales(), 1.0 / s, rtol=0, atol=0)
    assert torch.equal(g.scale_of(g.grades), s)


@SETTINGS
@given(f=st.sampled_from(list(DOMAINS)), dtype=st.sampled_from(DTYPES), data=st.data())
def test_linear_scales_increase_with_the_grade(f, dtype, data):
    """Higher grades get larger scales (000 Ex. 5.4, Def 5.37 iv): f is nondecreasing, after
    rounding too (rounding is monotone); for abs_shift in |q|."""
    lo, hi = DOMAINS[f]
    raw = sorted(data.draw(grades_in(lo, hi, size=6)), key=abs if f == "abs_shift" else None)
    grades = rounded(raw, dtype)
    assume(bool((grades.double() > lo - 1e-9).all()))
    s = LinearGrading(len(grades), grades, f=f, dtype=dtype).scales().double()
    assert bool((s[1:] >= s[:-1]).all()), (grades.tolist(), s.tolist())


@SETTINGS
@given(f=st.sampled_from(list(DOMAINS)), dtype=st.sampled_from(DTYPES),
       learnable=st.booleans(), heads=st.sampled_from([None, 2]), seed=st.integers(0, 99))
def test_the_neutral_linear_grading_is_the_identity(f, dtype, learnable, heads, seed):
    """grades=None gives M = I: exactly for shift, abs_shift and identity, and within one
    rounding of 1 for softplus (log(e − 1) is not a float)."""
    g = LinearGrading(3, f=f, learnable=learnable, num_heads=heads, dtype=dtype)
    x = torch.randn(2, heads or 1, 5, 3, generator=torch.Generator().manual_seed(seed),
                    dtype=F64).to(dtype)
    y = g(x)
    if f == "softplus":
        torch.testing.assert_close(g.scales(), torch.ones_like(g.scales()),
                                   **ulp_tolerance(dtype))
        torch.testing.assert_close(y, x, **ulp_tolerance(dtype))
    else:
        assert torch.equal(g.scales(), torch.ones(g.grades.shape, dtype=dtype))
        assert torch.equal(y, x)


@SETTINGS
@given(f=st.sampled_from(["shift", "identity", "softplus"]), dtype=st.sampled_from(DTYPES),
       grades=st.lists(st.one_of(st.floats(-100.0, 1e4), st.floats(-1e30, 1e4)), min_size=1,
                       max_size=4),
       floor=st.floats(1e-60, 1.0))
@example(f="shift", dtype=F16, grades=[-5.0], floor=1e-10)  # floor below float16's least
@example(f="identity", dtype=F32, grades=[-1.0], floor=1e-50)  # below float32's least
@example(f="softplus", dtype=F16, grades=[-30.0], floor=1e-4)  # softplus(−30) → 0 in float16
@example(f="softplus", dtype=F32, grades=[-200.0], floor=1e-4)
def test_learnable_linear_scales_are_floored_positive_with_the_straight_through_gradient(
        f, dtype, grades, floor):
    """Learnable grades anywhere: every scale positive and finite, max(f(q), floor) for shift
    and identity with the floor raised to the dtype's least positive value, f(q) itself for
    softplus where it does not round to 0; the gradient is f'(q) unclamped (1 for shift and
    identity, sigmoid(q) for softplus), finite. Before, a floor below the dtype's least value
    and softplus of a grade far below 0 gave the scale 0 (inverse ∞)."""
    q = rounded(grades, dtype)
    assume(bool(torch.isfinite(q).all()))
    g = LinearGrading(len(grades), q, f=f, learnable=True, floor=floor, dtype=dtype)
    s = g.scales()
    assert s.dtype == dtype
    assert bool((s > 0).all()) and bool(torch.isfinite(s).all()), s.tolist()
    info = torch.finfo(dtype)
    least = info.tiny * info.eps
    raw = [naive_f(f, v) for v in q.double().tolist()]
    if f == "softplus":
        want = rounded([max(v, least) for v in raw], dtype)
        torch.testing.assert_close(s, want, rtol=info.eps, atol=least)
    else:
        want = rounded([max(v, max(floor, least)) for v in raw], dtype)
        assert torch.equal(s, want)
    s.double().sum().backward()
    grad = g.grades.grad
    assert grad.dtype == dtype and bool(torch.isfinite(grad).all())
    if f == "softplus":
        torch.testing.assert_close(grad.double(), torch.sigmoid(q.double()).to(dtype).double(),
                                   rtol=info.eps, atol=info.eps)
    else:
        assert bool((grad == 1).all())


@SETTINGS
@given(dtype=st.sampled_from(DTYPES), lam=st.floats(1.0 + 2**-10, 1e6),
       learnable=st.booleans(), autocast=st.sampled_from([None, BF16, F16]),
       heads=st.sampled_from([None, 3]), mult=st.floats(0.0, 1e3))
def test_the_zero_exponential_grading_is_the_identity_exactly(dtype, lam, learnable, autocast,
                                                              heads, mult):
    """q = 0 gives λ^0 = 1 exactly, for every λ, dtype, autocast and multiplier s (λ^{s·0};
    ``scales_at`` takes shared grades only: (…) -> (…, dim) has no place for heads)."""
    g = ExponentialGrading(4, base=lam, learnable=learnable, num_heads=heads, dtype=dtype)
    x = torch.randn(2, heads or 1, 3, 4, dtype=F64).to(dtype)
    ones = torch.ones(g.grades.shape, dtype=dtype)
    with torch.autocast("cpu", dtype=autocast or BF16, enabled=autocast is not None):
        assert torch.equal(g.scales(), ones)
        assert torch.equal(g.inverse_scales(), ones)
        assert torch.equal(g(x), x)
        if heads is None:
            at = g.scales_at(torch.tensor([mult, 0.0], dtype=dtype))
            assert torch.equal(at, torch.ones_like(at))
        assert torch.equal(g.scale_of(torch.zeros(3, dtype=dtype)), torch.ones(3, dtype=dtype))


@SETTINGS
@given(dtype=st.sampled_from(DTYPES), grades=grades_in(0.0, 50.0))
def test_lambda_one_gives_the_identity_for_any_grades(dtype, grades):
    """The first value of the λ annealing of 000 §7.2 (iii): λ = 1 is M = I exactly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # λ = 3 may clamp: not under test
        g = ExponentialGrading(len(grades), grades, base=3.0, dtype=dtype)
    g.set_base(1.0)
    assert torch.equal(g.scales(), torch.ones(len(grades), dtype=dtype))


@SETTINGS
@given(dtype=st.sampled_from(DTYPES), grades=grades_in(0.0, 20.0, size=6),
       lams=st.lists(st.floats(1.0 + 2**-10, 8.0), min_size=2, max_size=2))
def test_exponential_scales_increase_with_the_grade_and_with_lambda(dtype, grades, lams):
    """λ^q, λ > 1, q ≥ 0, is nondecreasing in q and in λ (000 Prop 6.5, 6.7), after rounding
    and the cap too (both monotone); every scale is at least 1."""
    q = rounded(sorted(grades), dtype)
    low, high = sorted(lams)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a clamp: still monotone
        s_low = ExponentialGrading(len(q), q, base=low, dtype=dtype).scales()
        s_high = ExponentialGrading(len(q), q, base=high, dtype=dtype).scales()
    for s in (s_low, s_high):
        assert bool((s[1:] >= s[:-1]).all()) and bool((s >= 1).all()), s.tolist()
    assert bool((s_high >= s_low).all())


def _huge_grades(dtype: torch.dtype):
    """Grades q ≥ 0 up to the largest finite value of ``dtype``."""
    top = float(torch.finfo(dtype).max)
    return st.lists(st.one_of(st.floats(0.0, 100.0), st.floats(0.0, top)), min_size=1,
                    max_size=4)


@SETTINGS
@given(dtype=st.sampled_from(DTYPES), data=st.data(), lam=st.floats(1.0 + 2**-10, 1e6),
       cap=st.one_of(st.none(), st.floats(1e-3, 1e6)),
       autocast=st.sampled_from([None, BF16, F16]), learnable=st.booleans(),
       mult=st.floats(0.0, 1e3))
def test_exponential_scales_are_finite_and_at_least_one_under_every_cap(
        dtype, data, lam, cap, autocast, learnable, mult):
    """Any finite grades q ≥ 0 in the grades' dtype, any λ, any max_log_scale, under autocast
    or not: scales, their inverses, scales_at and scale_of are finite, in the documented dtype
    (the grades'; scale_of: q's), scales ≥ 1; under the default cap the square of a scale is
    finite in the compute dtype (the "queries_keys" variant); the gradient of learnable
    grades is finite where ln λ·λ^q is (a limit: with max_log_scale near what float16
    holds, λ = 7359, q = 1 has the scale 7359 and the gradient 8.9·7359, inf in float16)."""
    q = rounded(data.draw(_huge_grades(dtype)), dtype)
    assume(bool(torch.isfinite(q).all()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the clamp warns: documented
        g = ExponentialGrading(len(q), q, base=lam, learnable=learnable, max_log_scale=cap,
                               dtype=dtype)
        with torch.autocast("cpu", dtype=autocast or BF16, enabled=autocast is not None):
            s = g.scales()
            inv = g.inverse_scales()
            at = g.scales_at(torch.tensor([mult], dtype=dtype))
            of = g.scale_of(q)
            compute = autocast if autocast is not None and (
                torch.finfo(autocast).max < torch.finfo(dtype).max) else dtype
    for t, want in ((s, dtype), (inv, dtype), (at, dtype), (of, dtype)):
        assert t.dtype == want
        assert bool(torch.isfinite(t).all()), (q.tolist(), t.tolist())
    assert bool((s >= 1).all()) and bool((inv > 0).all()) and bool((inv <= 1).all())
    assert bool(torch.isfinite(s.to(compute)).all())
    if cap is None:
        assert bool(torch.isfinite(s.to(compute) * s.to(compute)).all())
    if learnable:  # d λ^q / dq = ln λ·λ^q, rounded to the grades' dtype: finite where that
        # product is (always under the default cap; a raised one may leave no room for ln λ)
        s.double().sum().backward()
        top = float(s.detach().double().max())
        room = math.log(float(g.base)) * top < torch.finfo(dtype).max / 2
        assert bool(torch.isfinite(g.grades.grad).all()) or not room


@SETTINGS
@given(dtype=st.sampled_from(DTYPES), lam=st.floats(1.0 + 2**-10, 16.0),
       grades=st.lists(st.floats(-40.0, 40.0), min_size=1, max_size=4))
def test_learnable_exponential_grades_below_zero_give_scale_one_and_a_finite_gradient(
        dtype, lam, grades):
    """The floor of learnable EGT grades: max(q, 0), straight-through (the gradient of λ^q at
    the floored q, ln λ·λ^max(q,0), finite); above the cap the exponent is clamped, the scale
    is exp(cap) and the gradient 0 (a clamp's)."""
    q = rounded(grades, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = ExponentialGrading(len(grades), q, base=lam, learnable=True, dtype=dtype)
        s = g.scales()
    neg = q < 0
    assert bool((s[neg] == 1).all()) and bool((s >= 1).all())
    s.double().sum().backward()
    grad = g.grades.grad.double()
    assert bool(torch.isfinite(grad).all())
    lam32 = float(torch.tensor(lam, dtype=torch.promote_types(dtype, F32)))
    cap = 0.5 * math.log(torch.finfo(dtype).max) - 1.0
    clamped = q.double() * math.log(lam32) > cap
    want = torch.where(clamped, 0.0, math.log(lam32) * s.double())
    torch.testing.assert_close(grad, want.to(dtype).double(), rtol=2 * torch.finfo(dtype).eps,
                               atol=0.0)


@SETTINGS
@given(dtype=st.sampled_from(DTYPES), lam=st.floats(1.0 + 2**-10, 16.0),
       grades=grades_in(0.0, 60.0))
def test_exponential_scale_of_the_grades_is_scales(dtype, lam, grades):
    """``scale_of`` is the function ``scales`` applies to fixed grades, bit for bit (clamped
    grades included: the same cap, the grades' dtype)."""
    q = rounded(grades, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = ExponentialGrading(len(grades), q, base=lam, dtype=dtype)
        assert torch.equal(g.scale_of(g.grades), g.scales())


@SETTINGS
@given(grades=grades_in(0.0, 40.0), lam=st.floats(1.0 + 2**-10, 16.0),
       grading_dtype=st.sampled_from([F16, BF16, F32]))
@example(grades=[10.0], lam=2.0, grading_dtype=F32)  # was 1024.0000195: ln 2 in float32
def test_scale_of_a_float64_grade_is_lambda_to_the_q_in_float64(grades, lam, grading_dtype):
    """λ is held in float32 (its value: the float32 one); λ^q of a float64 q is computed in
    float64 from it, ln λ included. Before, ln λ was taken in float32 and widened: 2^10 was
    1024.0000195 (a relative error 2e-8, 10^8 units in the last place of float64)."""
    g = ExponentialGrading(len(grades), base=lam, dtype=grading_dtype)
    lam_held = float(g.base)
    q = torch.tensor(grades, dtype=F64)
    got = g.scale_of(q)
    assert got.dtype == F64
    want = torch.tensor([math.pow(lam_held, v) for v in grades], dtype=F64)
    exponents = torch.tensor([v * math.log(lam_held) for v in grades], dtype=F64)
    # exp of a float64 exponent: one rounding of it, amplified by its size
    assert bool(((got - want).abs() <= 8e-16 * (1 + exponents) * want).all()), (got - want)


@SETTINGS
@given(kind=st.sampled_from(["linear", "exponential"]),
       target=st.sampled_from([F16, BF16, F64]), grades=grades_in(0.0, 30.0),
       lam=st.floats(1.0 + 2**-10, 4.0), learnable=st.booleans())
def test_a_cast_grading_equals_one_built_in_the_target_dtype(kind, target, grades, lam,
                                                             learnable):
    """``.to(dtype)`` (and ``.double()``) of a float32 grading: its scales are those of a
    grading built from the cast grades in that dtype (λ kept at float32 precision at least,
    a float64 cast carrying the float32 λ along), in that dtype; the scales kept before the
    cast are not returned after it."""
    def build(dtype, q):
        if kind == "linear":
            return LinearGrading(len(grades), q, learnable=learnable, dtype=dtype)
        return ExponentialGrading(len(grades), q, base=lam, learnable=learnable, dtype=dtype)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = build(F32, torch.tensor(grades, dtype=F32))
        before = g.scales()
        cast = g.double() if target == F64 else copy.deepcopy(g).to(target)
        q = torch.tensor(grades, dtype=F32).to(target)
        direct = build(target, q)
        if kind == "exponential":
            direct.set_base(float(g.base))
            assert cast.base.dtype == torch.promote_types(target, F32)
            assert float(cast.base) == float(g.base)
        got = cast.scales()
        want = direct.scales()
    assert got.dtype == target and before.dtype == F32
    assert torch.equal(got, want)
    if learnable:
        got.double().sum().backward()
        assert bool(torch.isfinite(cast.grades.grad).all())
        assert cast.grades.grad.dtype == target


@SETTINGS
@given(kind=st.sampled_from(["linear", "exponential"]), f=st.sampled_from(list(DOMAINS)),
       dtype=st.sampled_from(DTYPES), mult_dtype=st.sampled_from(DTYPES),
       grades=grades_in(0.01, 1e3), mults=st.lists(st.floats(0.0, 1e3), min_size=1,
                                                    max_size=3),
       learnable=st.booleans(), autocast=st.sampled_from([None, BF16, F16]))
@example(kind="linear", f="shift", dtype=F16, mult_dtype=F16, grades=[1.0], mults=[1.0],
         learnable=False, autocast=BF16)  # torch.stack under autocast failed on float16
def test_scales_at_and_stacked_scales_agree_with_scales(kind, f, dtype, mult_dtype, grades,
                                                        mults, learnable, autocast):
    """``scales_at(s)`` is finite, in the dtype of s·q, positive (but f(0) = 0 for identity),
    and ``scales()`` at s = 1; the rows of ``stacked_scales`` are each grading's ``scales()``
    bit for bit, under autocast too. Before, a float16 grading under a bfloat16 autocast (or
    the reverse) failed in ``torch.stack`` ("Unexpected floating ScalarType")."""
    q = rounded(grades, dtype)
    s = rounded(mults, mult_dtype)
    assume(bool(torch.isfinite(q).all()) and bool(torch.isfinite(s).all()))

    def build(offset: float):
        if kind == "linear":
            return LinearGrading(len(grades), q + offset, f=f, learnable=learnable, dtype=dtype)
        return ExponentialGrading(len(grades), q + offset, base=1.5, learnable=learnable,
                                  dtype=dtype)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        gradings = [build(0.0), build(1.0)]
        with torch.autocast("cpu", dtype=autocast or BF16, enabled=autocast is not None):
            at = gradings[0].scales_at(s)
            at_one = gradings[0].scales_at(torch.ones(1, dtype=dtype))
            each = [g.scales() for g in gradings]
            stacked = stacked_scales(gradings)
    assert at.dtype == torch.promote_types(mult_dtype, dtype)
    assert at.shape == (len(mults), len(grades))
    assert bool(torch.isfinite(at).all())
    positive = at > 0
    if kind == "linear" and f == "identity" and not learnable:
        positive |= (s == 0)[:, None]
    assert bool(positive.all()), at.tolist()
    assert torch.equal(at_one[0], each[0])
    for row, scales in zip(stacked.unbind(0), each, strict=True):
        assert torch.equal(row, scales)


def test_bfloat16_scales_under_a_float16_autocast_stay_below_the_float16_maximum():
    """A raised max_log_scale is lowered to what the compute dtype (float16 here) holds, for
    the scale as rounded to the grades' dtype: exp(ln 65504) rounds to 65536 in bfloat16,
    which a float16 autocast made inf. The cap is the largest bfloat16 value below 65504."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = ExponentialGrading(2, [16.0, 3.0], base=2.0, max_log_scale=12.0, dtype=BF16)
        with torch.autocast("cpu", dtype=F16):
            s = g.scales()
            at = g.scales_at(torch.tensor([1.0], dtype=BF16))
    assert s.dtype == BF16
    assert s.tolist() == [65280.0, 8.0]  # 65280: the bfloat16 value below 65504
    assert bool(torch.isfinite(s.to(F16)).all()) and bool(torch.isfinite(at.to(F16)).all())


@pytest.mark.parametrize("dtype", [F32, F64])
def test_scales_at_zero_multiplier_of_a_grade_whose_exponent_overflows_is_one(dtype):
    """λ^{0·q} = 1 for every finite grade: q·ln λ of q = 0.4·max overflowed to inf, and s = 0
    times inf was NaN. A positive multiplier gives the capped scale."""
    top = 0.4 * torch.finfo(dtype).max
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = ExponentialGrading(2, [top, 1.0], base=207321.0, dtype=dtype)
        at = g.scales_at(torch.tensor([0.0, 1.0], dtype=dtype))
        scales = g.scales()
    assert torch.equal(at[0], torch.ones(2, dtype=dtype))
    assert torch.equal(at[1], scales)
    assert bool(torch.isfinite(at).all())
