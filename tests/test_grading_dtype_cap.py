"""Every scale of a grading is finite in the dtype it is computed for: a ``max_log_scale``
above the largest exponent whose exp that dtype holds is lowered to it (float16 and bfloat16
grades, CPU autocast in bfloat16), and LGT's per-token scales saturate instead of overflowing.
The expected values are worked out by hand from ``math`` and the dtype's largest value."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from graded.grading import ExponentialGrading, LinearGrading, stacked_scales

HALF = [torch.float16, torch.bfloat16]


def _by_hand(exponent: float, cap: float, dtype: torch.dtype) -> torch.Tensor:
    """exp(min(exponent, cap)) in float64, rounded once to ``dtype``."""
    return torch.tensor(math.exp(min(exponent, cap)), dtype=torch.float64).to(dtype)


def _grading(dtype: torch.dtype, cap: float, grades=(0.0, 10.0, 200.0)) -> ExponentialGrading:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ExponentialGrading(len(grades), list(grades), base=2.0, max_log_scale=cap,
                                  dtype=dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_a_cap_above_what_a_half_dtype_holds_gives_its_largest_value(dtype):
    """max_log_scale=100 in bfloat16, 20 in float16: exp of either is inf there; the
    clamped scale is min(cap, ln max) by hand, the dtype's largest value."""
    cap = 20.0 if dtype == torch.float16 else 100.0
    g = _grading(dtype, cap)
    top = math.log(torch.finfo(dtype).max)
    assert cap > top  # the user's cap is beyond what the dtype holds
    expected = torch.stack([_by_hand(q * math.log(2.0), min(cap, top), dtype)
                            for q in (0.0, 10.0, 200.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        s = g.scales()
    assert s.dtype == dtype and bool(torch.isfinite(s).all())
    assert torch.equal(s, expected)
    assert float(s[2]) == torch.finfo(dtype).max
    assert bool(torch.isfinite(g.inverse_scales()).all())
    assert float(g.inverse_scales()[2]) > 0.0  # exp(−cap), not underflowed to 0


@pytest.mark.parametrize("dtype", HALF)
def test_every_scale_entry_point_is_finite_in_a_half_dtype(dtype):
    cap = 20.0 if dtype == torch.float16 else 100.0
    g, h = _grading(dtype, cap), _grading(dtype, cap, grades=(1.0, 300.0, 2.0))
    q = torch.tensor([0.0, 3.0, 500.0], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outs = {"scale_of": g.scale_of(q),
                "scales_at": g.scales_at(torch.tensor([1.0, 4.0], dtype=dtype)),
                "inverse_scales": g.inverse_scales(),
                "stacked_scales": stacked_scales([g, h])}
    for name, out in outs.items():
        assert bool(torch.isfinite(out).all()), (name, out)
    largest = torch.finfo(dtype).max
    assert float(outs["scale_of"][2]) == largest
    assert float(outs["stacked_scales"][1, 1]) == largest


def test_a_cap_the_dtype_holds_is_kept_also_above_the_default():
    """max_log_scale below ln max is the cap, also above the default ½ ln max − 1 (4.54 in
    float16): exp(8) and exp(3), by hand."""
    for cap in (8.0, 3.0):
        g = _grading(torch.float16, cap, grades=(0.0, 20.0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert torch.equal(g.scales(), torch.stack([_by_hand(0.0, cap, torch.float16),
                                                        _by_hand(20.0 * math.log(2.0), cap,
                                                                 torch.float16)]))
    g = _grading(torch.bfloat16, 20.0)  # exp(20) ≈ 4.85e8 is finite in bfloat16: kept
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert float(g.scales()[2]) == float(_by_hand(1e9, 20.0, torch.bfloat16))


def test_under_cpu_autocast_bfloat16_a_float32_grading_is_capped_for_bfloat16():
    """float32 grades, max_log_scale=100 (exp(100) is inf in float32 too): inside a bfloat16
    autocast region the cap is ln of bfloat16's largest value, so the float32 scale rounds to
    that value, not to inf."""
    g = _grading(torch.float32, 100.0)
    top = math.log(torch.finfo(torch.bfloat16).max)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            s = g.scales()
            at = g.scales_at(torch.tensor([1.0]))
        plain = g.scales()
    assert s.dtype == torch.float32 and bool(torch.isfinite(s).all())
    assert float(s[2]) == pytest.approx(math.exp(top), rel=2e-4)
    assert float(s[2].to(torch.bfloat16)) == torch.finfo(torch.bfloat16).max
    assert bool(torch.isfinite(at.to(torch.bfloat16)).all())
    # outside autocast the float32 bound: ln of float32's largest value
    assert bool(torch.isfinite(plain).all())
    assert float(plain[2]) == pytest.approx(torch.finfo(torch.float32).max, rel=2e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_cap_beyond_a_wide_dtype_gives_a_finite_scale(dtype):
    """exp of ln(max) rounded to float32 is inf in float32: the bound sits just below it."""
    cap = 100.0 if dtype == torch.float32 else 1000.0
    g = _grading(dtype, cap, grades=(0.0, 2000.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        s = g.scales()
        w = g.scale_of(torch.tensor([2000.0], dtype=dtype))
    assert bool(torch.isfinite(s).all()) and bool(torch.isfinite(w).all())
    assert float(s[1]) == pytest.approx(torch.finfo(dtype).max, rel=1e-3)


def test_the_warning_says_the_cap_was_lowered():
    with pytest.warns(RuntimeWarning, match=r"above max_log_scale=20 lowered to 11\.09, the "
                                            r"largest exponent whose exp is finite in "
                                            r"torch\.float16"):
        ExponentialGrading(2, [0.0, 40.0], max_log_scale=20.0, dtype=torch.float16)


def test_a_cap_the_dtype_holds_warns_as_before():
    with pytest.warns(RuntimeWarning, match=r"above max_log_scale=3; scales are clamped"):
        ExponentialGrading(2, [0.0, 40.0], max_log_scale=3.0, dtype=torch.float16)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("f", ["shift", "abs_shift", "softplus", "identity"])
def test_linear_per_token_scales_saturate_in_a_half_dtype(dtype, f):
    """s·q = 300·300 is beyond float16: f(s·q) is float16's largest value, not inf; in
    bfloat16 it is finite anyway, f(90000) rounded once."""
    g = LinearGrading(2, [300.0, 2.0], f=f, dtype=dtype)
    s = g.scales_at(torch.tensor([300.0, 1.0], dtype=dtype))
    assert s.dtype == dtype and bool(torch.isfinite(s).all())
    raw = {"shift": 90001.0, "abs_shift": 90001.0, "softplus": 90000.0, "identity": 90000.0}[f]
    largest = torch.finfo(dtype).max
    expected = torch.tensor(min(raw, largest), dtype=torch.float64).to(dtype)
    assert torch.equal(s[0, 0], expected)
