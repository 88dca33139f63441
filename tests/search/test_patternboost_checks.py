"""PatternBoost problems, database and local-search driver: the checks no other test reaches,
the problems' small accessors against hand-computed values, and the executor path."""

import json
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from graded.search.patternboost.database import Database, key_to_str
from graded.search.patternboost.hypercube import HypercubeDiameter
from graded.search.patternboost.parallel import make_executor, run_local_searches
from graded.search.patternboost.permanent import PatternAvoidingPermanent, permanent
from graded.search.patternboost.problems import make_problem, problem_arguments

# -- registry ----------------------------------------------------------------------------------


def test_make_problem_names_an_unknown_problem_and_option():
    with pytest.raises(ValueError, match=r"unknown problem 'cube'; expected one of \[.*"
                                         r"'hypercube'.*\]"):
        make_problem("cube", {})
    with pytest.raises(ValueError, match=r"problem 'hypercube' takes no option 'n'; expected "
                                         r"some of \['bits_per_token', 'd'\]"):
        make_problem("hypercube", {"n": 3})


def test_problem_arguments_of_a_constructor_taking_any_keyword_is_none():
    class Open:
        def __init__(self, **options):
            pass

    class Closed:
        def __init__(self, a, *, b=1):
            pass

    assert problem_arguments(Open) is None
    assert problem_arguments(Closed) == {"a", "b"}


# -- hypercube ---------------------------------------------------------------------------------


def test_hypercube_accessors_follow_the_cube():
    cube = HypercubeDiameter(3, bits_per_token=4)
    # Q_3 has 3·2^2 = 12 edges, packed 4 bits to a token: 3 tokens over 16 token values
    assert (cube.n, cube.vocab_size, cube.max_length) == (3, 16, 3)
    assert cube.params() == {"d": 3, "bits_per_token": 4}
    rebuilt = make_problem("hypercube", cube.params())
    x = np.zeros(12, dtype=np.uint8)
    x[[0, 5]] = 1
    assert rebuilt.key(x) == cube.key(x) and len(cube.key(x)) == 2  # 12 bits in 2 bytes
    assert cube.key(x) != cube.key(np.zeros(12, dtype=np.uint8))


def test_hypercube_describes_deletions_and_score():
    square = HypercubeDiameter(2)  # Q_2 is the 4-cycle: deleting an edge leaves a path P_4,
    assert square.describe(square.empty()) == "0 deleted, score 0"
    one = square.empty()
    one[0] = 1  # whose two ends are 3 apart: score 1 deleted − 1 far pair
    assert square.describe(one) == "1 deleted, score 0"


def test_hypercube_objects_are_checked():
    cube = HypercubeDiameter(2)
    with pytest.raises(ValueError, match=r"expected a 0/1 vector of length 4, got shape \(5,\)"):
        cube.key(np.zeros(5))
    with pytest.raises(ValueError, match=r"expected a 0/1 vector of length 4, got entries \[2\]"):
        cube.describe(np.array([0, 2, 1, 0]))


# -- permanent ---------------------------------------------------------------------------------


def test_permanent_of_the_empty_matrix_is_one_and_large_ones_are_refused():
    assert permanent(np.zeros((0, 0), dtype=np.int64)) == 1
    with pytest.raises(ValueError, match=r"permanent is limited to n <= 20, got n = 21"):
        permanent(np.ones((21, 21), dtype=np.int64))


@pytest.mark.parametrize("n", [0, 13, 2.0])
def test_permanent_problem_size_is_checked(n):
    with pytest.raises(ValueError, match=rf"n must be an int in 1..12 .*got {n!r}"):
        PatternAvoidingPermanent(n)


