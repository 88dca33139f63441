"""Finite subsets of {start, ..., start + n - 1} (003 Example 3.1).

Objects are ``frozenset[int]`` (the encoders accept any iterable of distinct ints: a repeated
element, which no subset has, is a ``ValueError``).

- :class:`SubsetIndicatorCodec`: the indicator vector, n tokens "0"/"1";
  {3, 5, 8} with n = 8 -> 0 0 1 0 1 0 0 1 (003 Ex. 3.1).
- :class:`SubsetListCodec`: the elements in increasing order; {3, 5, 8} -> 3 5 8.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from graded.checks import check_int
from graded.encodings.base import (
    Codec,
    DecodeError,
    bits_to_tokens,
    parse_token_int,
    tokens_to_bits,
)


class _SubsetCodec(Codec[frozenset[int]]):
    def __init__(self, n: int, start: int = 1) -> None:
        self.n = check_int("n", n, minimum=0)
        self.start = check_int("start", start, minimum=0)

    def _check(self, obj: Iterable[int]) -> list[int]:
        if isinstance(obj, (str, bytes)) or not isinstance(obj, Iterable):
            raise TypeError(f"a subset must be a set of integers, got {obj!r}")
        values = [check_int("subset element", x) for x in obj]
        elements = sorted(set(values))
        if len(elements) != len(values):  # a sequence with a repeat is a multiset
            repeated = next(x for x in elements if values.count(x) > 1)
            raise ValueError(f"a subset holds each element once, got {repeated} "
                             f"{values.count(repeated)} times in {obj!r}")
        for x in elements:
            if not self.start <= x < self.start + self.n:
                raise ValueError(
                    f"element {x} is outside the universe {self.start}..{self.start + self.n - 1}"
                )
        return elements


class SubsetIndicatorCodec(_SubsetCodec):
    """Indicator vector of length ``n``; decoding rejects a wrong length or a token not 0/1."""

    @property
    def tokens(self) -> tuple[str, ...]:
        return ("0", "1")

    def encode(self, obj: Iterable[int]) -> list[str]:
        members = set(self._check(obj))
        return bits_to_tokens(self.start + i in members for i in range(self.n))

    def decode(self, tokens: Sequence[str]) -> frozenset[int]:
        bits = tokens_to_bits(tokens, self.n, f"a subset of a {self.n}-element universe")
        return frozenset(self.start + i for i, b in enumerate(bits) if b)


class SubsetListCodec(_SubsetCodec):
    """Sorted element list; decoding rejects a bad token, a repeat or a decreasing pair."""

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(str(self.start + i) for i in range(self.n))

    def encode(self, obj: Iterable[int]) -> list[str]:
        return [str(x) for x in self._check(obj)]

    def decode(self, tokens: Sequence[str]) -> frozenset[int]:
        hi = self.start + self.n - 1
        values = [parse_token_int(t, self.start, hi, "an element") for t in tokens]
        for pos in range(1, len(values)):
            if values[pos] == values[pos - 1]:
                raise DecodeError(f"repeated element {values[pos]} at position {pos}")
            if values[pos] < values[pos - 1]:
                raise DecodeError(
                    f"elements out of order at position {pos}: {values[pos - 1]} > {values[pos]}"
                )
        return frozenset(values)
