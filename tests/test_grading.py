import math
import warnings

import pytest
import torch

from graded.grading import ExponentialGrading, LinearGrading, shared_scales

F64 = torch.float64


def naive_f(f, q):
    if f == "shift":
        return q + 1
    if f == "abs_shift":
        return abs(q) + 1
    if f == "softplus":
        return math.log1p(math.exp(q))
    return q


@pytest.mark.parametrize("f", ["shift", "abs_shift", "softplus", "identity"])
def test_linear_scales_equal_f_of_each_grade(f):
    grades = [0.5, 1.0, 2.5, 0.25] if f == "identity" else [-0.5, 0.0, 1.0, 2.5]
    g = LinearGrading(4, grades, f=f, dtype=F64)
    expected = torch.tensor([naive_f(f, q) for q in grades], dtype=F64)
    torch.testing.assert_close(g.scales(), expected)
    torch.testing.assert_close(g.inverse_scales(), 1 / expected)


def test_default_grades_give_unit_scales_for_every_f():
    for f in ["shift", "abs_shift", "identity"]:
        assert torch.equal(LinearGrading(5, f=f).scales(), torch.ones(5))
    torch.testing.assert_close(LinearGrading(5, f="softplus").scales(), torch.ones(5))
    assert torch.equal(ExponentialGrading(5).scales(), torch.ones(5))


def test_photonic_example_5_20_and_5_35_normalised_input():
    # 000 Ex. 5.20 / 5.35: x = [1, 0.5, 0.1], q_i = 1 + 0.1 i, M_q x = [1, 0.55, 0.12],
    # x'' = M_q x / ||M_q x|| ≈ [0.871, 0.479, 0.105], ||M_q x|| ≈ 1.148.
    g = LinearGrading(3, [1.0, 1.1, 1.2], f="identity", dtype=F64)
    x = torch.tensor([1.0, 0.5, 0.1], dtype=F64)
    mx = g(x)
    torch.testing.assert_close(mx, torch.tensor([1.0, 0.55, 0.12], dtype=F64))
    assert abs(float(mx.norm()) - 1.148) < 5e-4
    normed = mx / mx.norm()
    torch.testing.assert_close(normed, torch.tensor([0.871, 0.479, 0.105], dtype=F64),
                               atol=6e-4, rtol=0)


def test_identity_grading_rejects_non_positive_grades_naming_the_value():
    with pytest.raises(ValueError, match=r"-0\.5"):
        LinearGrading(3, [1.0, -0.5, 2.0], f="identity")
    with pytest.raises(ValueError, match="q > -1"):
        LinearGrading(2, [-1.0, 0.0], f="shift")


@pytest.mark.parametrize("grading", [LinearGrading, ExponentialGrading])
def test_grades_given_in_place_of_dim_are_named_with_the_argument_order(grading):
    with pytest.raises(ValueError, match=r"got \[1\.0, 2\.0\]; the grades go second"):
        grading([1.0, 2.0])
    with pytest.raises(ValueError, match=r"dim must be a positive int, got 0$"):
        grading(0)


def test_learnable_identity_grades_are_floored_straight_through():
    g = LinearGrading(3, [1.0, 2.0, 3.0], f="identity", learnable=True, floor=1e-3, dtype=F64)
    with torch.no_grad():
        g.grades[1] = -4.0
    s = g.scales()
    torch.testing.assert_close(s, torch.tensor([1.0, 1e-3, 3.0], dtype=F64))
    s.sum().backward()
    torch.testing.assert_close(g.grades.grad, torch.ones(3, dtype=F64))


@pytest.mark.parametrize("f", ["shift", "identity"])
@pytest.mark.parametrize(("dtype", "grade"), [(torch.bfloat16, -3.0), (torch.bfloat16, -0.5),
                                              (torch.float32, -3000.0), (F64, -7.0)])
