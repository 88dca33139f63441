"""Common pieces of every encoding: the decode error, the vocabulary and the codec base class.

An *encoding* E : X -> V* (003 §3.1) maps a mathematical object to a finite sequence of token
types. Here a token type is a short string (``"1"``, ``"+"``, ``"("``); a :class:`Vocabulary`
turns token strings into integer ids for a model (003 §2.1: "V is identified with a finite set
of indices {0, ..., N - 1}").

Design of decoding (one rule for every codec): ``decode`` returns the object, or raises
:class:`DecodeError` whose ``reason`` says why the sequence is not the encoding of any object.
A decoder never returns a wrong object. It accepts only the *canonical* sequence of each object
(the one ``encode`` produces), so ``encode(decode(tokens)) == tokens`` whenever decoding succeeds;
this is the validity criterion of 003 §3.1 made strict.
"""

from __future__ import annotations

import functools
import json
import operator
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

DEFAULT_SPECIALS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>")


class DecodeError(ValueError):
    """A token sequence that encodes no object; ``reason`` says why (e.g. "repeated entry 3")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def token_ids(ids: Iterable[Any]) -> list[int]:
    """``ids`` as a list of ``int``; ``TypeError`` naming the first entry that is not an integer
    (a float such as 1.5, which ``int`` would truncate to another token, a ``bool``, a string:
    which the position says). Integer tensors and NumPy integers are accepted."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"token ids must be a sequence of ints, got the string {ids!r}")
    if not isinstance(ids, Iterable) or getattr(ids, "ndim", 1) == 0:
        raise TypeError(f"token ids must be a sequence of ints, got the single value {ids!r} "
                        f"({type(ids).__name__}): wrap one id in a list, [id]")
    out = []
    for pos, i in enumerate(ids):
        try:
            if isinstance(i, bool):
                raise TypeError
            out.append(operator.index(i))
        except TypeError:
            raise TypeError(f"token id {i!r} at position {pos} is not an int "
                            f"({type(i).__name__})") from None
    return out


