"""Cap-set problem (003 Fig. 3.1): the verifier against brute force, the skeleton's greedy."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from graded.search.program.problem import InvalidArtefact
from graded.search.program.problems.cap_set import (
    BEST_KNOWN_SIZES,
    SKELETON,
    cap_set_problem,
    cap_set_size,
    check_cap_set,
)


def brute_force_is_cap(vectors: list[tuple[int, ...]]) -> bool:
    """No three distinct members sum to zero mod 3: every triple checked directly."""
    for a, b, c in itertools.combinations(vectors, 3):
        if all((x + y + z) % 3 == 0 for x, y, z in zip(a, b, c)):
            return False
    return True


def exact_max_cap(n: int) -> int:
    """Largest cap in F_3^n by branch and bound, written independently of the package.

    Affine maps of F_3^n preserve lines and act transitively on (n+1)-tuples of affinely
    independent points, and a cap larger than the largest cap of F_3^(n-1) spans F_3^n; so when
    the answer exceeds the (n-1)-dimensional maximum, some largest cap contains 0, e_1, ..., e_n
    and the search may start from them. The caller checks that the answer does exceed it.
    """
    points = list(itertools.product(range(3), repeat=n))
    index = {pt: i for i, pt in enumerate(points)}
    third = [[index[tuple((-x - y) % 3 for x, y in zip(a, b))] for b in points] for a in points]
    best = 0

    def extend(chosen: list[int], allowed: int) -> None:
        nonlocal best
        best = max(best, len(chosen))
        while allowed:
            if len(chosen) + allowed.bit_count() <= best:
                return
            x = allowed.bit_length() - 1
            allowed &= ~(1 << x)
            rest = allowed
            for a in chosen:
                rest &= ~(1 << third[x][a])
            extend([*chosen, x], rest)

    base = [index[(0,) * n]] + [index[tuple(int(i == k) for i in range(n))] for k in range(n)]
    allowed = (1 << len(points)) - 1
    for i, a in enumerate(base):
        allowed &= ~(1 << a)
        for b in base[:i]:
            allowed &= ~(1 << third[a][b])
    extend(base, allowed)
    return best


def run_skeleton(n: int, priority_source: str | None = None) -> list[list[int]]:
    """Runs the (trusted) skeleton in-process, optionally with another `priority`."""
    namespace: dict = {}
    exec(SKELETON, namespace)
    if priority_source is not None:
        exec(priority_source, namespace)
    return namespace["solve"](n)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_verifier_agrees_with_brute_force_triple_check_on_random_sets(n):
    rng = np.random.default_rng(n)
    points = list(itertools.product(range(3), repeat=n))
    for _ in range(300):
        size = int(rng.integers(1, min(len(points), 12) + 1))
        chosen = [points[i] for i in rng.choice(len(points), size=size, replace=False)]
        vectors = [list(v) for v in chosen]
        if brute_force_is_cap(chosen):
            assert cap_set_size(n, vectors) == size
        else:
            with pytest.raises(InvalidArtefact, match="sum to 0 mod 3"):
                cap_set_size(n, vectors)


def test_verifier_agrees_with_brute_force_on_every_subset_of_the_plane():
    points = list(itertools.product(range(3), repeat=2))
    largest = 0
    for mask in range(1, 2 ** len(points)):
        chosen = [points[i] for i in range(len(points)) if mask >> i & 1]
        is_cap = brute_force_is_cap(chosen)
        try:
            size = cap_set_size(2, [list(v) for v in chosen])
            accepted = True
        except InvalidArtefact:
            accepted = False
        assert accepted == is_cap
        if accepted:
            largest = max(largest, int(size))
    assert largest == 4 == BEST_KNOWN_SIZES[2]


def test_exact_search_gives_the_known_maximum_for_n_3():
    assert exact_max_cap(2) == 4 > 2
    assert exact_max_cap(3) == 9 == BEST_KNOWN_SIZES[3]


@pytest.mark.slow
def test_exact_search_gives_the_known_maximum_for_n_4():
    assert exact_max_cap(4) == 20 == BEST_KNOWN_SIZES[4]  # ~45 s on one core


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_all_zero_priority_gives_the_cap_set_zero_one_to_the_n(n):
    capset = run_skeleton(n)
    assert sorted(map(tuple, capset)) == list(itertools.product((0, 1), repeat=n))
    assert cap_set_size(n, capset) == 2**n


@pytest.mark.parametrize("n", [2, 3])
def test_greedy_with_random_priorities_reaches_the_exact_maximum_and_never_beyond(n):
    rng = np.random.default_rng(0)
    sizes = set()
    for _ in range(60):
        table = rng.permutation(3**n).tolist()
        source = (
            f"_TABLE = {table}\n"
            "def priority(el, n):\n"
            "    return float(_TABLE[sum(x * 3 ** (n - 1 - i) for i, x in enumerate(el))])\n"
        )
        capset = run_skeleton(n, source)
        size = cap_set_size(n, capset)
        assert brute_force_is_cap([tuple(v) for v in capset])
        sizes.add(size)
    assert max(sizes) == BEST_KNOWN_SIZES[n]


def test_greedy_output_is_maximal_under_brute_force():
    capset = run_skeleton(3, "def priority(el, n):\n    return float(sum(el) % 3 == 1)\n")
    chosen = [tuple(v) for v in capset]
    for point in itertools.product(range(3), repeat=3):
        if point not in chosen:
            assert not brute_force_is_cap([*chosen, point])


@pytest.mark.parametrize(
    ("artefact", "message"),
    [
        ({"a": 1}, "expected a list of vectors"),
        ([[0, 1, 2], [0, 1]], "expected a list of 3 entries"),
        ([[0, 1, 3]], r"expected entries in \{0, 1, 2\}"),
        ([[0, 1, -1]], r"expected entries in \{0, 1, 2\}"),
        ([[True, 0, 0]], r"expected entries in \{0, 1, 2\}"),
        ([[0.0, 0, 0]], r"expected entries in \{0, 1, 2\}"),
        ([[0, 1, 2], [1, 1, 1], [0, 1, 2]], "appears more than once"),
        ([[0, 0, 0], [1, 2, 0], [2, 1, 0]], r"\[0, 0, 0\], \[1, 2, 0\] and \[2, 1, 0\]"),
    ],
)
def test_verifier_rejects_bad_artefacts_with_the_reason(artefact, message):
    with pytest.raises(InvalidArtefact, match=message):
        check_cap_set(artefact, 3)


def test_empty_set_is_a_cap_of_size_zero():
    assert cap_set_size(3, []) == 0.0


def test_problem_has_one_input_and_one_evolvable_priority():
    problem = cap_set_problem(n=5)
    assert problem.name == "cap-set" and problem.entry == "solve" and problem.inputs == (5,)
    assert SKELETON.count("# EVOLVE-BLOCK-START") == SKELETON.count("# EVOLVE-BLOCK-END") == 1
    block = SKELETON.split("# EVOLVE-BLOCK-START")[1].split("# EVOLVE-BLOCK-END")[0]
    assert "def priority(el, n)" in block


@pytest.mark.parametrize("n", [0, -2, 2.0, True, "3", 11])
def test_problem_rejects_bad_dimensions(n):
    with pytest.raises(ValueError, match="cap-set dimension"):
        cap_set_problem(n=n)


def test_registry_builds_the_problem_and_the_skeleton_artefact_survives_json():
    from graded.search.program.problem import available_problems, get_problem

    assert {"cap-set", "bin-packing", "matmul"} <= set(available_problems())
    problem = get_problem("cap-set", n=4)
    assert problem.inputs == (4,) and problem.prechecks == ()
    artefact = json.loads(json.dumps(run_skeleton(4)))  # the sandbox sends JSON back
    assert problem.score(4, artefact) == 16.0


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_weighted_initial_priority_scores_like_the_zero_priority(n):
    problem = cap_set_problem(n=n, initial="weighted")
    namespace: dict = {}
    exec(problem.skeleton, namespace)
    assert "% 3.0" in problem.skeleton and "return 0.0" not in problem.skeleton
    assert cap_set_size(n, namespace["solve"](n)) == 2**n
    with pytest.raises(ValueError, match="cap-set initial='best'"):
        cap_set_problem(n=n, initial="best")
