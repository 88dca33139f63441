"""The programs database against direct computations of FunSearch's definitions."""

import json
import re
from fractions import Fraction

import numpy as np
import pytest

from graded.search.program import database
from graded.search.program.database import (
    DatabaseConfig,
    ProgramsDatabase,
    cluster_probabilities,
    length_probabilities,
    pareto_front,
    temperature,
)
from graded.search.program.evaluate import Evaluation
from graded.search.program.program import Program


def ev(score, body="return 0.0", signature=None, scores=None):
    program = Program((f"def priority(x):\n    {body}\n",))
    sig = signature if signature is not None else (score,)
    return Evaluation(program, float(score), tuple(sig), scores or {})


def test_temperature_is_a_sawtooth():
    assert temperature(0.1, 100, 0) == pytest.approx(0.1)
    assert temperature(0.1, 100, 50) == pytest.approx(0.05)
    assert temperature(0.1, 100, 99) == pytest.approx(0.001)
    assert temperature(0.1, 100, 100) == pytest.approx(0.1)


def test_cluster_probabilities_are_the_annealed_softmax():
    scores = [1.0, 2.0, 4.0]
    for registered in (0, 10, 77):
        t = 0.5 * (1 - (registered % 100) / 100)
        expected = np.exp(np.array(scores) / t)
        expected /= expected.sum()
        np.testing.assert_allclose(
            cluster_probabilities(scores, 0.5, 100, registered), expected, rtol=1e-12
        )


def test_length_probabilities_prefer_shorter_programs():
    lengths = [10, 20, 40]
    normalised = (np.array(lengths) - 10) / (40 + 1e-6)
    expected = np.exp(-normalised) / np.exp(-normalised).sum()
    np.testing.assert_allclose(length_probabilities(lengths), expected, rtol=1e-12)
    assert length_probabilities(lengths)[0] > length_probabilities(lengths)[2]


def test_clusters_group_equal_signatures_and_sampling_follows_the_softmax():
    config = DatabaseConfig(
        islands=1, programs_per_prompt=1, temperature_init=1.0, temperature_period=10**9
    )
    db = ProgramsDatabase(config, ev(0.0), seed=0)
    db.register(0, ev(1.0, "return 1.0"))
    db.register(0, ev(1.0, "return 1.0 + 0.0"))  # same signature: same cluster
    db.register(0, ev(2.0, "return 2.0"))
    island = db.islands[0]
    assert sorted(len(c) for c in island.clusters.values()) == [1, 1, 2]
    draws = [db.sample(0)[1][0].score for _ in range(6000)]
    freq = np.array([draws.count(s) for s in (0.0, 1.0, 2.0)]) / len(draws)
    # temperature ≈ 1 while n ≪ period
    expected = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    np.testing.assert_allclose(freq, expected, atol=0.025)


def test_prompt_parents_are_sorted_and_versioned():
    config = DatabaseConfig(islands=1, programs_per_prompt=2)
    db = ProgramsDatabase(config, ev(0.0), seed=1)
    db.register(0, ev(3.0, "return 3.0"))
    island, parents = db.sample(0)
    assert [p.score for p in parents] == sorted(p.score for p in parents)
    text = db.prompt(island, parents).text
    assert "def priority_v0" in text and "def priority_v1" in text
    assert "priority_v2" in text.splitlines()[-1]


def test_island_reset_refounds_the_weaker_half_from_the_stronger():
    config = DatabaseConfig(islands=4, reset_period=10**6)
    db = ProgramsDatabase(config, ev(0.0), seed=3)
    for island, score in enumerate([5.0, 1.0, 7.0, 2.0]):
        db.register(island, ev(score, f"return {score}"))
    reset = db.reset_islands()
    assert sorted(reset) == [1, 3]  # the two weakest
    for i in reset:
        members = db.islands[i].members()
        assert len(members) == 1 and members[0].score in (5.0, 7.0)
    assert db.islands[0].best.score == 5.0 and db.islands[2].best.score == 7.0


def test_reset_happens_every_period():
    config = DatabaseConfig(islands=2, reset_period=3)
    db = ProgramsDatabase(config, ev(0.0), seed=0)
    for k in range(7):
        db.register(k % 2, ev(float(k), f"return {k}"))
    assert db.resets == 2


def test_pareto_front_against_a_direct_check():
    rng = np.random.default_rng(0)
    points = [{"a": float(x), "b": float(y)} for x, y in rng.integers(0, 5, size=(40, 2))]
    front = set(pareto_front(points, minimise=("b",)))
    for i, p in enumerate(points):
        dominated = any(
            q["a"] >= p["a"] and q["b"] <= p["b"] and (q["a"] > p["a"] or q["b"] < p["b"])
            for q in points
        )
        assert (i in front) == (not dominated)


def test_state_round_trip_continues_identically():
    config = DatabaseConfig(islands=3, programs_per_prompt=2, reset_period=4)
    db = ProgramsDatabase(config, ev(0.0), seed=5)
    for k in range(5):
        db.register(k % 3, ev(float(k), f"return {k}"))
    twin = ProgramsDatabase.from_state(db.state())
    for _ in range(20):
        a, b = db.sample(), twin.sample()
        assert a[0] == b[0] and [p.program for p in a[1]] == [p.program for p in b[1]]


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="selection"):
        DatabaseConfig(selection="random")
    with pytest.raises(ValueError, match="islands"):
        DatabaseConfig(islands=0)
    failed = Evaluation(Program(("x",)), None, None, failure="crash", reason="boom")
    with pytest.raises(ValueError, match="initial program fails"):
        ProgramsDatabase(DatabaseConfig(), failed)


