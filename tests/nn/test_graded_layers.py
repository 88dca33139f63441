import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.algebra import GradedSpace
from graded.nn import (
    GradedExp,
    GradedLinear,
    GradedMLP,
    GradedReLU,
    InputGradedLinear,
    MultiplicativeGradedLinear,
    OutputGradedLinear,
)

F64 = torch.float64
SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)


def signed_pow(w, q):
    return math.copysign(abs(w) ** q, w) if w != 0 else 0.0


# -- GradedLinear (000 §3) ---------------------------------------------------------------------
def test_graded_linear_equals_naive_neuron_loop():
    torch.manual_seed(0)
    q = [0.5, 1.0, 2.0, 3.0]
    layer = GradedLinear(4, 3, q, dtype=F64)
    x = torch.randn(5, 4, dtype=F64)
    w, b = layer.weight.tolist(), layer.bias.tolist()
    expected = [[sum(signed_pow(w[j][i], q[i]) * row[i] for i in range(4)) + b[j]
                 for j in range(3)] for row in x.tolist()]
    torch.testing.assert_close(layer(x), torch.tensor(expected, dtype=F64))


def test_graded_linear_with_unit_grades_equals_nn_linear():
    torch.manual_seed(1)
    layer = GradedLinear(6, 4)
    ref = torch.nn.Linear(6, 4)
    ref.load_state_dict({"weight": layer.weight, "bias": layer.bias})
    x = torch.randn(2, 3, 6)
    assert torch.equal(layer(x), ref(x))


@SETTINGS
@given(grades=st.lists(st.floats(0.25, 3.0), min_size=1, max_size=4), lam=st.floats(0.2, 5.0),
       seed=st.integers(0, 1000))
def test_graded_neuron_of_lambda_action_equals_neuron_with_scaled_weights(grades, lam, seed):
    # 000 §3: for b = 0, α_q(λ⋆x; w) = Σ (λ w_i)^{q_i} x_i = α_q(x; λ w).
    torch.manual_seed(seed)
    n = len(grades)
    layer = GradedLinear(n, 2, grades, bias=False, dtype=F64)
    scaled = GradedLinear(n, 2, grades, bias=False, dtype=F64)
    with torch.no_grad():
        scaled.weight.copy_(lam * layer.weight)
    x = torch.randn(3, n, dtype=F64)
    torch.testing.assert_close(layer(GradedSpace(grades).act(lam, x)), scaled(x))


def test_graded_linear_weight_gradient_is_exact_for_large_weights():
    # d/dw (w^3 x) = 3 w^2 x = 3·10^4 at w = 100, x = 1: above the slope cap that guards w^q,
    # q < 1, at w = 0, and the true derivative
    layer = GradedLinear(2, 1, [3.0, 0.5], bias=False, dtype=F64)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[100.0, 4.0]], dtype=F64))
    layer(torch.ones(1, 2, dtype=F64)).sum().backward()
    torch.testing.assert_close(layer.weight.grad,
                               torch.tensor([[3 * 100.0**2, 0.5 * 4.0**-0.5]], dtype=F64))


def test_graded_linear_gradients_are_finite_at_zero_weights():
    layer = GradedLinear(3, 2, [0.5, 1.0, 2.0], learnable_grades=True)
    with torch.no_grad():
        layer.weight.zero_()
    layer(torch.randn(4, 3)).sum().backward()
    assert torch.isfinite(layer.weight.grad).all() and torch.isfinite(layer.grades.grad).all()


def test_learnable_grades_below_the_floor_stay_finite_and_trainable():
    layer = GradedLinear(2, 1, [1.0, 1.0], learnable_grades=True, min_grade=1e-3)
    with torch.no_grad():
        layer.grades[0] = -0.5
        layer.weight[0, 0] = 0.0
    out = layer(torch.ones(1, 2))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(layer.grades.grad).all()


def test_gradcheck_graded_linear_wrt_input_weight_and_learnable_grades():
    torch.manual_seed(2)
    layer = GradedLinear(3, 2, [0.6, 1.3, 2.1], learnable_grades=True, dtype=F64)
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w, q: layer(a), (x, layer.weight, layer.grades))