def test_learnable_linear_scales_below_the_floor_are_the_floor_exactly(f, dtype, grade):
    """max(f(q), floor), computed as q + max(floor − q, f(q) − q), rounded floor − q: in
    bfloat16 q = −3 gave the scale 0 (inverse ∞), in float32 q = −3000 too; now the scale is
    the floor itself and the gradient still 1 (straight-through)."""
    grade = grade - 1.0 if f == "shift" else grade  # f(q) = q + 1 below the floor
    g = LinearGrading(2, [grade, 1.0], f=f, learnable=True, floor=1e-4, dtype=dtype)
    floor = torch.tensor(1e-4, dtype=dtype).item()
    s = g.scales()
    assert s.tolist() == [floor, 2.0 if f == "shift" else 1.0]
    assert torch.isfinite(g.inverse_scales()).all()
    tokens = g.scales_at(torch.tensor([1.0, 2.0], dtype=dtype))
    assert tokens[:, 0].tolist() == [floor, floor]
    s.sum().backward()
    assert g.grades.grad.tolist() == [1.0, 1.0]


def test_exponential_scales_are_base_to_the_grades():
    grades = [0.0, 0.5, 1.0, 2.0, 3.25]
    g = ExponentialGrading(5, grades, base=3.0, dtype=F64)
    expected = torch.tensor([3.0**q for q in grades], dtype=F64)
    torch.testing.assert_close(g.scales(), expected)
    torch.testing.assert_close(g.inverse_scales(), 1 / expected)
    assert g.max_grade() == 3.25
    assert math.isclose(g.max_scale(), 3.0**3.25)


def test_set_base_changes_scales_and_is_saved_in_the_state_dict():
    g = ExponentialGrading(3, [0.0, 1.0, 2.0])
    g.set_base(3.0)
    assert torch.equal(g.scales(), torch.tensor([1.0, 3.0, 9.0]))
    state = g.state_dict()
    assert float(state["base"]) == 3.0
    fresh = ExponentialGrading(3, [0.0, 0.0, 0.0])
    fresh.load_state_dict(state)
    assert torch.equal(fresh.scales(), torch.tensor([1.0, 3.0, 9.0]))
    g.set_base(1.0)  # start of the λ annealing schedule, 000 §7.2 (iii)
    assert torch.equal(g.scales(), torch.ones(3))
    with pytest.raises(ValueError, match=r"0\.5"):
        g.set_base(0.5)


def test_constructor_rejects_base_at_most_one_naming_it():
    for bad in (1.0, 0.9, -2.0, float("inf")):
        with pytest.raises(ValueError, match=f"base={bad!r}"):
            ExponentialGrading(2, base=bad)


def test_exponential_overflow_is_clamped_with_a_warning_never_inf():
    with pytest.warns(RuntimeWarning, match="clamped"):
        g = ExponentialGrading(2, [1.0, 200.0], base=2.0, max_log_scale=10.0)
    with pytest.warns(RuntimeWarning, match="clamped"):
        s = g.scales()
    assert torch.isfinite(s).all()
    assert math.isclose(float(s[1]), math.exp(10.0), rel_tol=1e-6)
    with pytest.warns(RuntimeWarning):
        default = ExponentialGrading(1, [1000.0], base=10.0)  # default cap: finite float32
    with pytest.warns(RuntimeWarning):
        assert torch.isfinite(default.scales() ** 2).all()


