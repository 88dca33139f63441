"""The scales of a grading with bfloat16 or float16 grades are computed in float32 and rounded
once to the grades' dtype.

Computed in the half dtype, ln 2 was rounded to 0.6914, q·ln λ rounded again and its exp a
third time: in bfloat16 2^10 came out as 1000 and 2^4 as 15.875, in float16 2^3 as 8.0078.
The references are float64 values computed independently (``math.pow``, a float64 softplus),
rounded once to the narrow dtype.
"""

import math

import pytest
import torch

from graded.grading import ExponentialGrading, LinearGrading, stacked_scales

BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
NARROW = [BF16, F16]


def rounded_once(values, dtype):
    """float64 ``values`` rounded once to ``dtype``."""
    return torch.as_tensor(values, dtype=F64).to(dtype)


def off_ties(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where the float64 ``ref`` is not within float32 rounding (a few units in the last
    place) of a tie between two neighbours in ``dtype``: there any correctly computed float32
    value rounds to the same neighbour as the float64 one."""
    near = ref.to(dtype)
    up = torch.nextafter(near, torch.full_like(near, math.inf)).double()
    down = torch.nextafter(near, torch.full_like(near, -math.inf)).double()
    near = near.double()
    tie = torch.where(ref >= near, (near + up) / 2, (near + down) / 2)
    return (ref - tie).abs() > 1e-5 * ref.abs()


def pow_by_hand(lam, grades):
    """λ^q for each q of a list (or a list of lists), in float64."""
    if grades and isinstance(grades[0], list):
        return torch.stack([pow_by_hand(lam, row) for row in grades])
    return torch.tensor([math.pow(lam, q) for q in grades], dtype=F64)


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("lam", [2.0, 3.0, 1.5])
def test_exponential_scales_of_integer_grades_are_the_powers_rounded_once(dtype, lam):
    top = 10 if dtype == BF16 else 4  # float16: the default cap is e^4.5 ≈ 94
    q = [float(k) for k in range(top + 1)]
    grading = ExponentialGrading(len(q), q, base=lam).to(dtype)
    assert math.exp(grading._cap()) > lam**top  # no clamp in these cases
    want = rounded_once(pow_by_hand(lam, q), dtype)
    got = grading.scales()
    assert got.dtype == dtype
    assert torch.equal(got, want), (got.tolist(), want.tolist())  # bf16 2^10 was 1000
    inverse = grading.inverse_scales()
    assert inverse.dtype == dtype
    assert torch.equal(inverse, rounded_once(1.0 / pow_by_hand(lam, q), dtype))


@pytest.mark.parametrize("dtype", NARROW)
def test_exponential_scales_of_any_grades_are_correctly_rounded(dtype):
    torch.manual_seed(0)
    q = (torch.rand(2, 64, dtype=F64) * 6).to(dtype)  # per-head grades, within the caps
    grading = ExponentialGrading(64, q, base=1.7, num_heads=2)
    assert grading.grades.dtype == dtype
    ref = pow_by_hand(1.7, q.double().tolist())
    sure = off_ties(ref, dtype)
    assert sure.float().mean() > 0.9
    got = grading.scales()
    assert torch.equal(got[sure], rounded_once(ref, dtype)[sure])


def test_the_exponential_scales_at_multipliers_are_rounded_once():
    # the per-token grades s·q of TokenGrading: s·q·ln λ in float32, one rounding at the end
    q = [0.0, 1.0, 2.0, 3.0]
    grading = ExponentialGrading(4, q, base=2.0).bfloat16()
    s = torch.tensor([[1.0, 2.0], [0.5, 3.0]], dtype=BF16)
    got = grading.scales_at(s)
    assert got.dtype == BF16 and got.shape == (2, 2, 4)
    want = torch.tensor([[[math.pow(2.0, float(si) * qk) for qk in q] for si in row]
                         for row in s.tolist()], dtype=F64)
    assert torch.equal(got, want.to(BF16))  # 2^9 was 502
    assert torch.equal(grading.scales_at(None), grading.scales())


@pytest.mark.parametrize("dtype", NARROW)
def test_a_clamped_narrow_scale_is_finite_and_the_cap_rounded_once(dtype):
    with pytest.warns(RuntimeWarning, match="clamp"):
        grading = ExponentialGrading(3, [0.0, 1.0, 300.0], base=2.0, dtype=dtype)
        got = grading.scales()
    cap = 0.5 * math.log(torch.finfo(dtype).max) - 1.0
    assert torch.isfinite(got).all() and torch.isfinite(grading.inverse_scales()).all()
    assert got[:2].tolist() == [1.0, 2.0]
    # exp(cap) of the float32 cap, rounded once (float16: 94.125; was 94.3125 in float16)
    assert got[2] == torch.exp(torch.tensor(cap, dtype=F32)).to(dtype)
    assert got[2] == rounded_once(math.exp(cap), dtype)


def test_the_kept_scales_of_a_bfloat16_grading_are_returned_again_and_follow_changes():
    grading = ExponentialGrading(3, [0.0, 4.0, 10.0], base=2.0).bfloat16()
    first = grading.scales()
    assert grading.scales() is first  # kept: fixed grades, nothing changed
    assert first.tolist() == [1.0, 16.0, 1024.0]
    grading.set_grades([1.0, 7.0, 9.0])
    assert grading.scales().tolist() == [2.0, 128.0, 512.0]  # 2^7 was 127, 2^9 was 502
    grading.set_base(3.0)
    assert torch.equal(grading.scales(), rounded_once([3.0, 3.0**7, 3.0**9], BF16))


@pytest.mark.parametrize("kind", ["exponential", "linear"])
def test_stacked_bfloat16_scales_are_each_gradings_scales_rounded_once(kind):
    # a model's head gradings, computed together, and the rows they are handed back
    grades = [[0.0, 4.0, 7.0, 10.0], [1.0, 3.0, 5.0, 9.0]]
    if kind == "exponential":
        gs = [ExponentialGrading(4, q, base=2.0).bfloat16() for q in grades]
        want = torch.stack([pow_by_hand(2.0, q) for q in grades]).to(BF16)
    else:
        gs = [LinearGrading(4, [qk * 1.3 for qk in q], f="softplus").bfloat16() for q in grades]
        want = torch.nn.functional.softplus(
            torch.stack([g.grades for g in gs]).double()).to(BF16)
    stacked = stacked_scales(gs)
    assert stacked is not None and stacked.dtype == BF16
    assert torch.equal(stacked, want)
    key = gs[0]._memo_key(gs[0].grades)
    for i, g in enumerate(gs):
        assert g._hold_given_scales(stacked, i, key=key)
        assert torch.equal(g.scales(), want[i]) and g.scales()._base is stacked
        g._drop_scales()
        assert torch.equal(g.scales(), want[i])  # computed alone: the same values


def test_the_gradient_reaches_bfloat16_grades_computed_in_float32():
    # d λ^q / dq = λ^q·ln λ: in float32 and rounded once to the grades' dtype
    q = [0.0, 3.0, 7.0, 10.0]
    grading = ExponentialGrading(4, q, base=2.0, learnable=True).bfloat16()
    assert grading.grades.dtype == BF16 and grading.grades.requires_grad
    scales = grading.scales()
    assert scales.dtype == BF16 and scales.tolist() == [1.0, 8.0, 128.0, 1024.0]
    scales.sum().backward()
    assert grading.grades.grad is not None and grading.grades.grad.dtype == BF16
    want = torch.tensor([math.pow(2.0, k) * math.log(2.0) for k in q], dtype=F64).to(BF16)
    assert torch.equal(grading.grades.grad, want)  # was 1000·0.6914 = 692 for q = 10


def test_linear_scales_at_bfloat16_multipliers_are_rounded_once():
    # s·q and s·q + 1 were each rounded: 1.1·1.3 + 1 came out as 2.4375, not 2.421875
    grading = LinearGrading(1, [1.3], f="shift").bfloat16()
    got = grading.scales_at(torch.tensor([1.1], dtype=BF16))
    assert got.dtype == BF16 and got.item() == 2.421875
    torch.manual_seed(1)
    q = (torch.rand(32, dtype=F64) * 4).to(BF16)
    s = (torch.rand(8, dtype=F64) * 3).to(BF16)
    for f in ("shift", "abs_shift", "softplus", "identity"):
        for learnable in (False, True):
            g = LinearGrading(32, q + 0.01, f=f, learnable=learnable)
            x = s.double().unsqueeze(-1) * g.grades.detach().double()
            ref = {"shift": x + 1.0, "abs_shift": x.abs() + 1.0, "identity": x,
                   "softplus": torch.nn.functional.softplus(x)}[f]
            sure = off_ties(ref, BF16)
            got = g.scales_at(s)
            assert got.dtype == BF16
            assert torch.equal(got[sure], ref.to(BF16)[sure]), (f, learnable)
            if learnable:  # the gradient reaches the bfloat16 grades: d f(s·q)/dq = s·f'(s·q)
                got.sum().backward()
                assert g.grades.grad is not None and g.grades.grad.dtype == BF16
