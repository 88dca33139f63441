"""The PatternBoost loop: run folder contents, resuming, interruption, baselines, parallelism."""

import json
import re

import pytest
import torch

from graded.search.patternboost import PatternBoostConfig, run_patternboost
from graded.search.patternboost import model as pb_model
from graded.search.patternboost.parallel import make_executor
from graded.search.patternboost.records import load_weights

TINY_MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}


def tiny(**changes):
    fields = dict(problem="triangle-free", n=5, problem_options={"bits_per_token": 2},
                  rounds=2, initial=40, keep=16, database_size=40, samples=48,
                  train_steps=40, batch_size=16, lr=3e-3, model=TINY_MODEL, progress=False,
                  chunk_size=16)
    fields.update(changes)
    return PatternBoostConfig(**fields)


def state_of(folder):
    state = json.loads((folder / "state.json").read_text())
    weights = None
    if state["model_file"] is not None:
        weights = load_weights(folder / state["model_file"])
    for row in state["metrics"]:
        row.pop("elapsed_s")
    state.pop("elapsed_s")
    return state, weights


def assert_same_state(a, b):
    (sa, wa), (sb, wb) = state_of(a), state_of(b)
    assert {k: v for k, v in sa.items() if k != "model_file"} == {
        k: v for k, v in sb.items() if k != "model_file"}
    assert (wa is None) == (wb is None)
    if wa is not None:
        assert wa.keys() == wb.keys()
        for k in wa:
            torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0)


def test_run_writes_config_state_weights_csv_and_png(tmp_path):
    result = run_patternboost(tiny(), tmp_path)
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0].startswith("round,mode,local_search_calls,elapsed_s,samples,invalid_fraction")
    assert len(lines) == 1 + 3  # rounds 0, 1, 2
    assert (tmp_path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.glob("*.safetensors")) == [tmp_path / "model-0002.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["n"] == 5
    assert result.rounds_done == 2
    assert result.problem.is_valid(result.best_object)
    assert result.best_score == result.problem.score(result.best_object)
    assert [r["round"] for r in result.metrics] == [0, 1, 2]
    assert all(0.0 <= r["invalid_fraction"] <= 1.0 for r in result.metrics)
    # the transformer learned the format: some samples decode and are repaired
    assert result.metrics[-1]["invalid_fraction"] < 1.0
    # the five commonest reasons why samples did not decode, with counts
    first = result.metrics[1]
    assert sum(first["invalid_reasons"].values()) <= round(first["invalid_fraction"] * 48)
    assert all(isinstance(k, str) and k for k in first["invalid_reasons"])
    assert result.metrics[-1]["local_search_calls"] > 40


def test_resumed_run_ends_in_the_same_state_as_an_uninterrupted_one(tmp_path):
    run_patternboost(tiny(), tmp_path / "straight")
    run_patternboost(tiny(rounds=1), tmp_path / "resumed")
    run_patternboost(tiny(rounds=2), tmp_path / "resumed")
    assert_same_state(tmp_path / "straight", tmp_path / "resumed")


def test_ctrl_c_keeps_the_last_finished_round_and_resume_completes(tmp_path, monkeypatch):
    run_patternboost(tiny(), tmp_path / "straight")
    calls = {"n": 0}
    real = pb_model.train_on_sequences

    def interrupt_in_round_two(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pb_model, "train_on_sequences", interrupt_in_round_two)
    result = run_patternboost(tiny(), tmp_path / "cut")
    assert result.interrupted and result.rounds_done == 1
    monkeypatch.setattr(pb_model, "train_on_sequences", real)
    run_patternboost(tiny(), tmp_path / "cut")
    assert_same_state(tmp_path / "straight", tmp_path / "cut")


def test_resume_with_a_different_config_raises(tmp_path):
    run_patternboost(tiny(mode="local-only", rounds=1), tmp_path)
    with pytest.raises(ValueError, match="samples"):
        run_patternboost(tiny(mode="local-only", rounds=1, samples=10), tmp_path)


def test_local_only_baseline_spends_samples_local_searches_per_round(tmp_path):
    result = run_patternboost(tiny(mode="local-only", rounds=3), tmp_path)
    calls = [r["local_search_calls"] for r in result.metrics]
    assert calls == [40, 88, 136, 184]
    assert all(r["invalid_fraction"] == 0.0 for r in result.metrics)
    assert not list(tmp_path.glob("*.safetensors"))
    assert result.best_score == 6.0  # Mantel: K_{2,3}


def test_global_only_baseline_adds_unrepaired_samples(tmp_path):
    result = run_patternboost(tiny(mode="global-only"), tmp_path)
    assert [r["local_search_calls"] for r in result.metrics] == [40, 40, 40]
    assert result.metrics[-1]["samples"] == 48


def test_parallel_workers_give_the_same_database_as_one_process(tmp_path):
    run_patternboost(tiny(mode="local-only", rounds=1, workers=1), tmp_path / "one")
    run_patternboost(tiny(mode="local-only", rounds=1, workers=2), tmp_path / "two")
    assert_same_state(tmp_path / "one", tmp_path / "two")
    # a pool passed in is used and left open for the next run
    pool = make_executor(2)
    try:
        for name in ("a", "b"):
            config = tiny(mode="local-only", rounds=1, workers=2)
            run_patternboost(config, tmp_path / name, executor=pool)
    finally:
        pool.shutdown()
    assert_same_state(tmp_path / "one", tmp_path / "b")


def test_stopping_rules_end_the_run_early(tmp_path):
    result = run_patternboost(tiny(mode="local-only", rounds=50, stop_at=6), tmp_path / "a")
    assert result.rounds_done < 50 and result.best_score >= 6
    result = run_patternboost(
        tiny(mode="local-only", rounds=50, max_local_search_calls=100), tmp_path / "b")
    assert result.rounds_done == 2  # 40 + 48 < 100 <= 40 + 2 * 48


def test_bad_config_values_raise_with_the_field_name():
    with pytest.raises(ValueError, match="mode"):
        tiny(mode="both")
    with pytest.raises(ValueError, match="database_size"):
        tiny(keep=100, database_size=10)
    with pytest.raises(ValueError, match="unknown PatternBoostConfig key"):
        PatternBoostConfig.from_dict({"rounds": 2, "colour": "red"})


def test_config_errors_name_the_field_the_value_and_what_is_allowed():
    from graded.search.patternboost.problems import PROBLEMS

    with pytest.raises(ValueError, match=r"PatternBoostConfig\.problem='nope' is invalid: "
                                         r"expected one of " + re.escape(str(tuple(sorted(
                                             PROBLEMS))))):
        PatternBoostConfig(problem="nope")
    with pytest.raises(ValueError, match=r"PatternBoostConfig\.model=.* unknown: \['vocab_size'\]"):
        PatternBoostConfig(model={"d_model": 8, "vocab_size": 3})
    with pytest.raises(ValueError, match=r"PatternBoostConfig\.database_size=5 is invalid: "
                                         r"expected at least keep=10"):
        PatternBoostConfig(keep=10, database_size=5)
    config = PatternBoostConfig()
    with pytest.raises(ValueError, match=r"PatternBoostConfig\.rounds=-1 is invalid"):
        config.rounds = -1
    assert config.rounds == 20 and PatternBoostConfig.from_dict(config.to_dict()) == config
