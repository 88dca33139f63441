"""The PatternBoost problem interface (003 §3.3) and the bit-string token code its problems share.

A problem is what a mathematician writes to point PatternBoost at a new question: an empty
object, an encoding to tokens and its checked inverse, a score to maximise and a local search
that never lowers the score of a valid object. The engine only ever sees tokens, scores and
keys, so a problem's objects can be any Python value.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from graded.encodings.base import DecodeError, token_ids

__all__ = ["DecodeError", "Problem", "pack_bits", "unpack_bits"]


class Problem(ABC):
    """A PatternBoost problem (003 §3.3): "we need two functions: a score and local search".

    Subclasses set `name` (and `size_argument` where their size is not the argument `n`),
    implement the abstract methods and describe their arguments in `params()` so that the
    engine can rebuild the problem in worker processes and in a resumed run. Tokens are
    integers in `range(vocab_size)`; sequences are at most `max_length` long.
    """

    name: str = ""
    #: The constructor argument that the size (`PatternBoostConfig.n`, --n) sets.
    size_argument: str = "n"

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of distinct tokens `encode` may emit."""

    @property
    @abstractmethod
    def max_length(self) -> int:
        """Longest token sequence `encode` may emit."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Constructor arguments (JSON values) that rebuild this problem."""

    @abstractmethod
    def empty(self) -> Any:
        """The starting object of a search from scratch (003 §3.3: "the empty graph")."""

    @abstractmethod
    def encode(self, obj: Any) -> list[int]:
        """Token sequence of `obj`."""

    @abstractmethod
    def decode(self, tokens: Sequence[int]) -> Any:
        """Object of `tokens`; raises `DecodeError` naming the reason when there is none."""

    @abstractmethod
    def score(self, obj: Any) -> float:
        """Value to maximise; defined for every decodable object, valid or not."""

    @abstractmethod
    def local_search(self, obj: Any, rng: np.random.Generator) -> Any:
        """A valid object at least as good as `obj` (003 §3.3: score(G) ≤ score(local(G)))."""

    @abstractmethod
    def is_valid(self, obj: Any) -> bool:
        """Whether `obj` satisfies the problem's constraint."""

    def key(self, obj: Any) -> Hashable:
        """Key under which two objects count as the same in the database (default: tokens)."""
        return tuple(self.encode(obj))

    def optimum(self) -> float | None:
        """Known best score, when the literature gives one (used for reporting only)."""
        return None

    def describe(self, obj: Any) -> str:
        """Short human-readable summary of `obj` for logs."""
        return f"score {self.score(obj):g}"


def _check_bits_per_token(bits_per_token: int) -> None:
    if (not isinstance(bits_per_token, int) or isinstance(bits_per_token, bool)
            or not 1 <= bits_per_token <= 16):
        raise ValueError(f"bits_per_token must be an int in 1..16, got {bits_per_token!r}")


def packed_length(n_bits: int, bits_per_token: int) -> int:
    """Number of tokens `pack_bits` makes from `n_bits` bits."""
    _check_bits_per_token(bits_per_token)
    return math.ceil(n_bits / bits_per_token)


def pack_bits(bits: Sequence[int] | np.ndarray, bits_per_token: int) -> list[int]:
    """Tokens of a 0/1 string read `bits_per_token` bits at a time, most significant first.

    The last token is padded with zero bits. With one bit per token this is the raw string the
    public PatternBoost code writes; larger chunks are a fixed-length stand-in for its BPE
    tokenizer, shortening sequences (and so training and sampling time) by the chunk factor.
    """
    _check_bits_per_token(bits_per_token)
    given = np.asarray(bits).ravel()
    # checked before the cast to int64, which would turn 0.5 into 0 without a word
    if ((given != 0) & (given != 1)).any():
        raise ValueError(f"bits must be 0 or 1, got values {sorted(set(given.tolist()))}")
    arr = given.astype(np.int64)
    pad = (-arr.size) % bits_per_token
    arr = np.concatenate([arr, np.zeros(pad, dtype=np.int64)]).reshape(-1, bits_per_token)
    weights = 1 << np.arange(bits_per_token - 1, -1, -1, dtype=np.int64)
    return (arr @ weights).tolist()


def unpack_bits(tokens: Sequence[int], bits_per_token: int, n_bits: int) -> np.ndarray:
    """Inverse of `pack_bits`; raises `DecodeError` on a wrong length, token or padding bit,
    and `TypeError` naming a token that is not an integer (a float such as 1.5 was truncated
    to a token, a string such as "3" converted, a bool taken for 0 or 1)."""
    _check_bits_per_token(bits_per_token)
    expected = packed_length(n_bits, bits_per_token)
    ids = token_ids(tokens)
    if len(ids) != expected:
        raise DecodeError(f"wrong length: expected {expected} tokens, got {len(ids)}")
    for pos, t in enumerate(ids):  # before the cast to int64, which a huge int overflows
        if not 0 <= t < 1 << bits_per_token:
            raise DecodeError(f"token {t} at position {pos} is out of range "
                              f"0..{(1 << bits_per_token) - 1}")
    arr = np.asarray(ids, dtype=np.int64)
    shifts = np.arange(bits_per_token - 1, -1, -1, dtype=np.int64)
    bits = ((arr[:, None] >> shifts) & 1).ravel()
    if bits[n_bits:].any():
        raise DecodeError("non-zero padding bits after the last bit")
    return bits[:n_bits].astype(np.uint8)
