"""Cap sets in F_3^n: the greedy skeleton of 003 Fig. 3.1 (FunSearch) and its verifier.

A cap set is a set of vectors of F_3^n with no three distinct members on a line; in F_3^n three
distinct vectors a, b, c are collinear exactly when a + b + c ≡ 0 (mod 3), i.e. c = −(a + b).
The candidate program enumerates F_3^n, orders the vectors by an evolvable `priority(el, n)` and
adds them greedily while the set stays cap-free. Its artefact is the list of vectors; the verifier
checks it from scratch and scores it by its size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graded.search.program.problem import InvalidArtefact, Problem

__all__ = [
    "BEST_KNOWN_SIZES",
    "INITIAL_PRIORITIES",
    "SKELETON",
    "VERIFY_TIMEOUT_S",
    "cap_set_problem",
    "cap_set_size",
    "check_cap_set",
]

# Largest cap sets known in F_3^n. n ≤ 6 are proven maxima (n = 6: Potechin 2008); n = 7 is Edel's
# construction and n = 8 the one found by FunSearch (Romera-Paredes et al., Nature 2024).
BEST_KNOWN_SIZES: dict[int, int] = {1: 2, 2: 4, 3: 9, 4: 20, 5: 45, 6: 112, 7: 236, 8: 512}

SKELETON = '''"""Finds large cap sets in F_3^n greedily, in decreasing `priority` (003 Fig. 3.1)."""
import itertools

import numpy as np


def solve(n):
    """Returns a cap set of F_3^n as a list of vectors.

    All 3^n vectors are ranked by decreasing `priority` (ties keep lexicographic order, as the
    argmax of FunSearch's cap-set specification does) and each is added when no two vectors
    already chosen complete a line with it.
    """
    elements = np.array(list(itertools.product((0, 1, 2), repeat=n)), dtype=np.int64)
    powers = 3 ** np.arange(n - 1, -1, -1)
    scores = np.array([float(priority(tuple(int(x) for x in el), n)) for el in elements])
    if not np.all(np.isfinite(scores)):
        raise ValueError("priority returned a non-finite value")
    order = np.argsort(-scores, kind="stable")
    available = np.ones(len(elements), dtype=bool)
    capset = np.empty((0, n), dtype=np.int64)
    for index in order:
        if not available[index]:
            continue
        vector = elements[index]
        # the third point of the line through `vector` and each chosen point is now forbidden
        available[((-capset - vector) % 3) @ powers] = False
        available[index] = False
        capset = np.vstack([capset, vector])
    return capset.tolist()


# EVOLVE-BLOCK-START
def priority(el, n):
    """Returns the priority with which we want to add `el` to the cap set."""
    return 0.0
# EVOLVE-BLOCK-END
'''

# Bodies of the initial `priority`. "zero" is FunSearch's start. "weighted" scores the same
# (2^n for n <= 6) but is a weighted coordinate sum modulo 3 whose constants and operators give
# the offline proposer something to mutate: changing the modulus alone already reaches 9 for
# n = 3 and 18 for n = 4 (`(1·i + 1)` weights, modulus 4).
INITIAL_PRIORITIES: dict[str, str] = {
    "zero": "return 0.0",
    "weighted": "return sum((1.0 * i + 1.0) * x for i, x in enumerate(el)) % 3.0",
}


def check_cap_set(vectors: Any, n: int) -> np.ndarray:
    """Checks that `vectors` is a cap set of F_3^n and returns it as a (k, n) integer array.

    Raises `InvalidArtefact` naming the first problem found: a wrong type or length, an entry
    outside {0, 1, 2}, a repeated vector, or three distinct vectors a, b, c with
    a + b + c ≡ 0 (mod 3). The line check visits every pair {a, b} once and looks up the third
    point −(a + b) mod 3 among the vectors' base-3 codes.
    """
    if not isinstance(vectors, (list, tuple)):
        raise InvalidArtefact(f"expected a list of vectors, got {type(vectors).__name__}")
    rows = []
    for position, vector in enumerate(vectors):
        if not isinstance(vector, (list, tuple)) or len(vector) != n:
            raise InvalidArtefact(
                f"vector {position} is {vector!r}; expected a list of {n} entries"
            )
        for entry in vector:
            if isinstance(entry, bool) or not isinstance(entry, int) or entry not in (0, 1, 2):
                raise InvalidArtefact(
                    f"vector {position} is {vector!r}; expected entries in {{0, 1, 2}}"
                )
        rows.append(list(vector))
    points = np.array(rows, dtype=np.int64).reshape(len(rows), n)
    powers = 3 ** np.arange(n - 1, -1, -1, dtype=np.int64)
    codes = points @ powers
    unique, counts = np.unique(codes, return_counts=True)
    if np.any(counts > 1):
        repeated = int(unique[np.argmax(counts > 1)])
        first = int(np.flatnonzero(codes == repeated)[0])
        raise InvalidArtefact(f"vector {points[first].tolist()} appears more than once")
    members = np.zeros(3**n, dtype=bool)
    members[codes] = True
    for i in range(len(points) - 1):
        thirds = ((-(points[i] + points[i + 1 :])) % 3) @ powers
        hits = np.flatnonzero(members[thirds])
        if hits.size:
            j = i + 1 + int(hits[0])
            third = (-(points[i] + points[j])) % 3
            raise InvalidArtefact(
                f"vectors {points[i].tolist()}, {points[j].tolist()} and {third.tolist()} "
                "sum to 0 mod 3 (a line)"
            )
    return points


def cap_set_size(n: Any, artefact: Any) -> float:
    """Verifier of the cap-set problem: the size of `artefact` once `check_cap_set` accepts it."""
    return float(len(check_cap_set(artefact, _dimension(n))))


def _dimension(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"cap-set dimension n={n!r}; expected an integer >= 1")
    return n


#: The verifier's default time limit per stage (``Problem.verify_timeout_s``), in seconds. The
#: checks cost O(k·n) per entry and O(k²·n) for the lines of a cap set of k vectors: about
#: 1 ms for n = 4, 43 ms for the 1024 vectors of {0, 1}^10 and 0.11 s for a 1458-vector cap
#: set of F_3^10 (the product of three 9-caps of F_3^3 and {0, 1}). The fixed `solve` builds
#: the artefact, but a candidate runs in the process that writes the result and can send any
#: list up to the sandbox's 64 MB file limit: 2 million vectors of F_3^10 held the checks 9.7 s.
VERIFY_TIMEOUT_S = 5.0


def cap_set_problem(n: int = 4, initial: str = "zero", time_limit_s: float = 30.0,
                    verify_timeout_s: float | None = VERIFY_TIMEOUT_S) -> Problem:
    """The cap-set problem in F_3^n (003 §3.4, Fig. 3.1), evolving `priority(el, n)`.

    The score signature has one entry, the size of the cap set built for `n`. There is no
    precheck: one evaluation costs about as much as starting the sandbox. The all-zero
    priority gives the cap set {0, 1}^n of size 2^n; the best known sizes are in
    `BEST_KNOWN_SIZES`. Dimensions above 10 are refused: the skeleton enumerates all 3^n vectors.
    `initial` picks the starting `priority` from `INITIAL_PRIORITIES` ("zero" is FunSearch's).
    `verify_timeout_s`: the verifier's limit per stage (`VERIFY_TIMEOUT_S`; None: no limit,
    the verifier called in the evaluating process).
    """
    if initial not in INITIAL_PRIORITIES:
        raise ValueError(
            f"cap-set initial={initial!r}; expected one of {sorted(INITIAL_PRIORITIES)}"
        )
    n = _dimension(n)
    if n > 10:
        raise ValueError(
            f"cap-set dimension n={n}; expected n <= 10 (the skeleton lists all 3^n vectors)"
        )
    best = BEST_KNOWN_SIZES.get(n)
    return Problem(
        name="cap-set",
        skeleton=SKELETON.replace("    return 0.0\n", f"    {INITIAL_PRIORITIES[initial]}\n"),
        entry="solve",
        inputs=(n,),
        score=cap_set_size,
        time_limit_s=time_limit_s,
        memory_mb=1024,
        verify_timeout_s=verify_timeout_s,
        description=(
            f"Largest cap set in F_3^{n} built greedily in decreasing `priority` order "
            f"(initial priority: {initial}) "
            f"(score = size; all-zero priority gives {2**n}"
            + (f"; best known {best})" if best is not None else ")")
        ),
    )
