"""The homogeneous norm N_w(x) = (Σ|x_i|^{w/q_i})^{1/w} with an exponent w < 1 (allowed: w > 0)
has finite gradients, equal to the hand derivative, at a vector with a zero coordinate."""

import pytest
import torch

from graded.algebra import GradedSpace


@pytest.mark.parametrize("w", [0.25, 0.5, 1.5])
def test_gradient_with_a_zero_coordinate_is_the_hand_derivative(w):
    # the zero coordinate's term |x_0|^{w/q_0} has an infinite slope at 0 for w/q_0 < 1; its
    # product with the slope 0 of the scaling made the other coordinates' gradients NaN
    q = [1.0, 2.0, 3.0]
    space = GradedSpace(q)
    values = [0.0, 1.5, -2.0]
    x = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    n = space.homogeneous_norm(x, w)
    n.backward()
    total = sum(abs(v) ** (w / qi) for v, qi in zip(values, q))
    assert n.item() == pytest.approx(total ** (1.0 / w), rel=1e-14)
    # ∂N/∂x_i = (1/w) S^{1/w − 1} · (w/q_i)|x_i|^{w/q_i − 1} sgn(x_i); 0 at the zero coordinate
    expected = [0.0] + [total ** (1.0 / w - 1.0) / qi * abs(v) ** (w / qi - 1.0)
                        * (1.0 if v > 0 else -1.0) for v, qi in zip(values[1:], q[1:])]
    torch.testing.assert_close(x.grad, torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-12, atol=0.0)
