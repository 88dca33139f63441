"""Low-rank decompositions of the matrix-multiplication tensor: the AlphaEvolve demonstration.

003 §3.5 (AlphaEvolve, Novikov et al. 2025, §3.1): evolve a gradient-based optimiser that searches
for a rank-R decomposition of the ⟨n,m,p⟩ tensor, which multiplies an n×m matrix by an m×p matrix
with R multiplications (Strassen: ⟨2,2,2⟩ with R = 7).

Convention. With A (n×m), B (m×p) and C = AB, the tensor T has shape (nm, mp, np) and
T[(i,j), (j,k), (i,k)] = 1 (row-major pairs, index i·m + j etc.), zero elsewhere. Factors
U (nm×R), V (mp×R), W (np×R) decompose T when Σ_r U[a,r] V[b,r] W[c,r] = T[a,b,c] for all
a, b, c. The r-th product is then P_r = (Σ_a U[a,r] vec(A)_a)(Σ_b V[b,r] vec(B)_b) and
vec(C)_c = Σ_r W[c,r] P_r.

The candidate program has three evolvable blocks (initialisation, loss, update) and a fixed driver
that optimises all restarts at once (a search phase, then an L1 "sparsify" phase and a short
refinement), rescales each rank-one term so that its U and V columns peak at 1, rounds entries to
integers in stages (freezing the ones within a growing tolerance of an integer and re-optimising
the rest), and finally tries to complete each restart by solving one factor exactly from the
other two (least squares, rounded to halves). The
artefact is every restart's rounded decomposition; the verifier checks each one in exact integer
arithmetic and never uses the candidate's claims.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from graded.search.program.problem import InvalidArtefact, Problem
from graded.search.program.program import check_seed

__all__ = [
    "SKELETON",
    "STRASSEN",
    "VERIFY_TIMEOUT_S",
    "decomposition_rank",
    "exact_decomposition",
    "matmul_problem",
    "matmul_tensor",
    "score_decompositions",
]

SKELETON = '''"""Searches for an exact rank-R decomposition of the <n,m,p> matmul tensor.

