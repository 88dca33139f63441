"""The interface every string tokenizer shares, and the vocabulary of string pieces.

:class:`StringTokenizer` is the interface described in :mod:`graded.encodings.tokenizers`
(``encode``, ``decode``, ``vocab_size``, special ids, ``save`` / ``load``); the piece-based
tokenizers (character, stochastic merge) build on :class:`_PieceTokenizer`, whose vocabulary is
the specials followed by non-empty strings.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from graded.encodings.base import DecodeError, token_ids


class StringTokenizer(ABC):
    """Shared interface of the string tokenizers (see :mod:`graded.encodings.tokenizers`)."""

    kind: str = ""
    specials: tuple[str, ...]

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str: ...

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    @abstractmethod
    def from_dict(cls, data: dict[str, Any]) -> StringTokenizer: ...

    def token_id(self, token: str) -> int:
        raise NotImplementedError

    @property
    def pad_id(self) -> int:
        return self.token_id("<pad>")

    @property
    def bos_id(self) -> int:
        return self.token_id("<bos>")

    @property
    def eos_id(self) -> int:
        return self.token_id("<eos>")

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as one JSON object. Non-ASCII characters are written as they
        are, unless the vocabulary holds a lone surrogate (a ``str`` may, UTF-8 may not: the
        file could not be written): then every such character is written as a \\u escape,
        which reads back the same."""
        data = {"type": self.kind, **self.to_dict()}
        text = json.dumps(data, ensure_ascii=False)
        try:
            encoded = text.encode("utf-8")
        except UnicodeEncodeError:
            encoded = json.dumps(data).encode("ascii")
        Path(path).write_bytes(encoded)

    @classmethod
    def load(cls, path: str | Path) -> StringTokenizer:
        # the module that knows every kind imports this one, so it is imported when called
        from graded.encodings.tokenizers import load_tokenizer

        tok = load_tokenizer(path)
        if not isinstance(tok, cls):
            raise ValueError(f"{path} holds a {type(tok).__name__}, not a {cls.__name__}")
        return tok


class _PieceTokenizer(StringTokenizer):
    """A tokenizer whose vocabulary is specials followed by string pieces."""

    def __init__(self, pieces: Sequence[str], specials: Sequence[str]) -> None:
        specials = _specials(specials)
        items = [*specials, *pieces]
        if len(set(items)) != len(items):
            dup = next(t for t, c in Counter(items).items() if c > 1)
            raise ValueError(f"token {dup!r} appears twice in the vocabulary")
        for piece in pieces:
            if not isinstance(piece, str) or not piece:
                raise ValueError(f"pieces must be non-empty strings, got {piece!r}")
        self.specials = tuple(specials)
        self.itos = tuple(items)
        self.stoi = {t: i for i, t in enumerate(items)}

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def token_id(self, token: str) -> int:
        if token not in self.stoi:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return self.stoi[token]

    def _check_text(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"a tokenizer encodes a str, got {type(text).__name__} {text!r}")

    def _char_id(self, ch: str, pos: int) -> int:
        i = self.stoi.get(ch)
        if i is None or i < len(self.specials):
            raise ValueError(f"character {ch!r} at position {pos} is not in the alphabet")
        return i

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in token_ids(ids):
            if not 0 <= i < len(self.itos):
                raise DecodeError(f"token id {i} is outside 0..{len(self.itos) - 1}")
            if i >= len(self.specials):
                out.append(self.itos[i])
        return "".join(out)


def _strings(values: Any, what: str, container: str) -> list[str]:
    """``values`` as a list of strings: a single string (whose characters would each be taken
    for an entry) or a non-string entry is a ``TypeError`` naming it."""
    if isinstance(values, str):
        raise TypeError(f"{what} must be an iterable of strings, got the string {values!r}; "
                        f"wrap it in a {container}")
    try:
        values = list(values)
    except TypeError:
        raise TypeError(f"{what} must be an iterable of strings, got "
                        f"{type(values).__name__} {values!r}") from None
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise TypeError(f"{what}[{i}] must be a str, got {type(value).__name__} {value!r}")
    return values


def _specials(specials: Any) -> tuple[str, ...]:
    """The special tokens checked: distinct non-empty strings, given as an iterable (a single
    string such as "<pad>" would be five special tokens, one per character)."""
    specials = tuple(_strings(specials, "specials", "tuple"))
    for i, token in enumerate(specials):
        if not token:
            raise ValueError(f"specials[{i}] is the empty string: a special token needs a name")
        if token in specials[:i]:
            raise ValueError(f"special token {token!r} appears twice in specials {specials}")
    return specials


def _texts(texts: Any) -> list[str]:
    """The training texts as a list of strings (see :func:`_strings`)."""
    return _strings(texts, "texts", "list")
