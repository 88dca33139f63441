"""Seeds, weights and config values the program search used to take and fail on later with
numpy's own message (no option, no value), or not at all."""

import math

import pytest

from graded.search.program import OfflineProposer, SearchConfig
from graded.search.program.proposers import EnsembleProposer


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_a_seed_numpy_cannot_take_is_refused_naming_it(seed):
    # -1 reached np.random.default_rng: "expected non-negative integer"; 1.5 a TypeError
    for make in (lambda: SearchConfig(seed=seed), lambda: OfflineProposer(seed=seed),
                 lambda: EnsembleProposer([OfflineProposer()], [1.0], seed=seed)):
        with pytest.raises(ValueError, match=rf"seed={seed!r}; expected an integer >= 0"):
            make()


def test_the_cli_names_a_negative_seed(tmp_path, capsys):
    from graded.cli import main

    out = tmp_path / "run"
    assert main(["search", "program", "--seed", "-1", "--budget", "2", "--out", str(out)]) == 2
    assert "seed=-1; expected an integer >= 0" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("fields, message", [
    ({"isolation": "bogus"}, "isolation='bogus'; expected 'auto', 'require' or 'none'"),
    ({"budget": True}, "budget=True; expected an integer >= 1"),
    ({"workers": False}, "workers=False; expected an integer >= 1"),
])
def test_other_config_values_are_refused_when_the_config_is_made(fields, message):
    with pytest.raises(ValueError, match=message):
        SearchConfig(**fields)


@pytest.mark.parametrize("weights", [[math.nan, 1.0], [math.inf, 1.0]])
def test_ensemble_weights_must_be_finite(weights):
    # NaN passed both checks (NaN < 0 and NaN <= 0 are False) and made every probability NaN
    with pytest.raises(ValueError, match=r"weights=\[.*\]; expected finite non-negative"):
        EnsembleProposer([OfflineProposer(), OfflineProposer()], weights)


def test_ensemble_probabilities_are_the_normalised_weights():
    weights = [1.0, 3.0, 0.0]
    proposer = EnsembleProposer([OfflineProposer() for _ in weights], weights)
    total = sum(weights)  # independent: plain Python division
    assert proposer.p.tolist() == [w / total for w in weights]


@pytest.mark.parametrize("attempts", [0, -1, 2.5])
def test_offline_attempts_must_be_a_positive_integer(attempts):
    # 0 was taken and made every proposal raise "no new valid program after 0 attempts"
    with pytest.raises(ValueError, match=rf"attempts={attempts!r}; expected an integer >= 1"):
        OfflineProposer(attempts=attempts)
