"""Resuming a PatternBoost run compares the `model` section as the model it builds: options
spelled out at their defaults resume the run, a changed option is refused naming it."""

import json

import pytest

import graded.search.patternboost.engine as engine
from graded.search.patternboost import PatternBoostConfig, run_patternboost

TINY_MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    """metrics.png is not what these tests check, and drawing it costs most of a tiny run."""
    monkeypatch.setattr(engine, "plot_metrics", lambda *args, **kwargs: None)


def _small(**fields) -> PatternBoostConfig:
    base = dict(problem="triangle-free", n=5, problem_options={"bits_per_token": 2}, rounds=2,
                initial=8, keep=4, database_size=16, samples=8, train_steps=2, batch_size=4,
                model=TINY_MODEL, progress=False)
    return PatternBoostConfig(**{**base, **fields})


def test_resume_accepts_model_options_spelled_at_the_values_the_model_takes(tmp_path):
    # TransformerConfig's defaults and what PatternBoost sets (learned positions, no dropout),
    # d_ff = 4·d_model left out, the biases and attention dropout at the values they follow:
    # the same model, refused as "fields ['model']"
    spelled = {"d_model": 16, "n_heads": 2, "n_layers": 1, "positional": "learned",
               "dropout": 0.0, "attn_dropout": 0.0, "qkv_bias": True, "n_kv_heads": 2,
               "final_norm": True, "norm_eps": 1e-5}
    assert 4 * spelled["d_model"] != TINY_MODEL["d_ff"]
    spelled["d_ff"] = TINY_MODEL["d_ff"]
    straight = run_patternboost(_small(), tmp_path / "straight")
    run_patternboost(_small(rounds=1), tmp_path / "resumed")
    resumed = run_patternboost(_small(model=spelled), tmp_path / "resumed")
    assert resumed.rounds_done == straight.rounds_done == 2
    state = {name: json.loads((tmp_path / name / "state.json").read_text())
             for name in ("straight", "resumed")}
    assert state["resumed"]["database"] == state["straight"]["database"]
    assert ([m["train_loss"] for m in state["resumed"]["metrics"]]
            == [m["train_loss"] for m in state["straight"]["metrics"]])


def test_d_ff_written_as_four_times_the_width_is_the_model_that_leaves_it_out():
    width = {"d_model": 16, "n_heads": 2, "n_layers": 1}
    assert _small(model=width).differs_from(_small(model={**width, "d_ff": 64})) == []
    assert _small(model=width).differs_from(_small(model={**width, "d_ff": 32})) == ["model"]


@pytest.mark.parametrize("change, named", [
    ({"dropout": 0.25}, "model.dropout: 0.0 -> 0.25"),
    ({"d_ff": 48}, "model.d_ff: 32 -> 48"),
    ({"positional": "sinusoidal"}, "model.positional: 'learned' -> 'sinusoidal'"),
])
def test_resume_refuses_a_changed_model_option_naming_it(tmp_path, change, named):
    run_patternboost(_small(rounds=0), tmp_path)
    before = (tmp_path / "config.json").read_text()
    with pytest.raises(ValueError) as refused:
        run_patternboost(_small(model={**TINY_MODEL, **change}), tmp_path)
    message = str(refused.value)
    assert f"fields ['model.{next(iter(change))}']" in message and named in message
    assert (tmp_path / "config.json").read_text() == before
