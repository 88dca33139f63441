"""The demo's verdict sentences count only the seeds that gave a score."""

import math

from graded.demo import _verdict


def test_a_nan_seed_does_not_count_towards_the_standard_error():
    # LGT: one finite seed (0.9) and one NaN. mean_std skips the NaN (std 0 of one value), but
    # the standard error used to divide by both seeds, so a single seed was called **better**
    # with "standard error" sqrt(0/2 + 0.01²/3) = 0.006
    base = [0.50, 0.52, 0.51]
    text = "\n".join(_verdict("t", "r2", {"baseline": base, "LGT": [0.9, math.nan],
                                          "EGT": [math.nan, math.nan]}, {}))
    assert "**better**" not in text
    assert f"LGT against the ungraded transformer: Δ = {0.9 - 0.51:+.3f}, not tested" in text
    assert "EGT: no seed gave a finite r2." in text


def test_the_standard_error_is_over_the_finite_seeds():
    # LGT finite at 0.60, 0.62, 0.64 (std 0.02) plus a NaN seed: SE = sqrt(0.02²/3 + 0.02²/3)
    base = [0.50, 0.52, 0.54]
    text = "\n".join(_verdict("t", "r2", {"baseline": [*base, math.nan],
                                          "LGT": [0.60, math.nan, 0.62, 0.64]}, {}))
    se = math.sqrt(2 * 0.02 ** 2 / 3)
    assert f"Δ = +0.100 (standard error {se:.3f}" in text and "**better**" in text


def test_a_lower_perplexity_or_loss_is_the_better_one():
    # HIGHER_IS_BETTER.get(metric, True) read perplexity and loss as higher-is-better: the
    # transformer with the largest perplexity was named the best
    for metric in ("perplexity", "loss"):
        text = "\n".join(_verdict("t", metric, {"baseline": [9.0, 9.1, 9.2],
                                                "LGT": [3.0, 3.1, 3.2]}, {}))
        assert "best transformer is **LGT**" in text
        assert "**better**" in text and "**worse**" not in text


def test_a_headline_metric_the_evaluation_does_not_know_is_refused():
    import pytest

    with pytest.raises(ValueError, match="headline metric 'bleu' is not an evaluation metric"):
        _verdict("t", "bleu", {"LGT": [1.0]}, {})
