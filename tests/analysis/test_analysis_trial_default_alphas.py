"""diagnose's default positional sweep of an LGT model stays inside 1 − α t > 0 at every
position the model reads: the 1-indexed sinusoids' last position is T, not T − 1, and
positions given to the model may lie past the input length."""

from __future__ import annotations

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import default_alphas, diagnose, positional_bias_sweep


@pytest.mark.parametrize(("positional", "last"), [("sinusoidal", 4), ("sinusoidal1", 5),
                                                  ("learned", 4)])
def test_default_lgt_alphas_keep_the_last_position_factor_positive(positional, last):
    model = TransformerLM(tiny_config(grading="linear", positional=positional))
    alphas = default_alphas(model, 5)
    assert alphas == pytest.approx([0.0, 0.4 / last, 0.8 / last])
    assert all(1 - a * last > 0 for a in alphas)


def test_diagnose_sweeps_an_lgt_model_with_one_indexed_sinusoids():
    """Its default α = 0.8/(T − 1) gave 1 − α·T = 0 at the last position t = T, and diagnose
    failed with 'LGT positional factor 1 - alpha*t must stay positive'."""
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="linear", positional="sinusoidal1"))
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    report = diagnose(model, ids, lipschitz_steps=1, n_random=1)
    sweep = positional_bias_sweep(model, ids, [0.0, 0.4 / 5, 0.8 / 5])
    masses = [v for key, v in report.metrics.items() if key.startswith("positional/early")]
    assert masses == pytest.approx(sweep["mean"], abs=1e-12)


def test_diagnose_sweeps_an_lgt_model_at_positions_past_the_input_length():
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="linear"))
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(6, 11).expand(2, 5)  # the last, 10, is what the factor reaches
    report = diagnose(model, ids, lipschitz_steps=1, n_random=1, positions=positions)
    sweep = positional_bias_sweep(model, ids, [0.0, 0.04, 0.08], positions=positions)
    masses = [v for key, v in report.metrics.items() if key.startswith("positional/early")]
    assert masses == pytest.approx(sweep["mean"], abs=1e-12)


@pytest.mark.parametrize(("alphas", "error", "message"), [
    ([0.1, 0.5], ValueError, r"alphas \[0\.5\] leave the LGT domain: the position factor "
                             r"1 - alpha\*t must stay positive up to the last position t = 4; "
                             r"need alpha < 0\.25"),
    ([-0.1], ValueError, r"alphas\[0\] must be >= 0, got -0\.1"),
    (["0.1"], TypeError, r"alphas\[0\] must be a number, got '0\.1'"),
    ([], ValueError, r"alphas must hold at least one value of α"),
])
def test_diagnose_refuses_bad_alphas_before_any_forward_pass(alphas, error, message):
    """diagnose says that alphas are checked before any diagnostic runs; these were refused
    only by the sweep, after every other diagnostic had run (or, as a string, taken)."""
    model = TransformerLM(tiny_config(grading="linear"))
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(error, match=message):
        diagnose(model, ids, alphas=alphas, lipschitz_steps=1, n_random=1)
    assert calls == []
    with pytest.raises(error, match=message):
        positional_bias_sweep(model, ids, alphas)
    assert calls == []
