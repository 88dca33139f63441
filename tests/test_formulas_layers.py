"""Graded networks (000 §3, 001 Def 2.6, Lemma 2.8, Prop 2.9) and the scales of the grading
maps (000 §5–7) against naive loops and the papers' worked values."""

import math

import pytest
import torch

from graded.algebra import GradedSpace
from graded.grading import ExponentialGrading, LinearGrading
from graded.nn import (
    GradedMLP,
    InputGradedLinear,
    OutputGradedLinear,
    graded_exp,
    graded_relu,
)

F64 = torch.float64


def _odd_pow(w, q):
    return math.copysign(abs(w) ** q, w) if w != 0 else 0.0


def _naive_additive_layer(x, weight, bias, grades):
    """000 §3: y_j = Σ_i w_{j,i}^{q_i} x_i + b_j (w^q := sgn(w)|w|^q, graded.nn's rule)."""
    return [sum(_odd_pow(weight[j][i], grades[i]) * x[i] for i in range(len(x))) + bias[j]
            for j in range(len(weight))]


def test_a_graded_network_is_the_composition_of_its_graded_layers():
    """000 §3: ŷ = φ_m ∘ ... ∘ φ_1(x), φ_l(x) = g_l(W^l x + b^l) with W^l = [w_{j,i}^{q_i}],
    the grades q of layer l's input; the hidden activation is the graded ReLU
    max{0, |x_i|^{1/q_i}} (000 §3.1) with the grades of the hidden space, which the next layer
    reads. Every step is a Python loop over coordinates."""
    torch.manual_seed(0)
    q_in, q_h1, q_h2 = [0.5, 1.0, 2.0], [1.0, 2.0, 0.5, 1.5], [3.0, 1.0]
    model = GradedMLP(3, [4, 2], 2, q_in, hidden_grades=[q_h1, q_h2], dtype=F64)
    lin = [model.layers[k] for k in (0, 2, 4)]
    x = torch.randn(5, 3, dtype=F64)
    expected = []
    for row in x.tolist():
        h = _naive_additive_layer(row, lin[0].weight.tolist(), lin[0].bias.tolist(), q_in)
        h = [max(0.0, abs(v) ** (1 / g)) for v, g in zip(h, q_h1)]
        h = _naive_additive_layer(h, lin[1].weight.tolist(), lin[1].bias.tolist(), q_h1)
        h = [max(0.0, abs(v) ** (1 / g)) for v, g in zip(h, q_h2)]
        expected.append(_naive_additive_layer(h, lin[2].weight.tolist(), lin[2].bias.tolist(),
                                              q_h2))
    torch.testing.assert_close(model(x), torch.tensor(expected, dtype=F64), rtol=1e-12,
                               atol=1e-12)


def test_a_network_of_input_graded_layers_grades_each_layers_input_with_its_own_tuple():
    """001 Def 2.6 (and "a distinct (q^{(l)}, λ^{(l)}) per layer"): f_l(x) = σ(W diag(λ^{q}) x
    + b) with q the tuple of layer l's input; here σ is 000 Eq. 1, exp(x_i/q_i) − 1, on the
    hidden space's grades. Naive loops."""
    torch.manual_seed(1)
    q_in, q_h = [0.0, 1.0, 2.5], [0.5, 1.0, 2.0, 4.0]
    model = GradedMLP(3, [4], 2, q_in, layer="input", activation="graded_exp",
                      hidden_grades=[q_h], base=1.5, dtype=F64)
    first, last = model.layers[0].linear, model.layers[2].linear
    x = torch.randn(4, 3, dtype=F64)
    expected = []
    for row in x.tolist():
        graded = [1.5**g * v for g, v in zip(q_in, row)]
        h = [sum(w * v for w, v in zip(wr, graded)) + b
             for wr, b in zip(first.weight.tolist(), first.bias.tolist())]
        h = [math.expm1(v / g) for v, g in zip(h, q_h)]
        graded = [1.5**g * v for g, v in zip(q_h, h)]
        expected.append([sum(w * v for w, v in zip(wr, graded)) + b
                         for wr, b in zip(last.weight.tolist(), last.bias.tolist())])
    torch.testing.assert_close(model(x), torch.tensor(expected, dtype=F64), rtol=1e-12,
                               atol=1e-12)


