"""Pattern-avoiding permanent problem: Ryser's formula, pattern counts and local search."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pb_brute import pattern_occurrences_by_loops, permanent_by_permutations

from graded.search.patternboost import (
    DecodeError,
    PatternAvoidingPermanent,
    pattern_counts,
    permanent,
)


@given(st.integers(1, 6), st.integers(0, 10**6), st.integers(1, 5))
@settings(max_examples=40, deadline=None)
def test_ryser_permanent_equals_sum_over_permutations(n, seed, high):
    a = np.random.default_rng(seed).integers(-high, high + 1, (n, n))
    assert permanent(a) == permanent_by_permutations(a)


def test_permanent_of_all_ones_is_factorial_and_of_identity_is_one():
    assert permanent(np.ones((7, 7), dtype=int)) == 5040
    assert permanent(np.eye(9, dtype=int)) == 1
    assert permanent(np.ones((13, 13), dtype=int)) == 6227020800  # 13!, past the int64 path


@pytest.mark.parametrize("n,value", [(12, 100), (10, 2**40), (3, -(2**62)), (14, 1)])
def test_permanent_of_a_constant_matrix_is_exact_where_int64_would_overflow(n, value):
    # perm(c·J_n) = n!·c^n, a closed form independent of Ryser's sum; its terms pass 2^63
    a = np.full((n, n), value, dtype=np.int64)
    assert permanent(a) == math.factorial(n) * value**n


def test_permanent_with_large_entries_equals_sum_over_permutations():
    a = np.random.default_rng(3).integers(-(10**6), 10**6, (6, 6))  # products pass 2^63
    assert permanent(a) == permanent_by_permutations(a)


def test_permanent_rejects_bad_input():
    with pytest.raises(ValueError, match="square"):
        permanent(np.ones((2, 3), dtype=int))
    with pytest.raises(TypeError, match="integer"):
        permanent(np.ones((2, 2)))


@pytest.mark.parametrize("pattern", [(3, 1, 2), (1, 2, 3), (2, 3, 1), (1, 3, 2)])
def test_pattern_counts_equal_loops(pattern):
    rng = np.random.default_rng(sum(pattern) * 7 + pattern[0])
    for _ in range(15):
        a = (rng.random((5, 5)) < 0.5).astype(np.uint8)
        total, per_cell = pattern_counts(a, pattern)
        assert total == pattern_occurrences_by_loops(a, pattern)
        # each occurrence uses three ones
        assert per_cell.sum() == 3 * total


def test_per_cell_count_is_the_drop_when_the_cell_is_cleared():
    rng = np.random.default_rng(3)
    a = (rng.random((5, 5)) < 0.6).astype(np.uint8)
    total, per_cell = pattern_counts(a, (3, 1, 2))
    for r, c in zip(*np.nonzero(a)):
        b = a.copy()
        b[r, c] = 0
        assert total - pattern_occurrences_by_loops(b, (3, 1, 2)) == per_cell[r, c]


@pytest.mark.parametrize("pattern", ["312", "123"])
def test_brute_force_optimum_on_3x3_and_local_search_reaches_it(pattern):
    problem = PatternAvoidingPermanent(3, pattern=pattern)
    best = max(
        problem.score(np.array(bits, dtype=np.uint8).reshape(3, 3))
        for bits in itertools.product((0, 1), repeat=9)
    )
    rng = np.random.default_rng(0)
    found = max(problem.score(problem.local_search(problem.empty(), rng)) for _ in range(60))
    assert found == best


@pytest.mark.parametrize("pattern", ["312", "123"])
def test_local_search_gives_maximal_avoiding_matrix(pattern):
    problem = PatternAvoidingPermanent(5, pattern=pattern)
    rng = np.random.default_rng(1)
    for seed in range(10):
        start = (np.random.default_rng(seed).random((5, 5)) < 0.1 * seed).astype(np.uint8)
        found = problem.local_search(start, rng)
        assert pattern_occurrences_by_loops(found, problem.pattern) == 0
        assert problem.score(found) == permanent_by_permutations(found)
        assert problem.score(found) >= problem.score(start)
        for r, c in zip(*np.nonzero(found == 0)):
            b = found.copy()
            b[r, c] = 1
            assert pattern_occurrences_by_loops(b, problem.pattern) > 0


def test_score_of_matrix_with_pattern_is_minus_its_occurrences():
    problem = PatternAvoidingPermanent(4, pattern="312")
    a = np.ones((4, 4), dtype=np.uint8)
    assert problem.score(a) == -pattern_occurrences_by_loops(a, (3, 1, 2))
    assert not problem.is_valid(a)


def test_matrix_encoding_round_trips_and_rejects_bad_sequences():
    problem = PatternAvoidingPermanent(4, bits_per_token=3)
    a = (np.random.default_rng(0).random((4, 4)) < 0.5).astype(np.uint8)
    assert np.array_equal(problem.decode(problem.encode(a)), a)
    with pytest.raises(DecodeError):
        problem.decode(problem.encode(a)[:-1])


def test_bad_pattern_raises():
    with pytest.raises(ValueError, match="permutation"):
        PatternAvoidingPermanent(4, pattern="113")