Gradient descent on all restarts at once, then staged rounding to integers (AlphaEvolve's
matrix-multiplication demonstration). Evolvable: initialisation, loss and update.
"""
import time

import numpy as np


def matmul_tensor(n, m, p):
    """T[(i,j), (j,k), (i,k)] = 1: the tensor of multiplying an n x m by an m x p matrix."""
    target = np.zeros((n * m, m * p, n * p))
    for i in range(n):
        for j in range(m):
            for k in range(p):
                target[i * m + j, j * p + k, i * p + k] = 1.0
    return target


# EVOLVE-BLOCK-START
def initialise(rng, shapes):
    """Returns the starting factors [U, V, W]; each has shape (restarts, rows, rank)."""
    return [rng.normal(0.0, 0.5, size=shape) for shape in shapes]
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def loss_and_gradients(factors, target, phase, progress):
    """Returns each restart's loss and the gradient of the summed loss for each factor.

    Squared reconstruction error; in the "search" phase a weight decay of 1e-3 keeps the factors
    balanced, in the "sparsify" phase an L1 term of 0.01 drives entries to zero. `progress` runs
    from 0 to 1 over the phase ("search", "sparsify" or "refine").
    """
    u, v, w = factors
    error = np.einsum("zar,zbr,zcr->zabc", u, v, w) - target
    loss = (error**2).sum(axis=(1, 2, 3))
    grads = [
        2.0 * np.einsum("zabc,zbr,zcr->zar", error, v, w),
        2.0 * np.einsum("zabc,zar,zcr->zbr", error, u, w),
        2.0 * np.einsum("zabc,zar,zbr->zcr", error, u, v),
    ]
    if phase == "search":
        grads = [g + 1e-3 * f for g, f in zip(grads, factors)]
    elif phase == "sparsify":
        grads = [g + 1e-2 * np.sign(f) for g, f in zip(grads, factors)]
    return loss, grads
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def update(factors, grads, state, phase, progress):
    """Returns the factors after one Adam step; `state` is a dict kept across the phase's steps.

    The learning rate (0.03 in the "search" phase, 0.01 after it) decays linearly to 5%.
    """
    beta1, beta2, eps = 0.9, 0.999, 1e-10
    base = 0.03 if phase == "search" else 0.01
    rate = base * (0.05 + 0.95 * (1.0 - progress))
    state["t"] = state.get("t", 0) + 1
    t = state["t"]
    first = state.setdefault("m", [np.zeros_like(f) for f in factors])
    second = state.setdefault("v", [np.zeros_like(f) for f in factors])
    out = []
    for k, (f, g) in enumerate(zip(factors, grads)):
        first[k] = beta1 * first[k] + (1 - beta1) * g
        second[k] = beta2 * second[k] + (1 - beta2) * g**2
        step = (first[k] / (1 - beta1**t)) / (np.sqrt(second[k] / (1 - beta2**t)) + eps)
        out.append(f - rate * step)
    return out
# EVOLVE-BLOCK-END


def _optimise(factors, target, frozen, phase, steps):
    state = {}
    for step in range(steps):
        _, grads = loss_and_gradients(factors, target, phase, step / steps)
        new = update(factors, grads, state, phase, step / steps)
        factors = [
            np.where(mask, f, np.asarray(g, dtype=float))
            for f, g, mask in zip(factors, new, frozen)
        ]
    return factors


def _exact(factors, target):
    return bool(np.all(np.abs(np.einsum("ar,br,cr->abc", *factors) - target) < 1e-9))


def _balance(factors):
    """Rescales each rank-one term so that the largest entry of its U and V columns is 1."""
    u, v, w = factors

    def peak(x):
        largest = np.take_along_axis(x, np.argmax(np.abs(x), axis=1)[:, None, :], axis=1)[:, 0]
        return np.where(np.abs(largest) < 1e-12, 1.0, largest)

    a, b = peak(u), peak(v)
    return [u / a[:, None, :], v / b[:, None, :], w * (a * b)[:, None, :]]


def _complete(factors, target):
    """Integer rounding of one restart, or one factor re-solved from the other two if exact."""
    rounded = [np.rint(f) for f in factors]
    if _exact(rounded, target):
        return rounded
    rank = rounded[0].shape[1]
    for solve in range(3):
        a, b = [rounded[k] for k in range(3) if k != solve]
        design = np.einsum("ar,br->abr", a, b).reshape(-1, rank)
        rhs = np.moveaxis(target, solve, -1).reshape(-1, target.shape[solve])
        try:
            solution, *_ = np.linalg.lstsq(design, rhs, rcond=None)
        except np.linalg.LinAlgError:
            continue
        trial = list(rounded)
        trial[solve] = np.rint(2.0 * solution.T) / 2.0
        if _exact(trial, target):
            return trial
    return rounded


def _as_json(matrix):
    return [
        [int(x) if float(x).is_integer() else f"{int(round(2 * x))}/2" for x in row]
        for row in matrix
    ]


def decompose(problem):
    """Runs the search described by `problem` and returns every restart's rounded decomposition."""
    start = time.perf_counter()
    n, m, p, rank = problem["n"], problem["m"], problem["p"], problem["rank"]
    restarts = problem["restarts"]
    rng = np.random.default_rng(problem["seed"])
    target = matmul_tensor(n, m, p)
    shapes = [(restarts, n * m, rank), (restarts, m * p, rank), (restarts, n * p, rank)]
    factors = [np.asarray(f, dtype=float) for f in initialise(rng, shapes)]
    if [f.shape for f in factors] != shapes:
        got = [f.shape for f in factors]
        raise ValueError(f"initialise returned shapes {got}, expected {shapes}")
    frozen = [np.zeros(shape, dtype=bool) for shape in shapes]
    factors = _optimise(factors, target, frozen, "search", problem["search_steps"])
    factors = _optimise(factors, target, frozen, "sparsify", problem["sparsify_steps"])
    factors = _balance(_optimise(factors, target, frozen, "refine", problem["refine_steps"]))
    rounds = problem["refine_rounds"]
    for r in range(rounds):
        tolerance = 0.05 + 0.41 * r / max(rounds - 1, 1)
        for k in range(3):
            snapped = np.rint(factors[k])
            close = (np.abs(factors[k] - snapped) < tolerance) & ~frozen[k]
            factors[k] = np.where(close, snapped, factors[k])
            frozen[k] |= close
        factors = _optimise(factors, target, frozen, "refine", problem["refine_steps"])
    decompositions = []
    for z in range(restarts):
        # a diverged restart (NaN or infinite entries) is returned as zeros: it fails verification
        finite = [np.nan_to_num(f[z], nan=0.0, posinf=0.0, neginf=0.0) for f in factors]
        u, v, w = _complete(finite, target)
        decompositions.append([_as_json(u), _as_json(v), _as_json(w)])
    return {"decompositions": decompositions, "elapsed_s": time.perf_counter() - start}