# -- MultiplicativeGradedLinear (000 §3) -------------------------------------------------------
@pytest.mark.parametrize("sign_mode", ["odd", "abs", "power"])
def test_multiplicative_layer_equals_naive_product_loop(sign_mode):
    torch.manual_seed(3)
    q = [1.0, 2.0, 3.0]
    layer = MultiplicativeGradedLinear(3, 2, q, sign_mode=sign_mode, dtype=F64)
    x = torch.randn(5, 3, dtype=F64)
    w, b = layer.weight.tolist(), layer.bias.tolist()

    def factor(u, g):
        if sign_mode == "odd":
            return signed_pow(u, g)
        if sign_mode == "abs":
            return abs(u) ** g
        return u ** int(g)

    expected = [[math.prod(factor(w[j][i] * row[i], q[i]) for i in range(3)) + b[j]
                 for j in range(2)] for row in x.tolist()]
    torch.testing.assert_close(layer(x), torch.tensor(expected, dtype=F64))


@SETTINGS
@given(grades=st.lists(st.floats(0.25, 2.0), min_size=1, max_size=4), lam=st.floats(0.3, 3.0),
       seed=st.integers(0, 1000))
def test_multiplicative_neuron_has_degree_sum_of_squared_grades(grades, lam, seed):
    # 000 §3: for b = 0, β_q(λ⋆x) = λ^{Σ q_i²} β_q(x).
    torch.manual_seed(seed)
    n = len(grades)
    layer = MultiplicativeGradedLinear(n, 2, grades, bias=False, dtype=F64)
    x = torch.randn(3, n, dtype=F64)
    factor = lam ** sum(g * g for g in grades)
    torch.testing.assert_close(layer(GradedSpace(grades).act(lam, x)), factor * layer(x),
                               rtol=1e-9, atol=1e-12)


def test_multiplicative_layer_zero_factor_gives_bias_and_finite_gradients():
    layer = MultiplicativeGradedLinear(2, 1, [0.5, 1.5], learnable_grades=True)
    x = torch.tensor([[0.0, 1.0]], requires_grad=True)
    out = layer(x)
    torch.testing.assert_close(out, layer.bias.detach().reshape(1, 1))
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.grades.grad).all()


@pytest.mark.parametrize("sign_mode", ["odd", "power"])
def test_multiplicative_layer_gradient_at_a_zero_factor_is_the_polynomial_derivative(sign_mode):
    # with integer grades and sign_mode power (odd: grades 1 and 3) the neuron is the monomial
    # Π (w_i x_i)^{q_i}; at a zero factor of grade 1 its derivative is the product of the
    # other factors (ReLU features and one-hot inputs are exactly 0), not 0
    q = [1, 1, 2] if sign_mode == "power" else [1, 1, 3]
    layer = MultiplicativeGradedLinear(3, 2, [float(g) for g in q], bias=False,
                                       sign_mode=sign_mode, dtype=F64)
    w = [[2.0, 3.0, 0.5], [-1.5, 0.75, 2.0]]
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(w, dtype=F64))
    rows = [[0.0, 1.5, -2.0], [0.7, 0.0, 1.1], [0.0, 0.0, 1.3], [0.4, -1.2, 0.0], [0.3, 0.6, 0.9]]
    x = torch.tensor(rows, dtype=F64, requires_grad=True)
    layer(x).sum().backward()

    def d_dx(row, k):  # Σ_j ∂/∂x_k Π_i (w_ji x_i)^{q_i}, by hand
        total = 0.0
        for wj in w:
            rest = math.prod((wj[i] * row[i]) ** q[i] for i in range(3) if i != k)
            total += q[k] * wj[k] * (wj[k] * row[k]) ** (q[k] - 1) * rest
        return total

    expected = [[d_dx(row, k) for k in range(3)] for row in rows]
    torch.testing.assert_close(x.grad, torch.tensor(expected, dtype=F64))
    assert x.grad[0, 0] != 0 and x.grad[1, 1] != 0  # grade-1 zero factors carry a slope


def test_multiplicative_layer_log_space_avoids_intermediate_underflow():
    # a direct product of these factors underflows to 0 after two of them
    layer = MultiplicativeGradedLinear(40, 1, 1.0, bias=False, sign_mode="abs", dtype=F64)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    x = torch.cat([torch.full((20,), 1e-200, dtype=F64), torch.full((20,), 1e200, dtype=F64)])
    x = x.unsqueeze(0)
    assert float(x[0, :2].prod()) == 0.0
    torch.testing.assert_close(layer(x), torch.ones(1, 1, dtype=F64), rtol=1e-10, atol=0)


def test_gradcheck_multiplicative_layer_wrt_input_weight_and_grades():
    torch.manual_seed(4)
    layer = MultiplicativeGradedLinear(3, 2, [0.6, 1.3, 2.1], learnable_grades=True, dtype=F64)
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w, q: layer(a), (x, layer.weight, layer.grades))


