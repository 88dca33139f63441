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


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_resumed_run_ends_in_the_same_state_as_an_uninterrupted_one(tmp_path):
    run_patternboost(tiny(), tmp_path / "straight")
    run_patternboost(tiny(rounds=1), tmp_path / "resumed")
    run_patternboost(tiny(rounds=2), tmp_path / "resumed")
    assert_same_state(tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
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
    with pytest.raises(ValueError, match=r"fields \['samples'\]; saved -> given: "
                                         r"samples: 48 -> 10"):
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


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
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


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_stop_at_score_that_no_score_can_reach_is_refused(value):
    # every comparison with NaN is false: the rule silently never stopped the run
    with pytest.raises(ValueError, match=rf"PatternBoostConfig\.stop_at={value!r} is invalid: "
                                         r"expected None or a finite score"):
        PatternBoostConfig(stop_at=value)
    assert PatternBoostConfig(stop_at=12).stop_at == 12.0


def test_options_of_another_problem_are_refused_with_the_allowed_keys():
    with pytest.raises(ValueError, match=r"PatternBoostConfig\.problem_options=\{'pattern': "
                                         r"'123'\} is invalid: expected options of problem "
                                         r"'c4-free', not 'pattern'; allowed keys: "
                                         r"bits_per_token"):
        PatternBoostConfig(problem="c4-free", problem_options={"pattern": "123"})
    config = PatternBoostConfig(problem="permanent", problem_options={"pattern": "123"})
    assert config.problem_options == {"pattern": "123"}


def _has_four_cycle(a) -> bool:
    """Brute force: some 4 distinct vertices i-j-k-l-i joined in a cycle."""
    import itertools

    return any(a[i][j] and a[j][k] and a[k][l] and a[l][i]
               for i, j, k, l in itertools.permutations(range(len(a)), 4))


def test_global_only_never_reports_an_object_that_violates_the_constraint(tmp_path, monkeypatch):
    # An 8-vertex 4-cycle-free graph with ex(8; C4) = 11 edges, plus the edge (2, 4) that closes
    # exactly one 4-cycle: 12 edges, score 12 - 2 = 10. That is what a model trained on extremal
    # graphs samples, and it ties with a valid 10-edge graph; the unrepaired sample used to be
    # reported as the best object ("12 edges, score 10").
    from graded.search.patternboost.graphs import C4Free

    edges = [(0, 3), (0, 5), (0, 7), (1, 2), (1, 5), (1, 6), (2, 6), (3, 4), (3, 5), (4, 6),
             (6, 7), (2, 4)]
    bad = [[0] * 8 for _ in range(8)]
    for i, j in edges:
        bad[i][j] = bad[j][i] = 1
    assert _has_four_cycle(bad)
    problem = C4Free(8)
    tokens = problem.encode(torch.tensor(bad).numpy().astype("uint8"))
    assert problem.score(problem.decode(tokens)) == 10.0
    monkeypatch.setattr(pb_model, "sample_sequences",
                        lambda model, count, *args, **kwargs: [list(tokens)] * count)
    config = dict(problem="c4-free", n=8, mode="global-only", initial=1, keep=2,
                  database_size=10, samples=2, train_steps=1, batch_size=2, model=TINY_MODEL,
                  progress=False)
    # a seed whose single initial local search stops at 10 edges, so the sample ties the best
    seed = next(s for s in range(50) if run_patternboost(
        PatternBoostConfig(**config, seed=s, rounds=0), tmp_path / f"r0-{s}").best_score <= 10)
    result = run_patternboost(PatternBoostConfig(**config, seed=seed, rounds=1), tmp_path / "run")
    entries = json.loads((tmp_path / "run" / "state.json").read_text())["database"]["entries"]
    assert any(tuple(e[2]) == tuple(tokens) for e in entries)  # the sample did enter
    best = result.best_object
    assert not _has_four_cycle(best.tolist())
    assert result.best_score == best.sum() // 2 == result.metrics[-1]["best"]


def test_database_keeps_and_reports_only_valid_objects_as_best():
    from graded.search.patternboost.database import Database

    db = Database(2)
    db.add("valid", 5.0, [1])
    db.add("a", 9.0, [2], valid=False)
    db.add("b", 8.0, [3], valid=False)
    db.prune()  # the two best are invalid: the best valid one stays in place of the second
    assert sorted(e.key for e in db.sorted()) == ["a", "valid"]
    assert db.best() == 5.0 and db.best_entry().key == "valid"
    restored = Database.from_json(json.loads(json.dumps(db.to_json())))
    assert [(e.key, e.valid) for e in restored.sorted()] == [("a", False), ("valid", True)]
    # a state written before validity was recorded holds local-search results: all valid
    old = Database.from_json({"capacity": 3, "entries": [["x", 1.0, [0]]]})
    assert old.best_entry().valid and old.best() == 1.0


def test_a_folder_holding_a_training_run_is_refused_and_left_as_it_was(tmp_path):
    """A training run's folder (manifest, checkpoints, history) is refused before anything is
    written: PatternBoost replaced the run's metrics.csv. A user's own files are accepted."""
    from graded.train.runs import RunFolder, open_run

    folder = tmp_path / "trained"
    with RunFolder(folder).lock() as trained:  # what the trainer writes before its checkpoints
        open_run(trained, {"task": {"name": "toy"}}, None, existing=False, overwrite=False,
                 entries=["checkpoints", "history.jsonl"])
    (folder / "checkpoints" / "step_10").mkdir(parents=True)
    (folder / "metrics.csv").write_text("step,loss\n10,0.5\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    with pytest.raises(FileExistsError, match=r"trained holds a training run \(.*checkpoints"):
        run_patternboost(tiny(rounds=0), folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    own = tmp_path / "notes"
    own.mkdir()
    (own / "README.txt").write_text("my notes")
    assert run_patternboost(tiny(rounds=0), own).rounds_done == 0


def test_a_state_that_does_not_load_is_refused_before_config_json_is_rewritten(tmp_path):
    # config.json took the new stopping fields (rounds 1 -> 2) before the damaged state.json
    # was read, so the refused call changed the folder it refused
    run_patternboost(tiny(mode="local-only", rounds=1), tmp_path)
    (tmp_path / "state.json").write_text('{"round": 1, "local_se')  # cut short
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError):  # json's JSONDecodeError, a ValueError
        run_patternboost(tiny(mode="local-only", rounds=2), tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_refused_config_leaves_no_folder(tmp_path):
    with pytest.raises(ValueError, match="n_heads"):
        run_patternboost(tiny(model={**TINY_MODEL, "n_heads": 3}), tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists()