class Vocabulary:
    """A bijection between token strings and integer ids 0..N-1 (003 §2.1).

    Special tokens come first (by default ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2), then the
    ordinary tokens in the order given. ``encode`` raises ``ValueError`` on an unknown token;
    ``decode`` raises :class:`DecodeError` on an id outside 0..N-1 or on a special token.
    """

    def __init__(self, tokens: Iterable[str], specials: Sequence[str] = DEFAULT_SPECIALS) -> None:
        items = [*specials, *tokens]
        for t in items:
            if not isinstance(t, str) or not t:
                raise TypeError(f"tokens must be non-empty strings, got {t!r}")
        if len(set(items)) != len(items):
            seen: set[str] = set()
            dup = next(t for t in items if t in seen or seen.add(t))
            raise ValueError(f"token {dup!r} appears twice in the vocabulary")
        self.specials: tuple[str, ...] = tuple(specials)
        self.itos: tuple[str, ...] = tuple(items)
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(items)}

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and (self.itos, self.specials) == (
            other.itos,
            other.specials,
        )

    def __hash__(self) -> int:
        return hash((self.itos, self.specials))

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)}, specials={self.specials})"

    def id(self, token: str) -> int:
        """The id of ``token``; ``ValueError`` naming it if it is not in the vocabulary."""
        try:
            return self.stoi[token]
        except KeyError:
            raise ValueError(f"token {token!r} is not in the vocabulary") from None

    @property
    def pad_id(self) -> int:
        return self.id("<pad>")

    @property
    def bos_id(self) -> int:
        return self.id("<bos>")

    @property
    def eos_id(self) -> int:
        return self.id("<eos>")

    def encode(self, tokens: Sequence[str]) -> list[int]:
        return [self.id(t) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Token strings of ``ids``; :class:`DecodeError` on an unknown id or a special token."""
        out = []
        for i in token_ids(ids):
            if not 0 <= i < len(self.itos):
                raise DecodeError(f"token id {i} is outside 0..{len(self.itos) - 1}")
            if i < len(self.specials):
                raise DecodeError(f"special token {self.itos[i]!r} inside the sequence")
            out.append(self.itos[i])
        return out

    def to_dict(self) -> dict[str, Any]:
        n = len(self.specials)
        return {"specials": list(self.specials), "tokens": list(self.itos[n:])}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Vocabulary:
        return cls(data["tokens"], specials=data["specials"])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def check_tokens(tokens: Any) -> Any:
    """``tokens`` unchanged unless it is a bare ``str`` (or ``bytes``): ``TypeError``. A string
    is a sequence of characters, so ``decode("12")`` would read the tokens "1" and "2"; a
    multi-character token such as "12" or "e2" must come inside a list, as ``encode`` gives it."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError(f"decode expects a sequence of tokens (a list of strings, as encode "
                        f"returns), got the {type(tokens).__name__} {tokens!r}, which would be "
                        f"read one character per token; split a space-separated string with "
                        f".split()")
    return tokens


class Codec(ABC, Generic[T]):
    """An encoding E : X -> V* with its partial inverse (003 §3.1).

    Subclasses implement :meth:`encode`, :meth:`decode` and :attr:`tokens` (every token the codec
    can emit, in a fixed order). The helpers give integer ids through :meth:`vocabulary`.
    Every subclass's ``decode`` first passes its argument through :func:`check_tokens` (the
    wrapping is done once, when the subclass is defined), so no codec reads a bare string one
    character per token.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        decode = cls.__dict__.get("decode")
        if decode is not None and not getattr(decode, "_checks_tokens", False):

            @functools.wraps(decode)
            def checked_decode(self: Codec[T], tokens: Sequence[str], *args: Any,
                               **kw: Any) -> T:
                return decode(self, check_tokens(tokens), *args, **kw)

            checked_decode._checks_tokens = True  # type: ignore[attr-defined]
            cls.decode = checked_decode  # type: ignore[method-assign]

    @property
    @abstractmethod
    def tokens(self) -> tuple[str, ...]:
        """Every token type this codec can produce, in a fixed order."""

    @abstractmethod
    def encode(self, obj: T) -> list[str]:
        """The canonical token sequence of ``obj``; ``ValueError``/``TypeError`` on bad input."""

    @abstractmethod
    def decode(self, tokens: Sequence[str]) -> T:
        """The object encoded by ``tokens``, or :class:`DecodeError` with the reason."""

    def vocabulary(self, specials: Sequence[str] = DEFAULT_SPECIALS) -> Vocabulary:
        return Vocabulary(self.tokens, specials=specials)

    def _default_vocabulary(self) -> Vocabulary:
        cached = self.__dict__.get("_vocabulary")
        if cached is None:
            cached = self.__dict__["_vocabulary"] = self.vocabulary()
        return cached

    def encode_ids(self, obj: T, vocab: Vocabulary | None = None) -> list[int]:
        """Ids of ``encode(obj)`` in ``vocab`` (default: ``self.vocabulary()``), no specials."""
        return (vocab or self._default_vocabulary()).encode(self.encode(obj))

    def decode_ids(self, ids: Iterable[int], vocab: Vocabulary | None = None) -> T:
        """Decode generated ids: a leading ``<bos>`` is dropped, the sequence ends at the first
        ``<eos>`` (or the end), trailing ``<pad>`` ids are dropped; any other special id is a
        :class:`DecodeError`."""
        vocab = vocab or self._default_vocabulary()
        ids = token_ids(ids)
        specials = set(vocab.specials)
        if "<bos>" in specials and ids and ids[0] == vocab.bos_id:
            ids = ids[1:]
        if "<eos>" in specials and vocab.eos_id in ids:
            ids = ids[: ids.index(vocab.eos_id)]
        if "<pad>" in specials:
            while ids and ids[-1] == vocab.pad_id:
                ids.pop()
        return self.decode(vocab.decode(ids))

    def is_valid(self, tokens: Sequence[str]) -> bool:
        try:
            self.decode(tokens)
        except DecodeError:
            return False
        return True


def short_repr(token: str) -> str:
    """``repr(token)``, cut to its first 12 characters and its length for a long one (a token of
    thousands of digits should not fill the error message)."""
    return repr(token) if len(token) <= 20 else f"{token[:12]!r}... ({len(token)} characters)"


def parse_token_int(token: str, lo: int, hi: int, what: str) -> int:
    """The value of ``token`` if it is a canonical decimal in [lo, hi], else DecodeError.

    A token with more digits than ``hi`` is refused before ``int`` reads it: it is above
    ``hi`` anyway, and ``int`` raises a plain ``ValueError`` past 4300 digits."""
    if (
        not isinstance(token, str)
        or not (token.isascii() and token.isdigit())
        or (len(token) > 1 and token[0] == "0")
    ):
        raise DecodeError(f"bad token {token!r}: expected {what} in {lo}..{hi}")
    if len(token) > len(str(hi)):
        shown = token if len(token) <= 20 else short_repr(token)
        raise DecodeError(f"{what} {shown} is outside {lo}..{hi}")
    value = int(token)
    if not lo <= value <= hi:
        raise DecodeError(f"{what} {value} is outside {lo}..{hi}")
    return value


def bits_to_tokens(bits: Iterable[int]) -> list[str]:
    return ["1" if b else "0" for b in bits]


def tokens_to_bits(tokens: Sequence[str], length: int, what: str) -> list[int]:
    """0/1 values of ``tokens``; DecodeError on a wrong length or a token other than "0"/"1"."""
    if len(tokens) != length:
        raise DecodeError(f"wrong length {len(tokens)}: {what} needs {length} tokens")
    out = []
    for pos, t in enumerate(tokens):
        if t == "0":
            out.append(0)
        elif t == "1":
            out.append(1)
        else:
            raise DecodeError(f"bad token {t!r} at position {pos}: expected '0' or '1'")
    return out