def test_multiplicative_learnable_grades_below_the_floor_are_evaluated_at_the_floor():
    # a learnable grade trained to -1 gave (w x)^{-1}: 2·(1e-3)^{-1} = 2000 next to a zero
    # factor but 0 at it; as in GradedLinear it is evaluated at min_grade (straight-through)
    layer = MultiplicativeGradedLinear(2, 1, [1.0, 2.0], bias=False, learnable_grades=True,
                                       min_grade=1e-3, dtype=F64)
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.grades[1] = -1.0
    for x1 in (0.5, 1e-3):
        out = layer(torch.tensor([2.0, x1], dtype=F64))
        assert math.isclose(float(out.detach()), 2.0 * x1**1e-3, rel_tol=1e-12)
    layer(torch.tensor([2.0, 0.5], dtype=F64)).sum().backward()
    # d/dq of (0.5)^q at the floor, passed straight through to the grade below it
    assert math.isclose(float(layer.grades.grad[1]), 2.0 * 0.5**1e-3 * math.log(0.5),
                        rel_tol=1e-12)
    with pytest.raises(ValueError, match=r"finite min_grade > 0, got 0\.0"):
        MultiplicativeGradedLinear(2, 1, learnable_grades=True, min_grade=0.0)


def test_power_sign_mode_needs_integer_grades():
    with pytest.raises(ValueError, match=r"integer grades, got 1\.5"):
        MultiplicativeGradedLinear(2, 1, [1.0, 1.5], sign_mode="power")


# -- Input- and output-graded layers (001 Def 2.6) -------------------------------------------
def test_input_graded_layer_is_activation_of_w_diag_lambda_q_x_plus_b():
    torch.manual_seed(5)
    q = [0.0, 1.0, 2.5]
    layer = InputGradedLinear(3, 4, q, base=1.5, activation="tanh", dtype=F64)
    x = torch.randn(6, 3, dtype=F64)
    d = torch.diag(torch.tensor([1.5**g for g in q], dtype=F64))
    expected = torch.tanh(x @ d @ layer.linear.weight.T + layer.linear.bias)
    torch.testing.assert_close(layer(x), expected)


def test_output_graded_layer_is_diag_lambda_q_of_activation():
    torch.manual_seed(6)
    q = [0.0, 1.0, 2.0, 0.5]
    layer = OutputGradedLinear(3, 4, q, base=3.0, dtype=F64)
    x = torch.randn(6, 3, dtype=F64)
    scale = torch.tensor([3.0**g for g in q], dtype=F64)
    torch.testing.assert_close(layer(x), scale * torch.relu(layer.linear(x)))


def test_input_graded_layer_with_zero_grades_equals_linear_then_relu():
    layer = InputGradedLinear(5, 3)
    x = torch.randn(4, 5)
    assert torch.equal(layer(x), torch.relu(layer.linear(x)))


def test_input_graded_layer_respects_its_lipschitz_bound():
    # 001 Lemma 2.8: ‖f(x) − f(y)‖ ≤ L_σ ‖W‖₂ λ^{q_max} ‖x − y‖.
    torch.manual_seed(7)
    layer = InputGradedLinear(4, 3, [0.0, 0.5, 1.0, 2.0], base=2.0, dtype=F64)
    x, y = torch.randn(200, 4, dtype=F64), torch.randn(200, 4, dtype=F64)
    ratio = (layer(x) - layer(y)).norm(dim=-1) / (x - y).norm(dim=-1)
    assert float(ratio.detach().max()) <= layer.lipschitz_bound() + 1e-12


def test_gradcheck_input_and_output_graded_layers_wrt_learnable_grades():
    torch.manual_seed(8)
    for cls in (InputGradedLinear, OutputGradedLinear):
        layer = cls(3, 3, [0.2, 0.9, 1.4], base=2.0, activation="tanh", learnable_grades=True,
                    dtype=F64)
        x = torch.randn(4, 3, dtype=F64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda a, q, lyr=layer: lyr(a), (x, layer.grading.grades))