def test_no_warning_when_grades_are_in_range():
    g = ExponentialGrading(3, [0.0, 1.0, 5.0], base=4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.scales()
        g.max_grade()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: LinearGrading(3, [1.0, 2.0]), "length 2"),
        (lambda: LinearGrading(2, [[[1.0, 2.0]]]), r"shape \(1, 1, 2\)"),
        (lambda: LinearGrading(2, [1.0, float("nan")]), "nan at index 1"),
        (lambda: ExponentialGrading(2, [1.0, float("inf")]), "inf at index 1"),
        (lambda: ExponentialGrading(3, [0.0, -1.5, 1.0]), r"-1\.5 at index 1"),
        (lambda: LinearGrading(2, [[1.0, 2.0]], num_heads=3), "num_heads=3"),
        (lambda: LinearGrading(2, f="square"), "square"),
    ],
)
def test_bad_grades_raise_errors_naming_the_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_initialisers_zeros_constant_warm_start_and_from_tensor():
    assert torch.equal(LinearGrading.zeros(3).grades, torch.zeros(3))
    assert torch.equal(ExponentialGrading.constant(3, 1.5).grades, torch.full((3,), 1.5))
    warm = ExponentialGrading.warm_start(4, 0.5)
    assert torch.equal(warm.grades, torch.tensor([0.0, 0.5, 1.0, 1.5]))
    one_based = LinearGrading.warm_start(3, 2.0, offset=1)
    assert torch.equal(one_based.grades, torch.tensor([2.0, 4.0, 6.0]))
    heads = LinearGrading.warm_start(3, 1.0, num_heads=2, learnable=True)
    assert heads.grades.shape == (2, 3) and heads.num_heads == 2
    assert isinstance(heads.grades, torch.nn.Parameter)
    user = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=F64)
    from_t = ExponentialGrading.from_tensor(user)
    assert from_t.dim == 2 and from_t.grades.dtype == F64
    assert torch.equal(from_t.grades, user) and from_t.grades.data_ptr() != user.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
def test_each_warm_start_grade_is_the_nearest_value_of_its_dtype(dtype):
    # c·(k + offset) computed in float32 rounds c first: 12 of 64 grades missed the nearest
    # float32 for c = 0.1
    grading = LinearGrading.warm_start(64, 0.1, offset=1, dtype=dtype)
    exact = [0.1 * (k + 1) for k in range(64)]  # Python floats: float64
    assert grading.grades.dtype == dtype
    assert torch.equal(grading.grades, torch.tensor(exact, dtype=F64).to(dtype))


def test_fixed_grades_are_buffers_and_learnable_grades_are_parameters():
    fixed = LinearGrading(3, [0.0, 1.0, 2.0])
    assert "grades" in dict(fixed.named_buffers()) and not list(fixed.parameters())
    learn = ExponentialGrading(3, [0.0, 1.0, 2.0], learnable=True)
    assert [n for n, _ in learn.named_parameters()] == ["grades"]
    assert "base" in dict(learn.named_buffers())


def test_forward_scales_the_last_dimension_shared_and_per_head():
    shared = ExponentialGrading(4, [0.0, 1.0, 2.0, 3.0], dtype=F64)
    x = torch.randn(2, 3, 5, 4, dtype=F64)
    expected = x.clone()
    for k in range(4):
        expected[..., k] *= 2.0**k
    torch.testing.assert_close(shared(x), expected)
    per_head = LinearGrading(4, torch.arange(12, dtype=F64).reshape(3, 4))
    out = per_head(x)  # (batch, heads, tokens, head_dim)
    for h in range(3):
        for k in range(4):
            torch.testing.assert_close(out[:, h, :, k], x[:, h, :, k] * (4 * h + k + 1))
    y = torch.randn(7, 3, 4, dtype=F64)  # (..., heads, head_dim)
    out2 = per_head(y, head_axis=-2)
    torch.testing.assert_close(out2, y * (per_head.scales()))
    with pytest.raises(ValueError, match="heads at axis"):
        per_head(torch.randn(2, 5, 5, 4))
    with pytest.raises(ValueError, match="dim=4"):
        shared(torch.randn(2, 3))


def test_grading_norm_bound_and_inverse_of_prop_2_4():
    g = ExponentialGrading(6, [0.0, 0.3, 1.0, 1.7, 2.0, 2.5], base=1.7, dtype=F64)
    x = torch.randn(50, 6, dtype=F64)
    gx = g(x)
    assert (gx.norm(dim=-1) <= g.max_scale() * x.norm(dim=-1) * (1 + 1e-12)).all()
    torch.testing.assert_close(gx * g.inverse_scales(), x)


