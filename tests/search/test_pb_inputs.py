"""Bad PatternBoost inputs are refused up front, naming the value and what is expected."""

import itertools
import math

import numpy as np
import pytest

from graded.search.patternboost import (
    PatternBoostConfig,
    pack_bits,
    run_patternboost,
    unpack_bits,
)


@pytest.mark.parametrize("field, value, expected", [
    ("lr", math.inf, "a finite positive number"),
    ("temperature", math.inf, "a finite positive number"),
    ("weight_decay", math.inf, "a finite number >= 0"),
    ("seed", -1, "an integer >= 0"),
])
def test_infinite_rates_and_negative_seeds_are_refused(field, value, expected):
    # lr=inf ran round 0 and then failed in sampling ("probability tensor contains inf");
    # seed=-1 failed in numpy's SeedSequence with "expected non-negative integer"
    with pytest.raises(ValueError, match=rf"PatternBoostConfig\.{field}={value!r} is invalid: "
                                         rf"expected {expected}"):
        PatternBoostConfig(**{field: value})


@pytest.mark.parametrize("fields, shown, expected", [
    ({"n": 1}, "n=1", "int >= 2, got 1"),
    ({"problem": "permanent", "n": 13}, "n=13", "1..12 .*got 13"),
    ({"problem": "hypercube", "n": 9}, "n=9", "2..8, got 9"),
    ({"problem_options": {"bits_per_token": 0}}, "problem_options=\\{'bits_per_token': 0\\}",
     "1..16, got 0"),
    ({"model": {"d_model": 64, "n_heads": 3}}, "model=", "multiple of n_heads=3"),
])
def test_sizes_and_models_the_problem_or_transformer_refuse_fail_before_the_run_folder(
        fields, shown, expected, tmp_path):
    # these used to write config.json and fail in the run (the model only after round 0's
    # local searches); a config may still be built field by field, so the check is a method
    config = PatternBoostConfig(**fields)
    with pytest.raises(ValueError, match=rf"PatternBoostConfig\.{shown}.*{expected}"):
        config.check_runnable()
    with pytest.raises(ValueError, match=rf"PatternBoostConfig\.{shown}.*{expected}"):
        run_patternboost(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_size_the_problem_refuses_writes_no_run_folder(tmp_path, capsys):
    from graded.search.patternboost.__main__ import main

    out = tmp_path / "run"
    assert main(["--n", "1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err  # one line, not a traceback
    assert err.startswith("python -m graded.search.patternboost: error: PatternBoostConfig.n=1")
    assert "Traceback" not in err
    assert not out.exists()


def test_bits_that_are_not_exactly_0_or_1_are_refused_not_truncated():
    # 0.5 was cast to int64 (0) and packed without a word
    with pytest.raises(ValueError, match=r"bits must be 0 or 1, got values \[0\.0, 0\.5, 1\.0\]"):
        pack_bits([0, 0.5, 1], 2)
    with pytest.raises(ValueError, match=r"bits_per_token must be an int in 1\.\.16, got True"):
        pack_bits([0, 1], True)


@pytest.mark.parametrize("bits_per_token", [1, 3, 4, 7])
def test_pack_bits_matches_reading_the_string_in_base_2(bits_per_token):
    # independent reference: Python's int(text, 2) on the zero-padded chunks
    rng = np.random.default_rng(bits_per_token)
    for length in (1, 5, 10, 28):
        for bits in itertools.islice((rng.integers(0, 2, length) for _ in itertools.count()), 5):
            text = "".join(map(str, bits)) + "0" * (-length % bits_per_token)
            expected = [int(text[i:i + bits_per_token], 2)
                        for i in range(0, len(text), bits_per_token)]
            assert pack_bits(bits.astype(float), bits_per_token) == expected
            assert unpack_bits(expected, bits_per_token, length).tolist() == bits.tolist()
