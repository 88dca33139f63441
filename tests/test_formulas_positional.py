"""ALiBi head slopes and bias (seed_002 B.11, Press et al. 2022) for every power-of-two head
count, against the printed formula; ``tests/test_positional.py`` covers 8 and 6 heads."""

import pytest
import torch

from graded.positional import ALiBi, alibi_slopes


@pytest.mark.parametrize("heads", [1, 2, 4, 16, 32])
def test_alibi_slopes_are_two_to_the_minus_8h_over_h(heads):
    """seed_002 B.11: m_h = 2^{−8h/H}, h = 1..H, a geometric sequence starting and with ratio
    2^{−8/H}."""
    expected = [2.0 ** (-8 * h / heads) for h in range(1, heads + 1)]
    assert alibi_slopes(heads).tolist() == pytest.approx(expected, rel=1e-6)


def test_alibi_bias_is_minus_slope_times_distance_for_past_keys_at_offset_positions():
    """seed_002 B.11: score_ij += −m_h·(i − j) for j ≤ i; positions need not start at 0 (a
    cached decoder's queries sit after its keys), so query positions 5..7 against keys 0..7."""
    heads = 4
    bias = ALiBi(heads)(torch.arange(5, 8), torch.arange(8))
    assert bias.shape == (1, heads, 3, 8)
    for h in range(heads):
        m = 2.0 ** (-8 * (h + 1) / heads)
        for a, i in enumerate(range(5, 8)):
            for j in range(i + 1):
                assert bias[0, h, a, j].item() == pytest.approx(-m * (i - j), rel=1e-6)
