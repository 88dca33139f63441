"""Largest permanent of a binary matrix whose support avoids a pattern (003 §3.3).

003 §3.3 names the 312 pattern; the public PatternBoost code avoids 123. Both (and any
pattern of length 3) are supported. A matrix M contains the pattern π = (π1, π2, π3) when there
are rows r1 < r2 < r3 and ones M[r_a, x_a] = 1 whose columns are ordered as π is
(x_a < x_b exactly when π_a < π_b); M avoids π when it contains no such triple.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .problem import Problem, pack_bits, packed_length, unpack_bits

__all__ = ["PatternAvoidingPermanent", "pattern_counts", "permanent"]

_MAX_PERMANENT_N = 20


def permanent(matrix: np.ndarray) -> int:
    """Permanent of an integer square matrix by Ryser's formula.

    perm(A) = (−1)^n Σ_{S ⊆ [n]} (−1)^{|S|} Π_i Σ_{j ∈ S} a_ij (Ryser 1963), all 2^n column
    subsets at once with numpy; exact integer arithmetic (Python ints wherever int64 could
    overflow: large entries, or n >= 14 for a 0/1 matrix).
    """
    a = np.asarray(matrix)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"permanent needs a square matrix, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer) and not np.issubdtype(a.dtype, np.bool_):
        raise TypeError(f"permanent needs an integer matrix, got dtype {a.dtype}")
    n = a.shape[0]
    if n == 0:
        return 1
    if n > _MAX_PERMANENT_N:
        raise ValueError(f"permanent is limited to n <= {_MAX_PERMANENT_N}, got n = {n}")
    subsets = ((np.arange(1 << n)[:, None] >> np.arange(n)) & 1).astype(np.int64)  # (2^n, n)
    signs = np.where((n - subsets.sum(axis=1)) % 2 == 0, 1, -1)
    # |Σ_{j∈S} a_ij| <= bound for every row and subset, so each of the 2^n products is at most
    # bound^n in absolute value: the int64 path is taken only where that cannot overflow
    bound = max(sum(abs(int(v)) for v in row) for row in a.tolist())
    if bound >= 2**63:
        row_sums = subsets.astype(object) @ a.astype(object).T  # Python ints throughout
    else:
        row_sums = subsets @ a.astype(np.int64).T  # (2^n, n): Σ_{j∈S} a_ij for each row i
    if (1 << n) * bound**n < 2**63:
        return int((signs * np.prod(row_sums, axis=1)).sum())
    products = [int(np.prod(r.astype(object))) for r in row_sums]
    return int(sum(int(s) * p for s, p in zip(signs, products)))


def _check_pattern(pattern: Sequence[int] | str | int) -> tuple[int, int, int]:
    """`pattern` as a tuple; a string or an int is its digits ("312", 312: YAML and JSON config
    files read an unquoted `pattern: 312` as the int)."""
    digits = str(pattern) if isinstance(pattern, int) and not isinstance(pattern, bool) else pattern
    try:
        p = tuple(int(x) for x in digits)
    except (TypeError, ValueError):
        p = ()
    if sorted(p) != [1, 2, 3]:
        raise ValueError(f"pattern must be a permutation of 1, 2, 3 (e.g. '312' or (3, 1, 2)), "
                         f"got {pattern!r}")
    return p  # type: ignore[return-value]


def pattern_counts(matrix: np.ndarray, pattern: Sequence[int]) -> tuple[int, np.ndarray]:
    """Occurrences of a length-3 pattern among the ones of a 0/1 matrix.

    Returns the total and, per cell, the number of occurrences using that cell. All triples
    of ones are checked at once (k ones give a k×k×k boolean array, so keep n ≲ 12).
    """
    p = _check_pattern(pattern)
    a = np.asarray(matrix)
    rows, cols = np.nonzero(a)
    per_cell = np.zeros(a.shape, dtype=np.int64)
    if len(rows) < 3:
        return 0, per_cell

    def ordered(x: np.ndarray, first: int, second: int) -> np.ndarray:
        # [u, v] is True when the ones u, v may play roles `first`, `second` of the pattern
        if p[first] < p[second]:
            return x[:, None] < x[None, :]
        return x[:, None] > x[None, :]

    row_lt = rows[:, None] < rows[None, :]
    first_second = row_lt & ordered(cols, 0, 1)
    second_third = row_lt & ordered(cols, 1, 2)
    first_third = ordered(cols, 0, 2)
    triples = first_second[:, :, None] & second_third[None, :, :] & first_third[:, None, :]
    by_one = triples.sum(axis=(1, 2)) + triples.sum(axis=(0, 2)) + triples.sum(axis=(0, 1))
    per_cell[rows, cols] = by_one
    return int(triples.sum()), per_cell


def _creates_pattern(a: np.ndarray, r: int, c: int, p: tuple[int, int, int]) -> bool:
    """Whether setting a[r, c] = 1 (currently 0) creates an occurrence of pattern p."""
    rows, cols = np.nonzero(a)
    if len(rows) < 2:
        return False
    for role in range(3):
        others = [k for k in range(3) if k != role]
        # the other two ones u, v take roles others[0] < others[1] (in row order)
        ok_u = _fits(rows, cols, r, c, role, others[0], p)
        ok_v = _fits(rows, cols, r, c, role, others[1], p)
        u_idx, v_idx = np.flatnonzero(ok_u), np.flatnonzero(ok_v)
        if len(u_idx) == 0 or len(v_idx) == 0:
            continue
        ru, cu = rows[u_idx][:, None], cols[u_idx][:, None]
        rv, cv = rows[v_idx][None, :], cols[v_idx][None, :]
        col_ok = (cu < cv) if p[others[0]] < p[others[1]] else (cu > cv)
        if ((ru < rv) & col_ok).any():
            return True
    return False


def _fits(rows, cols, r, c, role, other, p) -> np.ndarray:
    """Ones that can take role `other` when the cell (r, c) takes role `role`."""
    row_ok = rows < r if other < role else rows > r
    col_ok = cols < c if p[other] < p[role] else cols > c
    return row_ok & col_ok


class PatternAvoidingPermanent(Problem):
    """Binary n×n matrix whose support avoids `pattern`, with the largest permanent (003 §3.3).

    score = perm(M) when M avoids the pattern, else −(number of occurrences), so every repair
    helps. Local search in the style of the graph problems: delete a one lying in the most
    occurrences until none is left, then add ones in a random order, keeping each that creates
    no occurrence, so the result is maximal. Encoding: the n² entries row by row.
    """

    name = "permanent"

    def __init__(self, n: int, pattern: Sequence[int] | str | int = (3, 1, 2),
                 bits_per_token: int = 4):
        if not isinstance(n, int) or not 1 <= n <= 12:
            raise ValueError(f"n must be an int in 1..12 (pattern counting is cubic), got {n!r}")
        self.n = n
        self.pattern = _check_pattern(pattern)
        self.bits_per_token = bits_per_token
        self._length = packed_length(n * n, bits_per_token)

    @property
    def vocab_size(self) -> int:
        return 1 << self.bits_per_token

    @property
    def max_length(self) -> int:
        return self._length

    def params(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "pattern": "".join(map(str, self.pattern)),
            "bits_per_token": self.bits_per_token,
        }

    def _matrix(self, obj: Any) -> np.ndarray:
        a = np.asarray(obj)
        if a.shape != (self.n, self.n):
            raise ValueError(f"expected a 0/1 matrix of shape ({self.n}, {self.n}), got shape "
                             f"{a.shape}")
        if not np.isin(a, (0, 1)).all():
            raise ValueError(f"expected a 0/1 matrix of shape ({self.n}, {self.n}), got entries "
                             f"{sorted(set(np.unique(a).tolist()) - {0, 1})}")
        return a.astype(np.uint8)

    def empty(self) -> np.ndarray:
        return np.zeros((self.n, self.n), dtype=np.uint8)

    def encode(self, obj: Any) -> list[int]:
        return pack_bits(self._matrix(obj).ravel(), self.bits_per_token)

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        bits = unpack_bits(tokens, self.bits_per_token, self.n * self.n)
        return bits.reshape(self.n, self.n)

    def key(self, obj: Any) -> bytes:
        return np.packbits(self._matrix(obj).ravel()).tobytes()

    def is_valid(self, obj: Any) -> bool:
        return pattern_counts(self._matrix(obj), self.pattern)[0] == 0

    def score(self, obj: Any) -> float:
        a = self._matrix(obj)
        total, _ = pattern_counts(a, self.pattern)
        return float(permanent(a)) if total == 0 else -float(total)

    def local_search(self, obj: Any, rng: np.random.Generator) -> np.ndarray:
        a = self._matrix(obj).copy()
        while True:
            total, per_cell = pattern_counts(a, self.pattern)
            if total == 0:
                break
            rows, cols = np.nonzero(per_cell == per_cell.max())
            k = int(rng.integers(len(rows)))
            a[rows[k], cols[k]] = 0
        for flat in rng.permutation(self.n * self.n):
            r, c = divmod(int(flat), self.n)
            if not a[r, c] and not _creates_pattern(a, r, c, self.pattern):
                a[r, c] = 1
        return a

    def describe(self, obj: Any) -> str:
        a = self._matrix(obj)
        return f"{int(a.sum())} ones, score {self.score(a):g}"

