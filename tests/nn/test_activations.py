import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.algebra import GradedSpace
from graded.nn import GradedExp, GradedReLU, graded_exp, graded_relu, signed_power
from graded.nn.activations import DEFAULT_MAX_SLOPE, evaluated_grades

F64 = torch.float64
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)


def naive_relu(x, q, mode):
    out = []
    for v, g in zip(x, q):
        root = abs(v) ** (1 / g)
        if mode == "abs":
            out.append(max(0.0, root))
        elif mode == "threshold":
            out.append(max(0.0, math.copysign(root, v) if v != 0 else 0.0))
        else:
            out.append(math.copysign(root, v) if v != 0 else 0.0)
    return out


@pytest.mark.parametrize("mode", ["abs", "threshold", "odd"])
def test_graded_relu_equals_naive_loop(mode):
    q = [0.5, 1.0, 2.0, 3.0, 1.5]
    x = torch.tensor([[-2.0, 0.7, -0.3, 8.0, 0.0], [1.0, -1.5, 4.0, -27.0, 2.0]], dtype=F64)
    expected = torch.tensor([naive_relu(row, q, mode) for row in x.tolist()], dtype=F64)
    torch.testing.assert_close(graded_relu(x, q, mode=mode), expected)
    torch.testing.assert_close(GradedReLU(q, mode, dtype=F64)(x), expected)


def test_graded_relu_with_unit_grades_is_abs_relu_and_identity():
    x = torch.randn(4, 6, dtype=F64)
    ones = torch.ones(6, dtype=F64)
    torch.testing.assert_close(graded_relu(x, ones), x.abs())
    torch.testing.assert_close(graded_relu(x, ones, mode="threshold"), torch.relu(x))
    torch.testing.assert_close(graded_relu(x, ones, mode="odd"), x)


@SETTINGS
@given(grades=st.lists(st.integers(1, 4), min_size=1, max_size=5),
       lam=st.one_of(st.floats(-4, -0.25), st.floats(0.25, 4)), data=st.data())
def test_graded_relu_of_lambda_action_is_abs_lambda_times_relu(grades, lam, data):
    # 000 §3.1: ReLU(λ⋆x) = |λ|·ReLU(x), for every λ ≠ 0 (integer grades allow λ < 0).
    space = GradedSpace(grades)
    x = torch.tensor(data.draw(st.lists(st.floats(-5, 5), min_size=len(grades),
                                        max_size=len(grades))), dtype=F64)
    q = torch.tensor(grades, dtype=F64)
    torch.testing.assert_close(graded_relu(space.act(lam, x), q), abs(lam) * graded_relu(x, q),
                               rtol=1e-9, atol=1e-12)


@SETTINGS
@given(grades=st.lists(st.floats(0.3, 4.0), min_size=1, max_size=5), lam=st.floats(0.25, 4),
       mode=st.sampled_from(["threshold", "odd"]), data=st.data())
def test_threshold_and_odd_variants_are_homogeneous_for_positive_lambda(grades, lam, mode, data):
    space = GradedSpace(grades)
    x = torch.tensor(data.draw(st.lists(st.floats(-5, 5), min_size=len(grades),
                                        max_size=len(grades))), dtype=F64)
    q = torch.tensor(grades, dtype=F64)
    torch.testing.assert_close(graded_relu(space.act(lam, x), q, mode=mode),
                               lam * graded_relu(x, q, mode=mode), rtol=1e-9, atol=1e-12)


