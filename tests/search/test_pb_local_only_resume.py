"""A local-only PatternBoost run builds no transformer: resuming it with other `model` options
is the same run, while runs that build the model still compare them."""

import pytest

import graded.search.patternboost.engine as engine
from graded.search.patternboost import PatternBoostConfig, run_patternboost

TINY_MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
OTHER_MODEL = {"d_model": 32, "n_heads": 4, "n_layers": 3, "dropout": 0.25}


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    """metrics.png is not what these tests check, and drawing it costs most of a tiny run."""
    monkeypatch.setattr(engine, "plot_metrics", lambda *args, **kwargs: None)


def _small(**fields) -> PatternBoostConfig:
    base = dict(problem="triangle-free", n=5, problem_options={"bits_per_token": 2},
                mode="local-only", rounds=2, initial=8, keep=4, database_size=16, samples=8,
                train_steps=2, batch_size=4, model=TINY_MODEL, progress=False)
    return PatternBoostConfig(**{**base, **fields})


def test_local_only_resume_ignores_model_options_it_never_builds(tmp_path):
    run_patternboost(_small(rounds=1), tmp_path)
    resumed = run_patternboost(_small(model=OTHER_MODEL), tmp_path)
    # rounds 0, 1 and the resumed 2: `initial`, then `samples` local searches a round
    assert [row["local_search_calls"] for row in resumed.metrics] == [8, 16, 24]
    assert resumed.rounds_done == 2 and not list(tmp_path.glob("*.safetensors"))


def test_local_only_configs_differ_in_no_model_field():
    assert _small().resume_differences(_small(model=OTHER_MODEL)) == {}
    # nor in the fields that train and sample the model; a field local search reads still is
    unread = dict(train_steps=9, batch_size=2, lr=0.1, weight_decay=0.5, temperature=2.0,
                  top_k=3)
    assert _small().resume_differences(_small(**unread)) == {}
    assert _small().resume_differences(_small(samples=9)) == {"samples": (9, 8)}
    assert _small(mode="patternboost").differs_from(_small(mode="patternboost", lr=0.1)) == [
        "lr"]
    # a model option that would not even build is not read either
    assert _small().differs_from(_small(model={"d_model": 30, "n_heads": 4})) == []


@pytest.mark.parametrize("mode", ["patternboost", "global-only"])
def test_runs_that_build_the_model_still_compare_it(mode):
    changed = _small(mode=mode).resume_differences(
        _small(mode=mode, model={**TINY_MODEL, "d_model": 32}))
    assert changed == {"model.d_model": (32, 16)}


def test_a_mode_change_is_named_with_the_model_it_brings():
    changed = _small(mode="patternboost").differs_from(_small(model=OTHER_MODEL))
    assert changed == ["mode", "model"]