def test_remark_3_2_and_eq_1_worked_values():
    """000 §3.1 / Remark 3.2 by hand: q = 2 gives ReLU(−4) = |−4|^{1/2} = 2 (not 0), and the
    thresholding variant max{0, sgn(x)|x|^{1/q}} gives 0; q = 1/2 gives ReLU(−3) = 9, ReLU(9)
    = 81 with q = 1/2 and 3 with q = 2. 000 §3.2 Eq. 1 under the action: with q = (1, 2),
    λ = 2, x = (0.5, 0.25), λ⋆x = (1, 1) and exp(λ⋆x) = (e − 1, e^{1/2} − 1)."""
    x = torch.tensor([[-4.0, -3.0, 9.0, 9.0]], dtype=F64)
    q = [2.0, 0.5, 0.5, 2.0]
    assert graded_relu(x, q).tolist() == [[2.0, 9.0, 81.0, 3.0]]
    assert graded_relu(x, q, mode="threshold").tolist() == [[0.0, 0.0, 81.0, 3.0]]
    assert graded_relu(x, q, mode="odd").tolist() == [[-2.0, -9.0, 81.0, 3.0]]
    moved = GradedSpace([1, 2]).act(2.0, torch.tensor([0.5, 0.25], dtype=F64))
    assert moved.tolist() == [1.0, 1.0]
    got = graded_exp(moved, [1.0, 2.0]).tolist()
    assert math.isclose(got[0], math.e - 1, rel_tol=1e-15)
    assert math.isclose(got[1], math.sqrt(math.e) - 1, rel_tol=1e-15)


def _spectral(w):
    return float(torch.linalg.svdvals(w.detach())[0])


def test_lemma_2_8_for_the_output_graded_layer_and_prop_2_9_for_a_stack():
    """001 Lemma 2.8: ‖f(x) − f(y)‖ ≤ L_σ ‖W‖₂ λ^{q_max} ‖x − y‖, here for the output form
    diag(λ^{q}) σ(Wx + b) (the input form is in tests/nn); the library's bound equals the
    constant computed from an SVD. 001 Prop 2.9: a stack of L layers is Lipschitz with the
    product of the per-layer constants."""
    torch.manual_seed(2)
    out = OutputGradedLinear(4, 3, [0.0, 1.0, 2.5], base=1.6, activation="sigmoid", dtype=F64)
    want = 0.25 * _spectral(out.linear.weight) * 1.6**2.5
    assert math.isclose(out.lipschitz_bound(), want, rel_tol=1e-12)
    layers = [InputGradedLinear(4, 5, [0.0, 0.5, 1.0, 2.0], base=2.0, activation="tanh",
                                dtype=F64),
              OutputGradedLinear(5, 4, [1.0, 0.0, 0.5, 1.5], base=1.5, activation="relu",
                                 dtype=F64),
              out]
    for layer in layers:
        with torch.no_grad():
            layer.linear.weight.mul_(3.0)  # steep enough that the bound is nearly reached
    bounds = [layer.lipschitz_bound() for layer in layers]
    for layer, bound in zip(layers, bounds):
        a = torch.randn(400, layer.in_features, dtype=F64)
        b = a + 1e-3 * torch.randn(400, layer.in_features, dtype=F64)
        ratio = (layer(a) - layer(b)).norm(dim=-1) / (a - b).norm(dim=-1)
        assert float(ratio.detach().max()) <= bound * (1 + 1e-12)
    x = torch.randn(400, 4, dtype=F64)
    y = x + 1e-3 * torch.randn(400, 4, dtype=F64)
    fx, fy = x, y
    for layer in layers:
        fx, fy = layer(fx), layer(fy)
    ratio = (fx - fy).norm(dim=-1) / (x - y).norm(dim=-1)
    assert float(ratio.detach().max()) <= math.prod(bounds) * (1 + 1e-12)


# -- the grading maps' scales (000 §5–7) ----------------------------------------------------
def _naive_f(f, q):
    return {"shift": q + 1, "abs_shift": abs(q) + 1, "softplus": math.log1p(math.exp(q)),
            "identity": q}[f]