def test_graded_exp_equals_naive_loop_and_is_precise_near_zero():
    q = [0.5, 1.0, 4.0]
    x = torch.tensor([[1.0, -2.0, 3.0], [1e-12, 0.0, -1e-10]], dtype=F64)
    expected = torch.tensor([[math.expm1(v / g) for v, g in zip(row, q)] for row in x.tolist()],
                            dtype=F64)
    torch.testing.assert_close(graded_exp(x, q), expected, rtol=1e-14, atol=0)
    torch.testing.assert_close(GradedExp(q, dtype=F64)(x), expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("mode", ["abs", "threshold", "odd"])
def test_gradients_are_finite_at_zero_for_all_grades(mode):
    x = torch.zeros(4, dtype=F64, requires_grad=True)
    q = torch.tensor([0.5, 1.0, 2.0, 10.0], dtype=F64, requires_grad=True)
    graded_relu(x, q, mode=mode).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(q.grad).all()
    y = torch.zeros(4, dtype=F64, requires_grad=True)
    graded_exp(y, q.detach()).sum().backward()
    torch.testing.assert_close(y.grad, 1 / q.detach())


def test_signed_power_is_exact_forward_with_capped_slope():
    x = torch.tensor([-8.0, -1e-30, 0.0, 1e-30, 27.0], dtype=F64, requires_grad=True)
    y = signed_power(x, 1 / 3, max_slope=50.0)
    torch.testing.assert_close(y[[0, 4]], torch.tensor([-2.0, 3.0], dtype=F64))
    y.sum().backward()
    assert x.grad.abs().max() <= 50.0
    torch.testing.assert_close(x.grad[[0, 4]], torch.tensor([1 / 12, 1 / 27], dtype=F64))
    ident = torch.randn(5, dtype=F64)
    assert torch.equal(signed_power(ident, 1.0), ident)  # q = 1 is the identity, bit for bit


def test_slope_of_powers_at_least_one_is_exact_at_large_inputs():
    # the slope cap guards the infinite slope of |x|^p, p < 1, at 0; for p >= 1 the slope
    # p|x|^{p-1} at a large |x| is the true derivative and must not be cut at max_slope
    x = torch.tensor([-100.0, 50.0, 3.0], dtype=F64, requires_grad=True)
    q = torch.tensor([0.25, 0.5, 0.1], dtype=F64)  # p = 1/q = 4, 2, 10
    for mode in ("abs", "threshold", "odd"):
        x.grad = None
        graded_relu(x, q, mode=mode).sum().backward()
        p = [4.0, 2.0, 10.0]
        slopes = [pi * abs(v) ** (pi - 1) for pi, v in zip(p, x.tolist())]
        signs = [-1.0, 1.0, 1.0] if mode == "abs" else [1.0, 1.0, 1.0]
        if mode == "threshold":  # relu of the odd power: zero slope where x < 0
            signs[0] = 0.0
        expected = torch.tensor([s * d for s, d in zip(signs, slopes)], dtype=F64)
        torch.testing.assert_close(x.grad, expected)
        assert float(x.grad.abs().max()) > DEFAULT_MAX_SLOPE  # 4·10^6 and 1.97·10^5 exceed it
    # the cap still applies to p < 1 near 0
    z = torch.tensor([1e-30], dtype=F64, requires_grad=True)
    signed_power(z, 0.5, max_slope=7.0).sum().backward()
    assert float(z.grad) == 7.0
    with pytest.raises(ValueError, match=r"max_slope must be a positive number, got -1\.0"):
        signed_power(z, 0.5, max_slope=-1.0)


@pytest.mark.parametrize("mode", ["abs", "threshold", "odd"])
def test_gradcheck_graded_relu_wrt_input_and_grades(mode):
    x = torch.tensor([[-1.3, 0.4, 2.2], [0.8, -0.6, 1.7]], dtype=F64, requires_grad=True)
    q = torch.tensor([0.7, 1.5, 2.5], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: graded_relu(a, b, mode=mode), (x, q))


def test_gradcheck_graded_exp_wrt_input_and_learnable_grades():
    act = GradedExp([0.7, 1.5, 2.5], learnable=True, dtype=F64)
    x = torch.randn(2, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, q: act(a), (x, act.grades))


def test_bad_grades_raise_errors_naming_the_value():
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"q > 0, got -1\.0 at index 1"):
        graded_relu(x, [1.0, -1.0, 2.0])
    with pytest.raises(ValueError, match=r"q > 0, got 0\.0 at index 2"):
        graded_exp(x, [1.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"length 2 .* dim=3"):
        graded_relu(x, [1.0, 2.0])
    with pytest.raises(ValueError, match="nan at index 0"):
        graded_exp(x, [float("nan"), 1.0, 1.0])
    with pytest.raises(ValueError, match="mode"):
        GradedReLU([1.0], mode="leaky")
    with pytest.raises(ValueError, match=r"got -2\.0"):
        GradedReLU([1.0, -2.0])
    with pytest.raises(ValueError, match="expected 2 features"):
        GradedExp([1.0, 2.0])(torch.ones(3))
    with pytest.raises(ValueError, match="finite max_slope > 0, got 0"):
        GradedReLU([1.0, 2.0], max_slope=0)


def test_graded_activations_refuse_an_integer_x_instead_of_truncating_the_exponents():
    # 1/q = 0.5 took x's integer dtype and became 0, so graded_relu((4, 9), q = 2) was (1, 1);
    # graded_exp truncated q = 1.5 to 1. The float values are the naive ones.
    x = torch.tensor([4, 9, -8])
    q = [2.0, 2.0, 3.0]
    assert graded_relu(x.double(), q, mode="odd").tolist() == naive_relu([4, 9, -8], q, "odd")
    assert math.isclose(float(graded_exp(x.double(), [1.5, 2.0, 3.0])[0]), math.expm1(4 / 1.5))
    for call in (lambda: graded_relu(x, q), lambda: graded_exp(x, [1.5, 2.0, 3.0]),
                 lambda: GradedReLU(q)(x), lambda: GradedExp(q)(x)):
        with pytest.raises(TypeError, match=r"floating-point x, got torch\.int64"):
            call()
    with pytest.raises(TypeError, match=r"floating-point x, got torch\.int64"):
        signed_power(x, 0.5)


def test_learnable_activation_grades_below_the_floor_stay_finite():
    act = GradedReLU([1.0, 2.0], learnable=True)
    with torch.no_grad():
        act.grades[1] = -1.0
    out = act(torch.tensor([0.5, 0.5]))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(act.grades.grad).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, F64])
