"""The weighted projective labels against brute force, without graded.algebra: on every integer
point of {-2..2}^4 \\ {0} of P(2, 4, 6, 10), two points have equal normal forms exactly when a
real λ ≠ 0 maps one to the other, and each label is λ⋆x for the λ > 0 of unit homogeneous norm,
found by bisection."""

import itertools
import math

import numpy as np
import torch

from graded.tasks import WeightedProjectiveInvariants

WEIGHTS = (2, 4, 6, 10)


def same_point_by_search(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(N, N) bool: some real λ ≠ 0 has λ^{w_i} x_i = y_i for all i. With all weights even this
    is t = λ² > 0 with t^{w_i/2} x_i = y_i: same support and signs, and the t read off the first
    non-zero coordinate fits every other one."""
    xs, ys = x[:, None, :], y[None, :, :]
    same_signs = (np.sign(xs) == np.sign(ys)).all(-1)
    half = np.array(WEIGHTS) / 2.0
    first = (x != 0).argmax(-1)  # first non-zero coordinate of each x
    rows = np.arange(len(x))
    ratio = np.abs(y[:, first].T / x[rows, first][:, None])  # (N_x, N_y), x[first] != 0
    t = ratio ** (1.0 / half[first][:, None])
    fitted = t[..., None] ** half * xs
    return same_signs & np.isclose(fitted, ys, rtol=1e-9, atol=1e-12).all(-1)


def normal_form_by_bisection(x: list[float], p: float = 20.0) -> list[float]:
    def norm(lam: float) -> float:
        return sum(abs(lam**w * v) ** (p / w) for w, v in zip(WEIGHTS, x)) ** (1 / p)

    lo, hi = -40.0, 40.0  # log λ
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if norm(math.exp(mid)) > 1 else (mid, hi)
    return [math.exp(lo) ** w * v for w, v in zip(WEIGHTS, x)]


def test_equal_labels_exactly_when_a_real_lambda_maps_one_integer_point_to_the_other():
    points = np.array([p for p in itertools.product(range(-2, 3), repeat=4) if any(p)],
                      dtype=np.float64)
    labels = WeightedProjectiveInvariants().labels(torch.from_numpy(points)).numpy()
    equal_labels = np.isclose(labels[:, None, :], labels[None, :, :], atol=1e-9).all(-1)
    expected = same_point_by_search(points, points)
    assert expected.sum() > len(points)  # some distinct integer points are one point
    assert (equal_labels == expected).all()
    for x, y in zip(points[::37], labels[::37]):
        assert np.allclose(normal_form_by_bisection(list(x)), y, atol=1e-9)
