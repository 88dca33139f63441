"""Performer backend: the stabilising shifts of the FAVOR+ features are constant factors of the
exact features (per row, per head), and the checks no other test reaches."""

import math

import pytest
import torch

from graded.attention.backends.performer import (
    PerformerBackend,
    draw_random_features,
    favor_features,
)


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)
    omega = draw_random_features(6, 4, generator=g, dtype=torch.float64)
    return x, omega


def test_row_stabilised_features_are_the_exact_ones_times_a_per_row_constant():
    x, omega = _inputs()
    exact = favor_features(x, omega)
    row = favor_features(x, omega, stabilize="row")
    ratio = row / exact
    torch.testing.assert_close(ratio, ratio[..., :1].expand_as(ratio))
    assert torch.allclose(row.amax(-1), torch.full(row.shape[:-1], 6 ** -0.5,
                                                   dtype=torch.float64))  # max exponent 0


def test_all_stabilised_features_are_the_exact_ones_times_a_per_head_constant():
    x, omega = _inputs()
    exact = favor_features(x, omega)
    shifted = favor_features(x, omega, stabilize="all")
    ratio = shifted / exact
    torch.testing.assert_close(ratio, ratio[..., :1, :1].expand_as(ratio))
    torch.testing.assert_close(shifted.amax(dim=(-2, -1)),
                               torch.full((2, 3), 6 ** -0.5, dtype=torch.float64))


def test_an_unknown_stabilisation_is_named():
    x, omega = _inputs()
    with pytest.raises(ValueError, match=r"stabilize must be None, 'row' or 'all', got 'col'"):
        favor_features(x, omega, stabilize="col")


def test_feature_matrix_sizes_must_be_positive():
    with pytest.raises(ValueError, match=r"need positive num_features and dim, got 0, 4"):
        draw_random_features(0, 4)


@pytest.mark.parametrize("kwargs, message", [
    ({"feature_type": "sobol"}, r"feature_type must be 'orthogonal' or 'iid', got 'sobol'"),
    ({"num_features": 0}, r"num_features must be a positive int or None, got 0"),
    ({"num_features": True}, r"num_features must be a positive int or None, got True"),
    ({"redraw_interval": 2.5}, r"redraw_interval must be a positive int or None, got 2.5"),
    ({"redraw_interval": True}, r"redraw_interval must be a positive int or None, got True"),
    ({"head_dim": True}, r"head_dim must be a positive int or None, got True"),
    ({"chunk_size": True}, r"chunk_size must be a positive int, got True"),
    ({"eps": True}, r"eps must be a number > 0, got True"),
    ({"eps": math.nan}, r"eps must be a finite number, got nan"),
])
def test_backend_options_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PerformerBackend(**kwargs)


def test_features_are_tied_to_their_head_dim():
    backend = PerformerBackend(num_features=8, seed=0)
    with pytest.raises(ValueError, match=r"head_dim unknown; pass head_dim to redraw"):
        backend.redraw_features()
    backend.redraw_features(4)
    assert tuple(backend.omega.shape) == (8, 4)
    q = torch.randn(1, 2, 3, 5)
    with pytest.raises(ValueError, match=r"features were drawn for head_dim 4, got inputs with "
                                         r"head_dim 5"):
        backend(q, q, q)