def test_learnable_activation_grades_below_the_floor_are_evaluated_at_it_exactly(dtype):
    """A grade below ``min_grade`` is evaluated at min_grade itself. It was computed as
    q − min(q − floor, 0), which rounds q − floor: in bfloat16 −0.5 − 0.001 is −0.5, so the
    grade came out 0 and exp(x/q) − 1 at x = 0 was NaN (0/0) instead of 0."""
    act = GradedExp([1.0, 1.0, 1.0], learnable=True, dtype=dtype)
    with torch.no_grad():
        act.grades.copy_(torch.tensor([-0.5, -40.0, 2.0]))
    floor = torch.tensor(act.min_grade, dtype=dtype).item()
    assert evaluated_grades(act).tolist() == [floor, floor, 2.0]
    out = act(torch.zeros(1, 3, dtype=dtype))
    assert out.tolist() == [[0.0, 0.0, 0.0]]
    x = torch.full((1, 3), 1e-3, dtype=dtype)
    act(x).sum().backward()  # straight-through: d/dq of exp(x/q) − 1 at the floor
    q = torch.tensor([floor, floor, 2.0], dtype=F64)
    want = -x.double() / q**2 * torch.exp(x.double() / q)
    torch.testing.assert_close(act.grades.grad.double(), want[0], rtol=2e-2, atol=0)


@pytest.mark.parametrize("module", [GradedReLU, GradedExp])
def test_a_single_grade_without_features_names_the_missing_argument(module):
    # the message spoke of a "dim" that the activations do not have
    with pytest.raises(ValueError, match=rf"{module.__name__} got the single grade 2.0 and no "
                                         r"features="):
        module(2.0)
    assert module(2.0, features=3).grades.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_activations_are_the_float64_values_rounded_once(dtype):
    # computed in the input's dtype, 1/q = 1/3 became 0.334 in bfloat16 and x/q was rounded
    # before exp: errors up to 6.6 eps (5%) for x ~ N(0, 1); now within one eps of the float64
    # value on the same input, in the input's dtype, with gradients in it too
    torch.manual_seed(0)
    q = torch.tensor([0.3, 0.7, 1.1, 3.0, 7.0])
    x = torch.randn(4000, 5).to(dtype)
    eps = torch.finfo(dtype).eps
    for f in (graded_relu, graded_exp, lambda v, g: graded_relu(v, g, mode="threshold")):
        got = f(x, q)
        assert got.dtype == dtype
        ref = f(x.double(), q.double())
        # values the dtype holds as normal numbers (float16 underflows |x|^{1/0.3} of small x)
        keep = (ref.abs() >= torch.finfo(dtype).tiny) & (ref.abs() <= torch.finfo(dtype).max)
        err = (got.double() - ref).abs()[keep] / ref.abs()[keep]
        assert float(err.max()) <= eps, float(err.max() / eps)
    w = torch.randn(64, dtype=F64).to(dtype)
    torch.testing.assert_close(signed_power(w, 1 / 3).double(),
                               signed_power(w.double(), 1 / 3).to(dtype).double(),
                               rtol=eps, atol=0)
    xr = x.clone().requires_grad_()
    graded_relu(xr, q).sum().backward()
    assert xr.grad.dtype == dtype