@pytest.mark.parametrize("f", ["shift", "abs_shift", "softplus", "identity"])
def test_per_token_linear_scales_are_f_of_the_scaled_grades(f):
    """Per-token grading s·q (000 §5–6, M_{q_i} per token; TokenGrading): diag(M_{s·q}) =
    f(s·q) for each multiplier s, elementwise. Per-head grades (000 Def 5.22 (3)) give one
    row of f(q_h) per head."""
    q = [0.5, 1.0, 2.0] if f == "identity" else [-0.5, 0.0, 1.5]
    g = LinearGrading(3, q, f=f, dtype=F64)
    s = torch.tensor([[0.0, 0.5], [1.0, 3.0]], dtype=F64) + (f == "identity")
    want = [[[_naive_f(f, si * qi) for qi in q] for si in row] for row in s.tolist()]
    torch.testing.assert_close(g.scales_at(s), torch.tensor(want, dtype=F64), rtol=1e-14, atol=0)
    heads = [[0.5, 1.0, 2.0], [3.0, 0.25, 1.0]]
    per_head = LinearGrading(3, heads, f=f, num_heads=2, dtype=F64)
    want_h = [[_naive_f(f, v) for v in row] for row in heads]
    torch.testing.assert_close(per_head.scales(), torch.tensor(want_h, dtype=F64), rtol=1e-14,
                               atol=0)
    egt = ExponentialGrading(3, heads, base=1.7, num_heads=2, dtype=F64)
    torch.testing.assert_close(egt.scales(), torch.tensor([[1.7**v for v in row]
                                                           for row in heads], dtype=F64),
                               rtol=1e-14, atol=0)


def test_loss_weights_of_examples_5_38_and_7_2():
    """000 Def 5.37 (iv) and Ex. 5.38: q = (0, 0.5, 1, 2), f(q) = q + 1 weighs the four terms
    (1, 1.5, 2, 3); Def 7.1 and Ex. 7.2: the same q with λ = 2 weighs them (1, 2^{0.5}, 2, 4)."""
    q = torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=F64)
    lgt = LinearGrading(4, f="shift", dtype=F64)
    assert lgt.scale_of(q).tolist() == [1.0, 1.5, 2.0, 3.0]
    egt = ExponentialGrading(4, base=2.0, dtype=F64)
    got = egt.scale_of(q).tolist()
    for g, w in zip(got, (1.0, math.sqrt(2.0), 2.0, 4.0)):
        assert math.isclose(g, w, rel_tol=1e-15)


@pytest.mark.parametrize("f", ["shift", "abs_shift", "softplus", "identity"])
def test_grade_derivatives_of_the_scales_are_the_analytic_ones(f):
    """The derivative of a scale in its grade (what autograd gives learnable grades, SPEC
    "grade gradients come from autograd"): f'(q) = 1 (shift, identity), sgn(q) (abs_shift),
    the logistic sigmoid (softplus) for LGT (the f'(q_k) of 000 Eq. 66), and
    d λ^q/dq = λ^q ln λ for EGT."""
    q = [0.3, 1.2, 2.0] if f == "identity" else [-0.7, 0.4, 2.0]
    g = LinearGrading(3, q, f=f, learnable=True, dtype=F64)
    g.scales().sum().backward()
    deriv = {"shift": lambda v: 1.0, "identity": lambda v: 1.0,
             "abs_shift": lambda v: math.copysign(1.0, v),
             "softplus": lambda v: 1 / (1 + math.exp(-v))}[f]
    torch.testing.assert_close(g.grades.grad, torch.tensor([deriv(v) for v in q], dtype=F64),
                               rtol=1e-14, atol=0)
    e = ExponentialGrading(3, [0.0, 0.5, 2.0], base=2.5, learnable=True, dtype=F64)
    e.scales().sum().backward()
    want = [2.5**v * math.log(2.5) for v in (0.0, 0.5, 2.0)]
    torch.testing.assert_close(e.grades.grad, torch.tensor(want, dtype=F64), rtol=1e-14, atol=0)


def test_learnable_grades_out_of_the_domain_are_evaluated_at_the_floor_exactly():
    """src/graded/grading rule (SPEC C5, fixed or learnable grades): learnable LGT scales are
    max(f(q), floor) for f ∈ {shift, identity}, learnable EGT grades max(q, 0), each with the
    gradient of the unclamped map (straight-through): here f'(q) = 1 and ln λ at q = 0."""
    lgt = LinearGrading(3, [-5.0, -0.5, 1.0], f="shift", learnable=True, floor=1e-3, dtype=F64)
    s = lgt.scales()
    assert s.tolist() == [1e-3, 0.5, 2.0]
    s.sum().backward()
    assert lgt.grades.grad.tolist() == [1.0, 1.0, 1.0]
    egt = ExponentialGrading(2, [-2.0, 1.0], base=3.0, learnable=True, dtype=F64)
    s = egt.scales()
    assert s[0].item() == 1.0 and math.isclose(s[1].item(), 3.0, rel_tol=1e-15)
    s.sum().backward()
    torch.testing.assert_close(egt.grades.grad,
                               torch.tensor([math.log(3.0), 3.0 * math.log(3.0)], dtype=F64),
                               rtol=1e-14, atol=0)