def test_permanent_problem_accessors_and_description():
    prob = PatternAvoidingPermanent(3, pattern="312", bits_per_token=4)
    assert (prob.vocab_size, prob.max_length) == (16, 3)  # 9 entries, 4 bits a token
    assert prob.params() == {"n": 3, "pattern": "312", "bits_per_token": 4}
    again = make_problem("permanent", prob.params())
    eye = np.eye(3, dtype=np.uint8)
    assert again.key(eye) == prob.key(eye) != prob.key(np.ones((3, 3), dtype=np.uint8))
    # the identity's ones have increasing columns (pattern 123): it avoids 312, perm = 1
    assert prob.describe(eye) == "3 ones, score 1"
    assert PatternAvoidingPermanent(2).describe(np.ones((2, 2))) == "4 ones, score 2"


def test_permanent_objects_are_checked():
    prob = PatternAvoidingPermanent(2)
    with pytest.raises(ValueError, match=r"of shape \(2, 2\), got shape \(3, 3\)"):
        prob.key(np.eye(3))
    with pytest.raises(ValueError, match=r"of shape \(2, 2\), got entries \[-1, 3\]"):
        prob.describe(np.array([[0, 3], [-1, 1]]))


# -- database ----------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [0, 2.5])
def test_database_capacity_is_checked(capacity):
    with pytest.raises(ValueError, match=rf"capacity must be a positive int, got {capacity!r}"):
        Database(capacity)


def test_database_length_membership_and_keys():
    db = Database(2)
    assert db.add("a", 1.0, [1]) and db.add("b", 2.0, [2]) and not db.add("a", 5.0, [3])
    assert len(db) == 2 and "a" in db and "c" not in db
    assert key_to_str("abc") == "abc"
    assert key_to_str(b"\x01\xff") == "01ff"
    assert key_to_str((1, 2)) == "(1, 2)"


@pytest.mark.parametrize("order", [("a", "nan", "c"), ("c", "nan", "a")])
def test_database_refuses_a_nan_score_whatever_the_order_of_insertion(order):
    # with NaN in the sort the best valid entry depended on the order: "a" (3) before "c" (5)
    scores = {"a": 3.0, "nan": float("nan"), "c": 5.0}
    db = Database(5)
    for key in order:
        if key == "nan":
            with pytest.raises(ValueError, match=r"object 'nan' has score nan; expected a "
                                                 r"number, not NaN"):
                db.add(key, scores[key], [0])
        else:
            db.add(key, scores[key], [0])
    assert [e.key for e in db.sorted()] == ["c", "a"]
    assert db.best_entry().key == "c" and db.best() == 5.0


def test_database_orders_infinite_scores_like_any_other():
    db = Database(5)
    for key, score in [("b", -math.inf), ("a", 1.0), ("c", math.inf)]:
        db.add(key, score, [0])
    assert [e.key for e in db.sorted()] == ["c", "a", "b"]
    assert Database.from_json(json.loads(json.dumps(db.to_json()))).sorted() == db.sorted()


# -- parallel ----------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [-1, 2.0])
def test_make_executor_checks_workers(workers):
    with pytest.raises(ValueError, match=rf"workers must be an int >= 0, got {workers!r}"):
        make_executor(workers)


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match=r"chunk_size must be >= 1, got 0"):
        run_local_searches(HypercubeDiameter(2), [None], seed=0, stage=0, chunk_size=0)


def test_searches_through_an_executor_equal_in_process_ones_and_report_chunks():
    prob = PatternAvoidingPermanent(3)
    starts = [None] * 5
    inline, pooled = [], []
    here = run_local_searches(prob, starts, seed=1, stage=2, chunk_size=2, on_chunk=inline.append)
    with ThreadPoolExecutor(max_workers=2) as pool:
        there = run_local_searches(prob, starts, seed=1, stage=2, chunk_size=2, executor=pool,
                                   on_chunk=pooled.append)
    assert here == there and len(here) == 5
    assert inline == pooled == [2, 2, 1]
    for tokens, score, _key in here:  # each result is a valid object with its score
        obj = prob.decode(tokens)
        assert prob.is_valid(obj) and score == prob.score(obj)