@pytest.mark.parametrize("f", ["shift", "abs_shift", "softplus", "identity"])
def test_gradcheck_linear_scales_wrt_learnable_grades(f):
    g = LinearGrading(4, [0.3, 0.7, 1.2, 2.0], f=f, learnable=True, dtype=F64)
    x = torch.randn(3, 4, dtype=F64)
    # gradcheck perturbs g.grades in place, so the closure reads the perturbed grades
    assert torch.autograd.gradcheck(lambda q: g(x).pow(2).sum(), (g.grades,))


def test_gradcheck_exponential_forward_wrt_grades_and_input():
    g = ExponentialGrading(4, [0.3, 0.7, 1.2, 2.0], base=2.5, learnable=True, dtype=F64)
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, xx: g(xx).sin().sum(), (g.grades, x))


def test_double_converts_grades_and_base():
    g = ExponentialGrading(2, [0.0, 1.0]).double()
    assert g.grades.dtype == F64 and g.base.dtype == F64 and g.scales().dtype == F64


def test_set_grades_validates_and_copies_in_place():
    g = ExponentialGrading(3, [0.0, 1.0, 2.0])
    g.set_grades([1.0, 1.0, 1.0])
    assert torch.equal(g.scales(), torch.full((3,), 2.0))
    with pytest.raises(ValueError, match=r"-1\.0"):
        g.set_grades([1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="length 2"):
        g.set_grades([1.0, 1.0])


def test_a_grading_used_on_its_own_has_no_role_and_keeps_the_one_it_is_given():
    g = LinearGrading(3, [0.0, 1.0, 2.0])
    assert g.role is None and ExponentialGrading(2).role is None
    torch.testing.assert_close(g(torch.ones(3)), torch.tensor([1.0, 2.0, 3.0]))
    g.role = "feature"
    assert g.role == "feature" and LinearGrading(3).role is None  # per instance


class TestSharedScales:
    """The feature grading used at several stages of one forward pass computes its scales
    once (shared_scales), with the same outputs and gradients as one computation per stage."""

    @staticmethod
    def lm(grading: str):
        import copy

        from graded import TransformerConfig, TransformerLM

        torch.manual_seed(0)
        cfg = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=3, max_len=16,
                                grading=grading, learnable_grades=True,
                                grade_init="warm_start", grade_init_value=0.3)
        model = TransformerLM(cfg).double()
        plain = copy.deepcopy(model)
        plain._forward_pre_hooks.clear()  # one computation per stage, as without the memo
        plain._forward_hooks.clear()
        return model, plain

    @pytest.mark.parametrize("grading", ["linear", "exponential"])
    def test_one_computation_per_pass_with_the_same_outputs_and_gradients(self, grading):
        model, plain = self.lm(grading)
        ids = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(1))
        counts = []
        for m in (model, plain):
            feature = m.feature_grading
            calls = []
            inner = feature.scales_at if grading == "linear" else feature._scales
            name = "scales_at" if grading == "linear" else "_scales"

            def counted(*a, inner=inner, calls=calls):
                calls.append(1)
                return inner(*a)

            setattr(feature, name, counted)
            m(ids).square().sum().backward()
            counts.append(len(calls))
            assert feature._scales_memo is None  # nothing kept after the pass
        assert counts == [1, 5]  # input, three feed-forward stages, output
        torch.testing.assert_close(model(ids), plain(ids), rtol=0, atol=0)
        for (name, p), q in zip(model.named_parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-14, msg=name)

    def test_the_memo_is_dropped_when_the_pass_raises_and_contexts_nest(self):
        model, _ = self.lm("exponential")
        with pytest.raises(ValueError):
            model(torch.full((1, 4), 99))  # a token id past the vocabulary
        assert model.feature_grading._scales_memo is None
        g = ExponentialGrading(3, [0.0, 1.0, 2.0], learnable=True)
        with shared_scales(g):
            first = g.scales()
            with shared_scales(g):
                assert g.scales() is first
            assert g.scales() is first
            with torch.no_grad():  # another grad mode: its own entry
                assert g.scales() is not first
        assert g._scales_memo is None and g.scales() is not first