def test_sampling_survives_clusters_whose_probability_underflows():
    config = DatabaseConfig(islands=1, programs_per_prompt=2, temperature_init=0.1)
    db = ProgramsDatabase(config, ev(0.0), seed=0)
    db.register(0, ev(-500.0, "return -500.0"))  # exp(-5000) == 0.0 in float64
    _, parents = db.sample(0)
    assert [p.score for p in parents] == [0.0]


def test_map_elites_keeps_the_best_program_of_each_cell():
    config = DatabaseConfig(islands=1, programs_per_prompt=1, selection="map-elites",
                            descriptors=("a", "b"), bins=2)
    db = ProgramsDatabase(config, ev(0.0, scores={"a": 0.0, "b": 0.0}), seed=0)
    # a, b in [0, 1]: cells split at 0.5; two programs share the cell (1, 1)
    db.register(0, ev(1.0, "return 1.0", scores={"a": 1.0, "b": 1.0}))
    db.register(0, ev(2.0, "return 2.0", scores={"a": 0.9, "b": 0.8}))
    db.register(0, ev(0.5, "return 0.5", scores={"a": 0.0, "b": 1.0}))
    cells = db._elites(db.islands[0])
    assert {k: e.score for k, e in cells.items()} == {(0, 0): 0.0, (1, 1): 2.0, (0, 1): 0.5}
    drawn = {db.sample(0)[1][0].score for _ in range(200)}
    assert drawn == {0.0, 2.0, 0.5}  # uniform over cells: the cell's loser (1.0) never drawn
    with pytest.raises(ValueError, match="descriptors"):
        DatabaseConfig(selection="map-elites", descriptors=("a",))


@pytest.mark.parametrize("scores, expected", [
    ([1e308, 1e308], [0.5, 0.5]),
    ([1e308, -1e308], [1.0, 0.0]),
    ([-1e308, 0.0, -1e308], [0.0, 1.0, 0.0]),
])
def test_cluster_probabilities_of_huge_scores_are_the_limit_of_the_softmax(scores, expected):
    # score / T overflowed to inf before the shift, and inf - inf made every probability NaN
    np.testing.assert_array_equal(cluster_probabilities(scores, 0.1, 100, 0), expected)


def test_sampling_an_island_of_huge_scores_draws_the_best_cluster():
    # the NaN probabilities made every prompt a ValueError from the generator
    db = ProgramsDatabase(DatabaseConfig(islands=1, programs_per_prompt=2), ev(1e308), seed=0)
    db.register(0, ev(-1e308, "return 1.0"))
    for _ in range(5):
        _, parents = db.sample(0)
        assert [p.score for p in parents] == [1e308]  # exp(-2e308 / T) == 0.0: never drawn


@pytest.mark.parametrize("scores, message", [
    ({}, r"map-elites descriptors \['a', 'b'\]: the problem's verifier returns one number; "
         r"expected a problem with named scores"),
    ({"a": 0.0, "c": 1.0}, r"map-elites descriptors \['b'\] are not named scores of the "
                           r"problem; expected two of \['a', 'c'\]"),
])
def test_map_elites_descriptors_must_be_named_scores_of_the_problem(scores, message):
    # they were looked up only when the first prompt was drawn: KeyError 'a' on the proposer
    # thread
    config = DatabaseConfig(islands=1, selection="map-elites", descriptors=("a", "b"))
    with pytest.raises(ValueError, match=message):
        ProgramsDatabase(config, ev(0.0, scores=scores))


def test_cluster_scores_of_huge_signatures_are_their_exact_means(monkeypatch):
    # np.mean((1.7e308, 1.7e308)) overflowed to inf, and inf - inf made the probabilities NaN
    seen = []

    def recording(scores, *args):
        seen.append(list(scores))
        return cluster_probabilities(scores, *args)

    monkeypatch.setattr(database, "cluster_probabilities", recording)
    signatures = [(1.7e308, 1.7e308), (1.7e308, -1e308), (3.0, 4.0, 4.0)]
    db = ProgramsDatabase(DatabaseConfig(islands=1, programs_per_prompt=2),
                          ev(0.0, signature=signatures[0]), seed=0)
    db.register(0, ev(0.0, "return 1.0", signature=signatures[1]))
    db.register(0, ev(0.0, "return 2.0", signature=signatures[2]))
    _, parents = db.sample(0)
    exact = [float(sum(map(Fraction, s)) / len(s)) for s in signatures]
    assert seen == [exact]
    assert [p.signature for p in parents] == [signatures[0]]  # the others have probability 0.0


def test_an_evaluation_with_other_named_scores_is_refused_naming_both():
    # it joined the island, and Pareto selection raised KeyError 'c' at the next prompt
    config = DatabaseConfig(islands=1, selection="pareto")
    db = ProgramsDatabase(config, ev(0.0, scores={"a": 0.0, "b": 0.0}), seed=0)
    with pytest.raises(ValueError, match=re.escape(
            "the evaluation has the named scores ['a', 'c'], the initial program ['a', 'b']; "
            "expected the same names")):
        db.register(0, ev(1.0, "return 1.0", scores={"a": 1.0, "c": 1.0}))
    assert db.evaluations == 0 and len(db.islands[0].members()) == 1
    db.register(0, ev(1.0, "return 1.0", scores={"b": 1.0, "a": 1.0}))
    assert len(db.sample(0)[1]) == 1  # (1, 1) dominates (0, 0)


def test_the_score_names_survive_a_saved_state():
    db = ProgramsDatabase(DatabaseConfig(islands=2), ev(0.0, scores={"b": 0.0, "a": 0.0}))
    state = json.loads(json.dumps(db.state()))
    assert ProgramsDatabase.from_state(state).names == ("a", "b")
    del state["names"]  # a state saved before the names were
    assert ProgramsDatabase.from_state(state).names == ("a", "b")
