"""Matrix-multiplication decompositions (AlphaEvolve demo): exact verification, default search."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

from graded.search.program.problem import InvalidArtefact
from graded.search.program.problems.matmul import (
    SKELETON,
    STRASSEN,
    decomposition_rank,
    exact_decomposition,
    matmul_problem,
    matmul_tensor,
    score_decompositions,
)


def multiply_with(factors, a, b):
    """C = AB through the R products of a decomposition, in Python integers."""
    u, v, w = (np.array(f, dtype=object) for f in factors)
    products = (a.reshape(-1) @ u) * (b.reshape(-1) @ v)
    return (w @ products).reshape(a.shape[0], b.shape[1])


def schoolbook(n, m, p):
    """The rank-nmp decomposition with one product A[i,j]·B[j,k] per term."""
    u = np.zeros((n * m, n * m * p), dtype=int)
    v = np.zeros((m * p, n * m * p), dtype=int)
    w = np.zeros((n * p, n * m * p), dtype=int)
    for r, (i, j, k) in enumerate(itertools.product(range(n), range(m), range(p))):
        u[i * m + j, r] = v[j * p + k, r] = w[i * p + k, r] = 1
    return [u.tolist(), v.tolist(), w.tolist()]


def run_skeleton(spec):
    """Runs the (trusted) skeleton in-process."""
    namespace: dict = {}
    exec(SKELETON, namespace)
    return namespace["decompose"](spec)


@pytest.mark.parametrize("shape", [(2, 2, 2), (2, 3, 4), (3, 3, 3), (1, 4, 2)])
def test_tensor_is_the_bilinear_map_of_matrix_multiplication(shape):
    n, m, p = shape
    rng = np.random.default_rng(0)
    a = rng.integers(-5, 6, size=(n, m))
    b = rng.integers(-5, 6, size=(m, p))
    product = np.einsum("abc,a,b->c", matmul_tensor(n, m, p), a.reshape(-1), b.reshape(-1))
    assert np.array_equal(product.reshape(n, p), a @ b)


def test_strassen_factors_verify_exactly_and_multiply_matrices():
    factors = exact_decomposition([copy.deepcopy(f) for f in STRASSEN], 2, 2, 2)
    assert decomposition_rank(factors) == 7
    rng = np.random.default_rng(1)
    for _ in range(20):
        a = rng.integers(-9, 10, size=(2, 2)).astype(object)
        b = rng.integers(-9, 10, size=(2, 2)).astype(object)
        assert np.array_equal(multiply_with(STRASSEN, a, b), a @ b)


@pytest.mark.parametrize("delta", [1, -1])
def test_every_single_entry_perturbation_of_strassen_fails(delta):
    for k, a, r in itertools.product(range(3), range(4), range(7)):
        perturbed = copy.deepcopy([list(map(list, f)) for f in STRASSEN])
        perturbed[k][a][r] += delta
        with pytest.raises(InvalidArtefact, match="reconstruction entry"):
            exact_decomposition(perturbed, 2, 2, 2)


def test_rational_entries_verify_exactly():
    scaled = [list(map(list, f)) for f in STRASSEN]
    for a in range(4):  # term 0: U column doubled, W column halved (as 'a/b' strings)
        scaled[0][a][0] *= 2
        scaled[2][a][0] = f"{scaled[2][a][0]}/2"
    factors = exact_decomposition(scaled, 2, 2, 2)
    assert decomposition_rank(factors) == 7
    halves = [list(map(list, f)) for f in STRASSEN]
    for a in range(4):  # the same with binary floats, which are exact
        halves[0][a][1] *= 2
        halves[2][a][1] = halves[2][a][1] * 0.5
    exact_decomposition(halves, 2, 2, 2)
    tenths = [list(map(list, f)) for f in STRASSEN]
    for a in range(4):  # 0.1 is not exactly one tenth in binary: ×10 then ×0.1 is not exact
        tenths[0][a][0] *= 10
        tenths[2][a][0] = tenths[2][a][0] * 0.1
    with pytest.raises(InvalidArtefact, match="reconstruction entry"):
        exact_decomposition(tenths, 2, 2, 2)


@pytest.mark.parametrize("shape", [(2, 2, 2), (2, 3, 2), (3, 1, 2)])
def test_schoolbook_decomposition_verifies_with_rank_nmp(shape):
    factors = exact_decomposition(schoolbook(*shape), *shape)
    assert decomposition_rank(factors) == shape[0] * shape[1] * shape[2]


def test_zero_columns_do_not_count_towards_the_rank():
    padded = [[[*row, 0] for row in f] for f in STRASSEN]
    assert decomposition_rank(exact_decomposition(padded, 2, 2, 2)) == 7


@pytest.mark.parametrize(
    ("factors", "message"),
    [
        ([STRASSEN[0], STRASSEN[1]], r"list \[U, V, W\]"),
        ([STRASSEN[0][:3], STRASSEN[1], STRASSEN[2]], "factor U must be a list of 4 rows"),
        ([STRASSEN[0], [[1, 2], *STRASSEN[1][1:]], STRASSEN[2]], "row 1 of factor V has 7"),
        ([STRASSEN[0], STRASSEN[1], [r[:6] for r in STRASSEN[2]]], "different numbers of columns"),
        ([[["x"] * 7, *STRASSEN[0][1:]], STRASSEN[1], STRASSEN[2]], r"U\[0\]\[0\] is 'x'"),
        ([[[float("nan")] * 7, *STRASSEN[0][1:]], STRASSEN[1], STRASSEN[2]], "finite number"),
        ([[[True] * 7, *STRASSEN[0][1:]], STRASSEN[1], STRASSEN[2]], "expected a number"),
    ],
)
def test_malformed_decompositions_are_rejected_with_the_reason(factors, message):
    with pytest.raises(InvalidArtefact, match=message):
        exact_decomposition([list(map(list, f)) for f in factors], 2, 2, 2)


def test_score_counts_exact_restarts_and_the_smallest_exact_rank():
    spec = matmul_problem(2, 2, 2, rank=7, restarts=3).inputs[0]
    wrong = [list(map(list, f)) for f in STRASSEN]
    wrong[1][0][0] = 5
    artefact = {"decompositions": [STRASSEN, wrong, schoolbook(2, 2, 2)], "elapsed_s": 1.5}
    score = score_decompositions(spec, artefact)
    assert score == {"success": pytest.approx(1 / 3), "rank": 7.0, "time": 1.5}
    none = {"decompositions": [wrong] * 3, "elapsed_s": 1e9}
    assert score_decompositions(spec, none) == {"success": 0.0, "rank": 8.0, "time": 120.0}


@pytest.mark.parametrize(
    ("artefact", "message"),
    [
        ([STRASSEN], "expected a dict"),
        ({"decompositions": [STRASSEN]}, "expected 2 decompositions"),
        ({"decompositions": [STRASSEN] * 2, "elapsed_s": -1}, "elapsed_s is -1"),
        ({"decompositions": [STRASSEN] * 2}, "elapsed_s is nan"),
    ],
)
def test_score_rejects_malformed_artefacts(artefact, message):
    spec = matmul_problem(2, 2, 2, rank=7, restarts=2).inputs[0]
    with pytest.raises(InvalidArtefact, match=message):
        score_decompositions(spec, artefact)


def test_default_skeleton_finds_strassen_rank_7_exactly():
    problem = matmul_problem(2, 2, 2, rank=7, restarts=16, seed=0)
    artefact = run_skeleton(problem.inputs[0])
    score = problem.score(problem.inputs[0], artefact)
    assert score["rank"] == 7.0 and score["success"] >= 0.5
    exact = 0
    for factors in artefact["decompositions"]:
        try:
            found = exact_decomposition(factors, 2, 2, 2)
        except InvalidArtefact:
            continue
        exact += 1
        rng = np.random.default_rng(exact)
        a = rng.integers(-9, 10, size=(2, 2)).astype(object)
        b = rng.integers(-9, 10, size=(2, 2)).astype(object)
        assert np.array_equal(multiply_with(found, a, b), a @ b)
    assert exact / 16 == score["success"]


@pytest.mark.slow  # a 2x2x3 search of 3 s on 2 cores (Strassen's stays): `pytest -m slow`
def test_default_skeleton_finds_an_exact_rank_11_decomposition_of_2x2x3():
    # Hopcroft and Kerr (1971): <2,2,3> needs 11 products
    problem = matmul_problem(2, 2, 3, rank=11, restarts=8, seed=0)
    artefact = run_skeleton(problem.inputs[0])
    score = problem.score(problem.inputs[0], artefact)
    assert score["rank"] == 11.0 and score["success"] > 0
    rng = np.random.default_rng(0)
    a = rng.integers(-9, 10, size=(2, 2)).astype(object)
    b = rng.integers(-9, 10, size=(2, 3)).astype(object)
    for factors in artefact["decompositions"]:
        try:
            found = exact_decomposition(factors, 2, 2, 3)
        except InvalidArtefact:
            continue
        assert np.array_equal(multiply_with(found, a, b), a @ b)


def test_rank_6_for_2x2_is_never_found():
    # Winograd (1971): the rank of <2,2,2> is 7, so no restart may verify at rank 6
    problem = matmul_problem(
        2, 2, 2, rank=6, restarts=8, search_steps=1000, refine_rounds=3, refine_steps=200
    )
    score = problem.score(problem.inputs[0], run_skeleton(problem.inputs[0]))
    assert score["success"] == 0.0 and score["rank"] == 8.0


def test_problem_has_three_evolvable_blocks_and_a_primary_score():
    problem = matmul_problem()
    assert SKELETON.count("# EVOLVE-BLOCK-START") == SKELETON.count("# EVOLVE-BLOCK-END") == 3
    parts = SKELETON.split("# EVOLVE-BLOCK-START")[1:]
    blocks = [part.split("# EVOLVE-BLOCK-END")[0] for part in parts]
    assert "def initialise(" in blocks[0]
    assert "def loss_and_gradients(" in blocks[1]
    assert "def update(" in blocks[2]
    assert problem.primary == "success" and problem.entry == "decompose"
    assert problem.minimise == ("rank", "time")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "matrix dimension n=0"),
        ({"p": 2.5}, "matrix dimension p=2.5"),
        ({"rank": 0}, "matmul rank=0"),
        ({"restarts": True}, "matmul restarts=True"),
        ({"refine_rounds": -1}, "matmul refine_rounds=-1"),
    ],
)
def test_problem_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        matmul_problem(**kwargs)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_diverged_restarts_come_back_as_failures_not_crashes():
    namespace: dict = {}
    exec(SKELETON, namespace)
    exec(
        "def update(factors, grads, state, phase, progress):\n"
        "    return [f * np.inf for f in factors]\n",
        namespace,
    )
    problem = matmul_problem(
        2,
        2,
        2,
        rank=7,
        restarts=2,
        search_steps=3,
        sparsify_steps=0,
        refine_rounds=1,
        refine_steps=2,
    )
    artefact = namespace["decompose"](problem.inputs[0])
    assert problem.score(problem.inputs[0], artefact)["success"] == 0.0


def test_registry_builds_the_problem_and_its_precheck_runs():
    import json

    from graded.search.program.problem import get_problem

    problem = get_problem("matmul", n=2, m=2, p=3, rank=11)
    (precheck,) = problem.prechecks
    assert precheck["restarts"] == 2 and (precheck["n"], precheck["p"]) == (2, 3)
    artefact = json.loads(json.dumps(run_skeleton(precheck)))  # the sandbox sends JSON back
    score = problem.score(precheck, artefact)
    assert set(score) == {"success", "rank", "time"} and 0.0 <= score["success"] <= 1.0
