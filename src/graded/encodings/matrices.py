"""Integer matrices of a fixed shape, row-major.

003 §3.1 treats only subsets, permutations and graphs; matrices are the next object a problem
needs (e.g. the 0/1 matrices of the PatternBoost permanent problem, 003 §3.3). Objects are 2-D
``numpy.ndarray`` of dtype int64 (encoders also accept torch tensors and nested lists).

- ``MatrixCodec(rows, cols)``: 0/1 matrices, one token "0"/"1" per entry;
- ``MatrixCodec(rows, cols, entries=IntegerCodec(base))``: integer entries, each a sign token and
  its digits, so the number of tokens varies but the decoder knows where each entry starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graded.checks import check_int
from graded.encodings.base import Codec, DecodeError, bits_to_tokens, tokens_to_bits
from graded.encodings.integers import IntegerCodec

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class MatrixCodec(Codec[np.ndarray]):
    """Row-major matrices of shape (rows, cols); 0/1 entries unless ``entries`` is given.

    Decoding rejects a wrong number of entries or a bad token (for 0/1 matrices also a wrong
    length); integer entries follow the rules of :class:`IntegerCodec`.
    """

    def __init__(self, rows: int, cols: int, entries: IntegerCodec | None = None) -> None:
        self.rows = check_int("rows", rows, minimum=0)
        self.cols = check_int("cols", cols, minimum=0)
        if entries is not None and not isinstance(entries, IntegerCodec):
            raise TypeError(f"entries must be an IntegerCodec or None, got {entries!r}")
        self.entries = entries

    @property
    def tokens(self) -> tuple[str, ...]:
        return ("0", "1") if self.entries is None else self.entries.tokens

    def _check(self, obj: Any) -> np.ndarray:
        if hasattr(obj, "detach"):
            obj = obj.detach().cpu().numpy()
        arr = np.asarray(obj)
        if arr.shape != (self.rows, self.cols):
            raise ValueError(f"matrix has shape {arr.shape}, expected {(self.rows, self.cols)}")
        if arr.dtype.kind == "O" and arr.size:  # numpy keeps ints beyond int64 as objects
            big = next((x for x in arr.ravel().tolist() if isinstance(x, int)
                        and not isinstance(x, bool) and not _INT64_MIN <= x <= _INT64_MAX), None)
            if big is not None:
                raise ValueError(f"matrix entry {big} is outside the int64 range; expected "
                                 f"integers in {_INT64_MIN}..{_INT64_MAX}")
        if arr.dtype.kind not in "biu" and not (
            arr.dtype.kind == "f" and np.all(arr == np.round(arr))
        ):
            raise TypeError(f"matrix entries must be integers, got dtype {arr.dtype}")
        # the cast below turned inf and 1e20 into -2^63, and uint64 2^64 - 1 into -1, silently
        outside = (~(np.abs(arr) < 2.0**63) if arr.dtype.kind == "f"
                   else arr > _INT64_MAX if arr.dtype.kind == "u" else np.zeros(arr.shape, bool))
        if outside.any():
            bad = arr.ravel()[np.flatnonzero(outside)[0]]
            raise ValueError(f"matrix entry {bad} is outside the int64 range; expected "
                             f"integers in {_INT64_MIN}..{_INT64_MAX}")
        arr = arr.astype(np.int64)
        if self.entries is None and not np.isin(arr, (0, 1)).all():
            bad = sorted(set(np.unique(arr).tolist()) - {0, 1})
            raise ValueError(f"a 0/1 matrix codec got entries {bad}; expected only 0 and 1")
        return arr

    def encode(self, obj: Any) -> list[str]:
        flat = self._check(obj).ravel().tolist()
        if self.entries is None:
            return bits_to_tokens(flat)
        return [t for x in flat for t in self.entries.encode(x)]

    def decode(self, tokens: Sequence[str]) -> np.ndarray:
        size = self.rows * self.cols
        if self.entries is None:
            values = tokens_to_bits(tokens, size, f"a {self.rows}x{self.cols} 0/1 matrix")
        else:
            values, pos = [], 0
            while pos < len(tokens):
                value, pos = self.entries.read(tokens, pos)
                values.append(value)
            if len(values) != size:
                raise DecodeError(
                    f"wrong number of entries {len(values)}: a {self.rows}x"
                    f"{self.cols} matrix has {size}"
                )
            for k, value in enumerate(values):  # the int64 array cannot hold it
                if not _INT64_MIN <= value <= _INT64_MAX:
                    raise DecodeError(f"entry {k + 1} is {value}, outside the int64 range "
                                      f"{_INT64_MIN}..{_INT64_MAX} of the matrix")
        return np.array(values, dtype=np.int64).reshape(self.rows, self.cols)