# -- validation -------------------------------------------------------------------------------
def test_bad_arguments_raise_errors_naming_the_value():
    with pytest.raises(ValueError, match=r"length 2 .* dim=3"):
        GradedLinear(3, 2, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"q > 0, got -0\.5 at index 1"):
        GradedLinear(2, 2, [1.0, -0.5])
    with pytest.raises(ValueError, match="inf at index 0"):
        MultiplicativeGradedLinear(2, 1, [float("inf"), 1.0])
    with pytest.raises(ValueError, match=r"q >= 0 .* -1\.0 at index 0"):
        InputGradedLinear(2, 1, [-1.0, 1.0])
    with pytest.raises(ValueError, match=r"base=0\.5"):
        OutputGradedLinear(2, 1, base=0.5)
    with pytest.raises(ValueError, match="in_features=3"):
        GradedLinear(3, 2)(torch.ones(2, 4))
    # the output-graded layer's width error came from inside F.linear ("mat1 and mat2 ...")
    for cls in (InputGradedLinear, OutputGradedLinear):
        with pytest.raises(ValueError, match=r"shape \(2, 4\); its last dimension must be "
                                             r"in_features=3"):
            cls(3, 2)(torch.ones(2, 4))
    with pytest.raises(ValueError, match="activation"):
        InputGradedLinear(2, 2, activation="swish")
    with pytest.raises(ValueError, match=r"finite max_slope > 0, got -1\.0"):
        GradedLinear(2, 2, max_slope=-1.0)
    with pytest.raises(ValueError, match=r"finite min_grade > 0, got 0\.0"):
        GradedLinear(2, 2, learnable_grades=True, min_grade=0.0)


# -- GradedMLP ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("layer", "activation"), [("additive", "graded_relu"),
                                                    ("additive", "graded_relu_threshold"),
                                                    ("input", "graded_exp"),
                                                    ("input", "relu")])