'''

# Strassen (1969), in this module's convention: A, B, C row-major 2×2, products
# M1 = (A11 + A22)(B11 + B22), M2 = (A21 + A22)B11, M3 = A11(B12 − B22), M4 = A22(B21 − B11),
# M5 = (A11 + A12)B22, M6 = (A21 − A11)(B11 + B12), M7 = (A12 − A22)(B21 + B22);
# C11 = M1 + M4 − M5 + M7, C12 = M3 + M5, C21 = M2 + M4, C22 = M1 − M2 + M3 + M6.
STRASSEN: tuple[list[list[int]], list[list[int]], list[list[int]]] = (
    # U: rows A11, A12, A21, A22; columns M1..M7
    [[1, 0, 1, 0, 1, -1, 0], [0, 0, 0, 0, 1, 0, 1], [0, 1, 0, 0, 0, 1, 0], [1, 1, 0, 1, 0, 0, -1]],
    # V: rows B11, B12, B21, B22
    [[1, 1, 0, -1, 0, 1, 0], [0, 0, 1, 0, 0, 1, 0], [0, 0, 0, 1, 0, 0, 1], [1, 0, -1, 0, 1, 0, 1]],
    # W: rows C11, C12, C21, C22
    [[1, 0, 0, 1, -1, 0, 1], [0, 0, 1, 0, 1, 0, 0], [0, 1, 0, 1, 0, 0, 0], [1, -1, 1, 0, 0, 1, 0]],
)


def matmul_tensor(n: int, m: int, p: int) -> np.ndarray:
    """The ⟨n,m,p⟩ tensor as an integer array of shape (nm, mp, np): T[(i,j),(j,k),(i,k)] = 1."""
    for name, value in (("n", n), ("m", m), ("p", p)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"matrix dimension {name}={value!r}; expected an integer >= 1")
    target = np.zeros((n * m, m * p, n * p), dtype=np.int64)
    for i in range(n):
        for j in range(m):
            for k in range(p):
                target[i * m + j, j * p + k, i * p + k] = 1
    return target


def _parse_entry(entry: Any, where: str) -> Fraction:
    if isinstance(entry, bool):
        raise InvalidArtefact(f"{where} is {entry!r}; expected a number")
    if isinstance(entry, int):
        return Fraction(entry)
    if isinstance(entry, float):
        if not math.isfinite(entry):
            raise InvalidArtefact(f"{where} is {entry!r}; expected a finite number")
        return Fraction(entry)  # exact value of the binary float
    if isinstance(entry, str):
        try:
            return Fraction(entry)
        except (ValueError, ZeroDivisionError):
            raise InvalidArtefact(f"{where} is {entry!r}; expected an integer or 'a/b'") from None
    raise InvalidArtefact(f"{where} is {entry!r}; expected an integer, float or 'a/b' string")


def _parse_factor(matrix: Any, rows: int, label: str) -> list[list[Fraction]]:
    if not isinstance(matrix, (list, tuple)) or len(matrix) != rows:
        raise InvalidArtefact(f"factor {label} must be a list of {rows} rows")
    parsed = []
    width = None
    for a, row in enumerate(matrix):
        if not isinstance(row, (list, tuple)) or not row:
            raise InvalidArtefact(
                f"row {a} of factor {label} is {row!r}; expected a non-empty list"
            )
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise InvalidArtefact(f"row {a} of factor {label} has {len(row)} entries, not {width}")
        parsed.append([_parse_entry(x, f"{label}[{a}][{r}]") for r, x in enumerate(row)])
    return parsed


def exact_decomposition(factors: Any, n: int, m: int, p: int) -> list[list[list[Fraction]]]:
    """Checks that `factors` = [U, V, W] decompose ⟨n,m,p⟩ exactly; returns them as Fractions.

    Entries may be integers, floats (taken at their exact binary value) or strings "a/b". The
    check scales each factor to integers by the least common multiple of its denominators and
    compares Σ_r U[a,r] V[b,r] W[c,r] with the scaled tensor in Python integers. Raises
    `InvalidArtefact` naming the first wrong entry of the reconstruction.
    """
    target = matmul_tensor(n, m, p)
    if not isinstance(factors, (list, tuple)) or len(factors) != 3:
        raise InvalidArtefact("a decomposition must be a list [U, V, W] of three factor matrices")
    parsed = [
        _parse_factor(f, rows, label)
        for f, rows, label in zip(factors, target.shape, ("U", "V", "W"))
    ]
    widths = {len(f[0]) for f in parsed}
    if len(widths) != 1:
        raise InvalidArtefact(f"factors U, V, W have different numbers of columns {sorted(widths)}")
    scales = [math.lcm(*(x.denominator for row in f for x in row)) for f in parsed]
    ints = [
        np.array([[int(x * s) for x in row] for row in f], dtype=object)
        for f, s in zip(parsed, scales)
    ]
    reconstruction = np.einsum("ar,br,cr->abc", *ints)  # object dtype: exact Python integers
    expected = target.astype(object) * (scales[0] * scales[1] * scales[2])
    wrong = np.argwhere(reconstruction != expected)
    if wrong.size:
        a, b, c = (int(x) for x in wrong[0])
        value = Fraction(int(reconstruction[a, b, c]), scales[0] * scales[1] * scales[2])
        raise InvalidArtefact(
            f"reconstruction entry ({a},{b},{c}) is {value}, expected {int(target[a, b, c])} "
            f"({int(wrong.shape[0])} wrong entries)"
        )
    return parsed


def decomposition_rank(factors: list[list[list[Fraction]]]) -> int:
    """Number of rank-one terms that are not zero (a term vanishes when a column is all zero)."""
    width = len(factors[0][0])
    return sum(all(any(row[r] != 0 for row in f) for f in factors) for r in range(width))


def score_decompositions(problem: dict[str, Any], artefact: Any) -> dict[str, float]:
    """Verifier: {success, rank, time} for the decompositions a candidate returns.

    `success` is the fraction of the `restarts` decompositions that reconstruct the tensor
    exactly with at most `rank` non-zero terms; `rank` is the fewest non-zero terms among the
    exact ones (n·m·p, the schoolbook count, when there is none); `time` is the run time the
    candidate reports, clipped to [0, time limit]: it is the one number the verifier cannot
    check, and the engine's own wall-clock time per evaluation is the trusted one.
    """
    n, m, p, rank, restarts = (problem[k] for k in ("n", "m", "p", "rank", "restarts"))
    if not isinstance(artefact, dict) or "decompositions" not in artefact:
        raise InvalidArtefact("expected a dict with a 'decompositions' list")
    decompositions = artefact["decompositions"]
    if not isinstance(decompositions, list) or len(decompositions) != restarts:
        raise InvalidArtefact(f"expected {restarts} decompositions, one per restart")
    elapsed = artefact.get("elapsed_s", float("nan"))
    if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not elapsed >= 0:
        raise InvalidArtefact(f"elapsed_s is {elapsed!r}; expected a number >= 0")
    ranks = []
    for factors in decompositions:
        try:
            ranks.append(decomposition_rank(exact_decomposition(factors, n, m, p)))
        except InvalidArtefact:
            continue  # an inexact restart counts as a failure, not as an invalid artefact
    successes = sum(r <= rank for r in ranks)
    return {
        "success": successes / restarts,
        "rank": float(min(ranks, default=n * m * p)),
        "time": min(float(elapsed), float(problem["time_limit_s"])),
    }


#: The verifier's default time limit per stage (``Problem.verify_timeout_s``), in seconds. The
#: exact check of one decomposition of the schoolbook rank n·m·p takes about 0.8 ms for
#: ⟨2,2,2⟩ (all 32 restarts: 18 ms), 4 ms for ⟨3,3,3⟩, 20 ms for ⟨4,4,4⟩ and 83 ms for ⟨5,5,5⟩
#: (32 restarts: 2.7 s). The fixed `decompose` sends `rank` columns of integers and halves,
#: but a candidate runs in the process that writes the result and can send any factors (up to
#: the sandbox's 64 MB file limit), and the cost grows past any bound with their width and
#: denominators: one ⟨2,2,2⟩ decomposition of 250 columns of entries 1/p (a distinct prime p
#: each, 29 kB of JSON) took 4.4 s, one of 500 columns (62 kB) 47 s. Raise the limit for many
#: restarts of large tensors.
VERIFY_TIMEOUT_S = 30.0


def matmul_problem(
    n: int = 2,
    m: int = 2,
    p: int = 2,
    rank: int = 7,
    restarts: int = 32,
    seed: int = 0,
    search_steps: int = 4000,
    sparsify_steps: int = 2000,
    refine_rounds: int = 10,
    refine_steps: int = 800,
    time_limit_s: float = 120.0,
    verify_timeout_s: float | None = VERIFY_TIMEOUT_S,
) -> Problem:
    """The ⟨n,m,p⟩ rank-`rank` decomposition problem with a vector score ranked by `success`.

    Known upper bounds on the rank: ⟨2,2,2⟩ 7 (Strassen), ⟨2,2,3⟩ 11 (Hopcroft–Kerr),
    ⟨3,3,3⟩ 23 (Laderman). The input carries the optimiser's budget (restarts, steps, seed).
    The precheck (cascade evaluation) runs the same search with 2 restarts and 20 steps a phase.
    `verify_timeout_s`: the verifier's limit per stage (`VERIFY_TIMEOUT_S`; None: no limit, the
    verifier called in the evaluating process).
    """
    matmul_tensor(n, m, p)  # validates n, m, p
    for name, value in (
        ("rank", rank),
        ("restarts", restarts),
        ("search_steps", search_steps),
        ("refine_steps", refine_steps),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"matmul {name}={value!r}; expected an integer >= 1")
    for name, value in (("sparsify_steps", sparsify_steps), ("refine_rounds", refine_rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"matmul {name}={value!r}; expected an integer >= 0")
    # the candidate seeds numpy with it: -1 or 1.5 failed the initial program with numpy's
    # "expected non-negative integer", naming neither the option nor the value
    check_seed(seed, "matmul seed")
    spec = {
        "n": n,
        "m": m,
        "p": p,
        "rank": rank,
        "restarts": restarts,
        "seed": seed,
        "search_steps": search_steps,
        "sparsify_steps": sparsify_steps,
        "refine_rounds": refine_rounds,
        "refine_steps": refine_steps,
        "time_limit_s": time_limit_s,
    }
    precheck = dict(
        spec, restarts=2, search_steps=20, sparsify_steps=20, refine_rounds=2, refine_steps=20
    )
    return Problem(
        name="matmul",
        skeleton=SKELETON,
        entry="decompose",
        inputs=(spec,),
        score=score_decompositions,
        prechecks=(precheck,),
        primary="success",
        minimise=("rank", "time"),
        time_limit_s=time_limit_s,
        memory_mb=2048,
        verify_timeout_s=verify_timeout_s,
        description=(
            f"Exact rank-{rank} decomposition of the <{n},{m},{p}> matrix-multiplication tensor "
            "(score: success rate over restarts, fewest exact terms, reported time)"
        ),
    )
