"""Permutations of {1, ..., n} (003 Example 3.2).

A permutation is a ``tuple[int, ...]`` in one-line notation (π(1), ..., π(n)), 1-indexed as in
the notes. For π = 45231:

- :class:`PermutationOneLineCodec`: ``4 5 2 3 1``;
- :class:`PermutationMatrixCodec`: the flattened n×n matrix with a 1 in row i, column π(i);
- :class:`PermutationCycleCodec`: ``( 1 4 3 2 5 )``, the notes' "(1, 4, 3, 2, 5)".

Cycle notation (canonical form): disjoint cycles, each written from its smallest element,
cycles ordered by that element, fixed points omitted unless ``include_fixed_points``. With
``strict=False`` the decoder also accepts any product of cycles (003 §3.1: in cycle notation
"duplicates are allowed in different cycles"), composed right to left like functions:
``(1 2)(2 3)`` maps 3 -> 2 -> 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from graded.checks import check_bool, check_int
from graded.encodings.base import (
    Codec,
    DecodeError,
    bits_to_tokens,
    parse_token_int,
    tokens_to_bits,
)

Permutation = tuple[int, ...]


def check_permutation(obj: Sequence[int] | np.ndarray | Tensor, n: int) -> Permutation:
    """``obj`` as a tuple if it is a permutation of 1..n; ``ValueError``/``TypeError`` otherwise.

    ``obj`` is a sequence of ints, or a one-dimensional NumPy array or tensor of an integer
    dtype (as the graph, matrix and subset codecs take arrays); a float or bool array is
    refused by its dtype rather than truncated or read as 0/1."""
    if isinstance(obj, (np.ndarray, Tensor)):
        obj = _array_entries(obj)
    if isinstance(obj, (str, bytes)) or not isinstance(obj, Sequence):
        raise TypeError(f"a permutation must be a sequence of integers, got {obj!r}")
    perm = tuple(check_int("permutation entry", x) for x in obj)
    if len(perm) != n:
        raise ValueError(f"permutation {perm} has length {len(perm)}, expected {n}")
    if sorted(perm) != list(range(1, n + 1)):
        raise ValueError(f"{perm} is not a permutation of 1..{n}")
    return perm


def _array_entries(arr: np.ndarray | Tensor) -> list[int]:
    """The entries of a one-dimensional integer array or tensor as Python ints."""
    if isinstance(arr, Tensor):
        integer = not (arr.is_floating_point() or arr.is_complex() or arr.dtype == torch.bool)
    else:
        integer = arr.dtype.kind in "iu"
    if not integer:
        raise TypeError(f"a permutation must hold integers, got an array of dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"a permutation must be one-dimensional, got an array of shape "
                         f"{tuple(arr.shape)}")
    return (arr.detach().cpu() if isinstance(arr, Tensor) else arr).tolist()


def _check_no_repeats(values: Sequence[int], what: str) -> None:
    seen: set[int] = set()
    for pos, v in enumerate(values):
        if v in seen:
            raise DecodeError(f"repeated {what} {v} at position {pos}")
        seen.add(v)


class _PermutationCodec(Codec[Permutation]):
    def __init__(self, n: int) -> None:
        self.n = check_int("n", n, minimum=0)


class PermutationOneLineCodec(_PermutationCodec):
    """(π(1), ..., π(n)); decoding rejects a wrong length, a bad token or a repeated entry."""

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(str(i) for i in range(1, self.n + 1))

    def encode(self, obj: Sequence[int]) -> list[str]:
        return [str(x) for x in check_permutation(obj, self.n)]

    def decode(self, tokens: Sequence[str]) -> Permutation:
        if len(tokens) != self.n:
            raise DecodeError(
                f"wrong length {len(tokens)}: a permutation of 1..{self.n} needs {self.n} tokens"
            )
        values = [parse_token_int(t, 1, self.n, "an entry") for t in tokens]
        _check_no_repeats(values, "entry")
        return tuple(values)


class PermutationMatrixCodec(_PermutationCodec):
    """Row-major n×n 0/1 matrix with P[i, π(i)] = 1; rejects rows or columns not summing to 1."""

    @property
    def tokens(self) -> tuple[str, ...]:
        return ("0", "1")

    def encode(self, obj: Sequence[int]) -> list[str]:
        perm = check_permutation(obj, self.n)
        return bits_to_tokens(perm[i] == j + 1 for i in range(self.n) for j in range(self.n))

    def decode(self, tokens: Sequence[str]) -> Permutation:
        n = self.n
        bits = tokens_to_bits(tokens, n * n, f"a {n}x{n} permutation matrix")
        perm = []
        for i in range(n):
            row = bits[i * n : (i + 1) * n]
            if sum(row) != 1:
                raise DecodeError(f"row {i + 1} has {sum(row)} ones, a permutation matrix has 1")
            perm.append(row.index(1) + 1)
        for j in range(n):
            col = sum(bits[i * n + j] for i in range(n))
            if col != 1:
                raise DecodeError(f"column {j + 1} has {col} ones, a permutation matrix has 1")
        return tuple(perm)


def cycles_of(perm: Sequence[int]) -> list[list[int]]:
    """Disjoint cycles of a 1-indexed permutation, each from its smallest element, in order."""
    seen: set[int] = set()
    out = []
    for start in range(1, len(perm) + 1):
        if start in seen:
            continue
        cycle = [start]
        seen.add(start)
        x = perm[start - 1]
        while x != start:
            cycle.append(x)
            seen.add(x)
            x = perm[x - 1]
        out.append(cycle)
    return out


class PermutationCycleCodec(_PermutationCodec):
    """Cycle notation with tokens "(", ")" and the elements (see the module docstring)."""

    def __init__(self, n: int, include_fixed_points: bool = False, strict: bool = True) -> None:
        super().__init__(n)
        self.include_fixed_points = check_bool("include_fixed_points", include_fixed_points)
        self.strict = check_bool("strict", strict)

    @property
    def tokens(self) -> tuple[str, ...]:
        return ("(", ")", *(str(i) for i in range(1, self.n + 1)))

    def encode(self, obj: Sequence[int]) -> list[str]:
        out: list[str] = []
        for cycle in cycles_of(check_permutation(obj, self.n)):
            if len(cycle) > 1 or self.include_fixed_points:
                out += ["(", *(str(x) for x in cycle), ")"]
        return out

    def _parse(self, tokens: Sequence[str]) -> list[list[int]]:
        cycles: list[list[int]] = []
        current: list[int] | None = None
        members: set[int] = set()  # of the open cycle, so a long cycle is read in linear time
        for pos, t in enumerate(tokens):
            if t == "(":
                if current is not None:
                    raise DecodeError(f"'(' at position {pos} inside an open cycle")
                current, members = [], set()
            elif t == ")":
                if current is None:
                    raise DecodeError(f"')' at position {pos} closes no cycle")
                if not current:
                    raise DecodeError(f"empty cycle ending at position {pos}")
                cycles.append(current)
                current = None
            else:
                if current is None:
                    raise DecodeError(f"element token {t!r} at position {pos} outside a cycle")
                x = parse_token_int(t, 1, self.n, "an element")
                if x in members:
                    raise DecodeError(f"element {x} repeated inside one cycle at position {pos}")
                current.append(x)
                members.add(x)
        if current is not None:
            raise DecodeError("the last cycle is not closed by ')'")
        return cycles

    def _check_canonical(self, cycles: list[list[int]]) -> None:
        _check_no_repeats([x for c in cycles for x in c], "element")
        for k, cycle in enumerate(cycles):
            if cycle[0] != min(cycle):
                raise DecodeError(
                    f"cycle {k + 1} {tuple(cycle)} does not start at its smallest element"
                )
            if k and cycle[0] < cycles[k - 1][0]:
                raise DecodeError(
                    f"cycle {k + 1} is out of order (cycles are sorted by their first element)"
                )
            if len(cycle) == 1 and not self.include_fixed_points:
                raise DecodeError(
                    f"fixed point ({cycle[0]}) is written but fixed points are omitted"
                )
        if self.include_fixed_points and sum(map(len, cycles)) != self.n:
            missing = sorted(set(range(1, self.n + 1)) - {x for c in cycles for x in c})
            raise DecodeError(f"elements {missing} appear in no cycle")

    def decode(self, tokens: Sequence[str]) -> Permutation:
        cycles = self._parse(tokens)
        if self.strict:
            self._check_canonical(cycles)
        perm = list(range(1, self.n + 1))
        for cycle in cycles:  # perm <- perm ∘ cycle, so the rightmost cycle acts first
            # only the entries at the cycle's elements change: perm(a) <- perm(cycle(a)), so the
            # cost is the length of the cycle, not n (n fixed points were n^2 steps)
            images = [perm[b - 1] for b in (*cycle[1:], cycle[0])]
            for a, image in zip(cycle, images):
                perm[a - 1] = image
        return tuple(perm)