def test_graded_mlp_fits_a_small_regression(layer, activation):
    torch.manual_seed(9)
    x = torch.randn(64, 3)
    y = (x[:, :1] * 2 - x[:, 1:2]).tanh()
    model = GradedMLP(3, [16], 1, [1.0, 1.0, 2.0], layer=layer, activation=activation,
                      hidden_grades=1.0, learnable_grades=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        first = loss.item() if first is None else first
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first
    assert model(torch.randn(2, 5, 3)).shape == (2, 5, 1)


def test_graded_mlp_hidden_grades_per_layer_and_validation():
    model = GradedMLP(2, [3, 4], 1, hidden_grades=[[1.0, 2.0, 3.0], 2.0])
    # layers: linear(g0), act(g1), linear(g1), act(g2), linear(g2)
    assert torch.equal(model.layers[1].grades, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(model.layers[2].grades, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(model.layers[3].grades, torch.full((4,), 2.0))
    assert torch.equal(model.layers[4].grades, torch.full((4,), 2.0))
    with pytest.raises(ValueError, match="hidden_grades has 1 entries"):
        GradedMLP(2, [3, 4], 1, hidden_grades=[[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="layer"):
        GradedMLP(2, 3, 1, layer="conv")


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid", "gelu", "identity"])
def test_activation_lipschitz_constant_bounds_the_steepest_slope(activation):
    layer = InputGradedLinear(1, 1, [0.0], activation=activation, dtype=torch.float64)
    with torch.no_grad():
        layer.linear.weight.fill_(1.0)
        layer.linear.bias.zero_()
    x = torch.linspace(-6, 6, 120_001, dtype=torch.float64).unsqueeze(-1).requires_grad_()
    (slope,) = torch.autograd.grad(layer(x).sum(), x)
    steepest = float(slope.abs().max())
    assert steepest <= layer.lipschitz_bound() <= steepest + 1e-5


def test_power_sign_mode_refuses_learnable_grades():
    # a learnt grade leaves the integers: its sign would follow round(q), its size q
    with pytest.raises(ValueError, match="learning would move"):
        MultiplicativeGradedLinear(2, 1, [1.0, 2.0], learnable_grades=True, sign_mode="power")


def test_bfloat16_multiplicative_layer_is_within_the_rounding_of_its_factors():
    # in bf16 (unit roundoff 2^-8) each factor u_i = w_i x_i is rounded once, |u_i|^{q_i}
    # carries q_i times that error and the product one more rounding: (Σ q_i + 1)·2^-8 to first
    # order. Summing q_i ln|u_i| in bf16 added 2^-8·|Σ q_i ln|u_i|| (here up to 25): 0.086
    torch.manual_seed(0)
    q = [1.0, 2.0, 3.0, 1.5]
    layer = MultiplicativeGradedLinear(4, 3, q, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(3, 4) * 8)
    x = (torch.randn(64, 4) * 3).bfloat16()
    u = x.double().unsqueeze(-2) * layer.weight.detach().double()  # the same bf16 inputs
    expected = (torch.sign(u) * u.abs() ** torch.tensor(q, dtype=F64)).prod(-1)
    got = layer(x).detach()
    assert got.dtype == torch.bfloat16
    rel = (got.double() - expected).abs() / expected.abs()
    assert float(rel.max()) <= (sum(q) + 1) * 2.0**-8


@pytest.mark.parametrize("kind", ["additive", "multiplicative", "relu", "exp"])
def test_a_module_with_learnable_grades_computes_the_same_after_it_is_frozen(kind):
    # learnable grades below min_grade are evaluated at min_grade; the floor was applied only
    # while grades.requires_grad, so requires_grad_(False) (evaluation, fine-tuning the rest)
    # evaluated them raw: |0|^{-0.25} = ∞ gave NaN outputs. Reference: the graded formulas at
    # the floored grades, in plain torch
    torch.manual_seed(0)
    q = [1.0, 2.0, 0.5]
    build = {"additive": lambda: GradedLinear(3, 2, q, learnable_grades=True, dtype=F64),
             "multiplicative": lambda: MultiplicativeGradedLinear(3, 2, q, learnable_grades=True,
                                                                  dtype=F64),
             "relu": lambda: GradedReLU(q, learnable=True, dtype=F64),
             "exp": lambda: GradedExp(q, learnable=True, dtype=F64)}[kind]
    module = build()
    with torch.no_grad():
        module.grades[2] = -0.25  # a learnable grade that left q > 0 in training
        if hasattr(module, "weight"):
            module.weight[0, 2] = 0.0
    x = torch.randn(4, 3, dtype=F64)
    floored = torch.tensor([1.0, 2.0, module.min_grade], dtype=F64)
    w = module.weight.detach() if hasattr(module, "weight") else None
    if kind == "additive":
        expected = x @ (torch.sign(w) * w.abs() ** floored).T + module.bias.detach()
    elif kind == "multiplicative":
        u = x.unsqueeze(-2) * w
        expected = (torch.sign(u) * u.abs() ** floored).prod(-1) + module.bias.detach()
    elif kind == "relu":
        expected = x.abs() ** (1 / floored)
    else:
        expected = torch.expm1(x / floored)
    torch.testing.assert_close(module(x).detach(), expected)
    module.requires_grad_(False)
    torch.testing.assert_close(module(x), expected)


def test_per_sample_gradients_with_torch_func_equal_a_loop_of_backward_calls():
    # the capped power behind w^q and |x|^{1/q} was an autograd.Function without
    # setup_context, which torch.func.grad, vmap and jacrev refuse
    torch.manual_seed(0)
    model = GradedMLP(3, 4, 2, grades=[1.0, 2.0, 0.5], hidden_grades=[[1.0, 2.0, 3.0, 0.5]],
                      learnable_grades=True, dtype=F64)
    params = {k: v.detach() for k, v in model.named_parameters()}
    xs = torch.randn(5, 3, dtype=F64)

    def loss(p, x):
        return torch.func.functional_call(model, p, (x,)).square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, xs)
    for i in range(xs.shape[0]):
        model.zero_grad()
        model(xs[i]).square().sum().backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(per_sample[name][i], p.grad, msg=name)
    relu = model.layers[1]
    h = torch.randn(4, dtype=F64)
    q = relu.grades.detach()
    expected = torch.diag(torch.sign(h) * h.abs() ** (1 / q - 1) / q)  # d|h|^{1/q}/dh
    torch.testing.assert_close(torch.func.jacrev(relu)(h), expected)


def test_loaded_grades_are_checked_as_the_constructor_checks_them():
    """A state dict with a grade <= 0 or a NaN one (a damaged checkpoint) was loaded into a
    graded layer silently; its outputs were then inf or NaN."""
    from graded.nn import GradedLinear

    layer = GradedLinear(3, 2, grades=[1.0, 2.0, 0.5])
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    state["grades"] = torch.tensor([1.0, 0.0, 0.5])
    with pytest.raises(ValueError, match=r"GradedLinear \(loaded grades\) needs grades q > 0, "
                                         r"got 0\.0 at index 1"):
        layer.load_state_dict(state)
    state["grades"] = torch.tensor([1.0, float("nan"), 0.5])
    with pytest.raises(ValueError, match=r"loaded grades must be finite, got nan at index 1"):
        layer.load_state_dict(state)
    assert layer.grades.tolist() == [1.0, 2.0, 0.5]  # nothing replaced


@pytest.mark.parametrize("cls", [GradedLinear, MultiplicativeGradedLinear])
def test_layer_sizes_refuse_bools(cls):
    # GradedLinear(True, 2) passed the check (a bool is an int) and failed inside nn.Linear
    with pytest.raises(ValueError, match=r"in_features must be a positive int, got True"):
        cls(True, 2)
