"""Tokenizers T : Σ* -> V* on strings (003 §2.1): character level, stochastic merge, BPE.

All three share one interface (:class:`~graded.encodings.tokenizer_base.StringTokenizer`):
``encode(text) -> list[int]``, ``decode(ids) -> str`` with ``decode(encode(text)) == text`` for
every text over the alphabet, ``vocab_size``, special ids (``<pad>`` = 0, ``<bos>`` = 1,
``<eos>`` = 2 by default, never produced by ``encode``), and ``save(path)`` / ``load(path)`` to
and from one JSON file (:func:`load_tokenizer` reads any of them). ``encode`` raises
``ValueError`` naming a character outside the alphabet; ``decode`` raises
:class:`~graded.encodings.base.DecodeError` on an unknown id, ``TypeError`` on an id that is not
an integer (``int(1.5)`` would be ``<bos>``), and skips special ids wherever they occur (text
after an ``<eos>`` is kept: a caller decoding a sample cuts it there first).

- :class:`CharTokenizer` (here): one token per character (003 Ex. 2.2, first segmentation;
  makemore's tokenizer).
- :class:`StochasticMergeTokenizer` (:mod:`graded.encodings.merge_tokenizer`): 003 Remark 2.3,
  pieces merged left to right with probability ``p``; seeded, with copies and DataLoader
  workers drawing independently.
- :class:`BPETokenizer` (:mod:`graded.encodings.bpe`): byte-pair encoding trained locally with
  the Hugging Face ``tokenizers`` library.

Every tokenizer is importable from here, as from :mod:`graded.encodings`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from graded.encodings.base import DEFAULT_SPECIALS
from graded.encodings.bpe import BPETokenizer
from graded.encodings.merge_tokenizer import StochasticMergeTokenizer
from graded.encodings.tokenizer_base import StringTokenizer, _PieceTokenizer, _texts

__all__ = [
    "BPETokenizer",
    "CharTokenizer",
    "StochasticMergeTokenizer",
    "StringTokenizer",
    "load_tokenizer",
]


class CharTokenizer(_PieceTokenizer):
    """One token per character of ``alphabet`` (ids after the specials, in the order given)."""

    kind = "char"

    def __init__(self, alphabet: Iterable[str], specials: Sequence[str] = DEFAULT_SPECIALS):
        chars = list(alphabet)
        for ch in chars:
            if not isinstance(ch, str) or len(ch) != 1:
                raise ValueError(f"alphabet entries must be single characters, got {ch!r}")
        super().__init__(chars, specials)

    @classmethod
    def from_texts(
        cls, texts: Iterable[str], specials: Sequence[str] = DEFAULT_SPECIALS
    ) -> CharTokenizer:
        """Alphabet = the sorted set of characters in ``texts`` (as makemore). A single string
        or a non-string entry is a ``TypeError`` naming it (as for the other tokenizers)."""
        texts = _texts(texts)
        return cls(sorted({ch for text in texts for ch in text}), specials)

    def encode(self, text: str) -> list[int]:
        self._check_text(text)
        return [self._char_id(ch, pos) for pos, ch in enumerate(text)]

    def to_dict(self) -> dict[str, Any]:
        n = len(self.specials)
        return {"specials": list(self.specials), "alphabet": list(self.itos[n:])}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CharTokenizer:
        return cls(data["alphabet"], data["specials"])


_KINDS: dict[str, type[StringTokenizer]] = {
    "char": CharTokenizer,
    "stochastic_merge": StochasticMergeTokenizer,
    "bpe": BPETokenizer,
}


def load_tokenizer(path: str | Path) -> StringTokenizer:
    """Read a tokenizer saved by any ``save``. ``ValueError`` naming the file for a file that
    holds no JSON object, an unknown ``type`` field, or a missing field of that type (a
    ``KeyError`` naming the field alone, or for a JSON list "pop expected at most 1
    argument", said neither which file nor what it lacked)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a saved tokenizer is a JSON object, got a JSON "
                         f"{type(data).__name__}")
    kind = data.pop("type", None)
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ValueError(
            f"{path}: unknown tokenizer type {kind!r}, expected one of {sorted(_KINDS)}"
        )
    try:
        return _KINDS[kind].from_dict(data)
    except KeyError as err:
        raise ValueError(f"{path}: a saved {kind!r} tokenizer needs the field "
                         f"{err.args[0]!r}; the file has {sorted(data)}") from None
