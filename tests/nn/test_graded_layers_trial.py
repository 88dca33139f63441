"""Argument checks of the 001 layers and of GradedMLP: a bad size or grade tuple is refused at
construction, naming the argument the user passed and what was expected."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from graded.nn.graded_layers import GradedLinear, InputGradedLinear, OutputGradedLinear
from graded.nn.mlp import GradedMLP

F64 = torch.float64


@pytest.mark.parametrize("cls, grades, expected", [
    (InputGradedLinear, [[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]],
     r"shape \(3,\) \(in_features\), got shape \(2, 3\)"),
    (OutputGradedLinear, [[1.0, 2.0], [0.0, 1.0]],
     r"shape \(2,\) \(out_features\), got shape \(2, 2\)"),
])
def test_001_layers_refuse_a_per_head_grade_matrix_when_built(cls, grades, expected):
    # ExponentialGrading reads a 2-d tuple as per-head grades: the layer was built, and its
    # forward then asked for "2 heads at axis -3" of a (4, 3) input
    with pytest.raises(ValueError, match=expected):
        cls(3, 2, grades=grades)


@pytest.mark.parametrize("cls", [InputGradedLinear, OutputGradedLinear])
@pytest.mark.parametrize("size", [0, -1])
def test_001_layers_refuse_a_non_positive_size_naming_it(cls, size):
    # (0, 2) was refused as "dim must be a positive int", (-1, 2) by torch's "negative dimension"
    with pytest.raises(ValueError, match=rf"in_features must be a positive int, got {size}"):
        cls(size, 2)
    with pytest.raises(ValueError, match=rf"out_features must be a positive int, got {size}"):
        cls(2, size)


@pytest.mark.parametrize("cls", [GradedLinear, InputGradedLinear])
def test_layers_take_numpy_sizes_as_nn_linear_does(cls):
    layer = cls(np.int64(3), np.int64(2), dtype=F64)
    assert (layer.in_features, layer.out_features) == (3, 2)
    assert type(layer.in_features) is int
    x = torch.randn(4, 3, dtype=F64)
    if cls is GradedLinear:  # grades 1: W_q = W, the layer is F.linear
        expected = F.linear(x, layer.weight, layer.bias)
    else:  # grades 0 (None): λ^0 = 1, the layer is relu(F.linear)
        expected = torch.relu(F.linear(x, layer.linear.weight, layer.linear.bias))
    assert torch.equal(layer(x), expected)


@pytest.mark.parametrize("hidden, error, expected", [
    (0, ValueError, r"hidden_features must be a positive int \(a hidden width\), got 0"),
    ([4, 0], ValueError, r"hidden_features\[1\] must be a positive int \(a hidden width\), got 0"),
    ([4, 2.5], ValueError, r"hidden_features\[1\] must be a positive int .*got 2.5"),
    (4.0, TypeError, r"hidden_features must be an int or a sequence of ints .*got 4.0"),
    (True, TypeError, r"hidden_features must be an int or a sequence of ints .*got True"),
])
def test_graded_mlp_names_a_bad_hidden_width(hidden, error, expected):
    # 0 and True were reported as "out_features must be a positive int" (the argument of an
    # inner layer), 4.0 as "'float' object is not iterable"
    with pytest.raises(error, match=expected):
        GradedMLP(3, hidden, 2)


def test_graded_mlp_names_the_hidden_grade_tuple_of_the_wrong_length():
    # was "grades has length 3 in its last dimension but dim=4", naming no hidden layer
    with pytest.raises(ValueError, match=r"hidden_grades\[1\] has length 3 .* but dim=5"):
        GradedMLP(3, [4, 5], 2, hidden_grades=[[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0]])


def test_graded_mlp_with_numpy_widths_equals_its_layers_applied_in_turn():
    mlp = GradedMLP(3, [np.int64(4)], 2, grades=[1.0, 2.0, 0.5], hidden_grades=[[1, 2, 3, 4]],
                    dtype=F64)
    x = torch.randn(5, 3, dtype=F64)
    first, _activation, last = mlp.layers
    w0 = first.weight.sign() * first.weight.abs() ** torch.tensor([1.0, 2.0, 0.5], dtype=F64)
    h = (x @ w0.T + first.bias).abs() ** (1.0 / torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64))
    # the last layer reads the hidden grades 1..4 in its weights' exponents
    expected = (h @ (last.weight.sign() * last.weight.abs()
                     ** torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)).T + last.bias)
    assert torch.allclose(mlp(x), expected, rtol=1e-12, atol=1e-12)
