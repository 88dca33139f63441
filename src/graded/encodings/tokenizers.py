"""Tokenizers T : Σ* -> V* on strings (003 §2.1): character level, stochastic merge, BPE.

All three share one interface: ``encode(text) -> list[int]``, ``decode(ids) -> str`` with
``decode(encode(text)) == text`` for every text over the alphabet, ``vocab_size``, special ids
(``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2 by default, never produced by ``encode``), and
``save(path)`` / ``load(path)`` to and from one JSON file (:func:`load_tokenizer` reads any of
them). ``encode`` raises ``ValueError`` naming a character outside the alphabet; ``decode``
raises :class:`~graded.encodings.base.DecodeError` on an unknown id, ``TypeError`` on an id
that is not an integer (``int(1.5)`` would be ``<bos>``), and skips special ids wherever they
occur (text after an ``<eos>`` is kept: a caller decoding a sample cuts it there first).

- :class:`CharTokenizer`: one token per character (003 Ex. 2.2, first segmentation; makemore's
  tokenizer).
- :class:`StochasticMergeTokenizer`: 003 Remark 2.3. The text is split into characters, then
  scanned left to right: the current piece and the next character are merged with probability
  ``p`` when the merged string is in the vocabulary, otherwise the piece is emitted. The piece
  vocabulary is prefix-closed, so with p = 1 this is greedy longest-match segmentation and with
  p = 0 it is the character tokenizer. The notes give no merge table; :meth:`from_texts` builds
  one from the most frequent substrings. Seeded: ``seed`` fixes the sequence of segmentations.
- :class:`BPETokenizer`: byte-pair encoding trained locally with the Hugging Face ``tokenizers``
  library (the public PatternBoost code uses a 100-token BPE, see notes/seed_003.md §4b), with
  no pre-tokenizer (merges may span the whole string) and a concatenating decoder.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from graded.checks import check_float, check_int
from graded.encodings.base import DEFAULT_SPECIALS, DecodeError, token_ids


class StringTokenizer(ABC):
    """Shared interface of the string tokenizers (see the module docstring)."""

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
        data = {"type": self.kind, **self.to_dict()}
        Path(path).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> StringTokenizer:
        tok = load_tokenizer(path)
        if not isinstance(tok, cls):
            raise ValueError(f"{path} holds a {type(tok).__name__}, not a {cls.__name__}")
        return tok


class _PieceTokenizer(StringTokenizer):
    """A tokenizer whose vocabulary is specials followed by string pieces."""

    def __init__(self, pieces: Sequence[str], specials: Sequence[str]) -> None:
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


class StochasticMergeTokenizer(_PieceTokenizer):
    """The stochastic left-to-right merge tokenizer of 003 Remark 2.3 (module docstring).

    The single-character pieces are the alphabet. Every character of a longer piece must be in
    it, and the pieces must be prefix-closed (each prefix of a piece, of length >= 1, is a
    piece), so every piece can be reached by merges; a piece that cannot is refused.
    ``seed`` is an int >= 0 (``random.Random`` takes ``abs(seed)``: -3 would repeat 3).
    """

    kind = "stochastic_merge"

    def __init__(
        self,
        pieces: Iterable[str],
        p: float = 0.5,
        seed: int = 0,
        specials: Sequence[str] = DEFAULT_SPECIALS,
    ) -> None:
        pieces = list(pieces)
        single = [x for x in pieces if isinstance(x, str) and len(x) == 1]
        multi = [x for x in pieces if not (isinstance(x, str) and len(x) == 1)]
        super().__init__([*single, *multi], specials)
        alphabet = set(single)
        for piece in multi:
            for k in range(1, len(piece)):
                if piece[:k] not in self.stoi:
                    raise ValueError(
                        f"piece {piece!r} needs its prefix {piece[:k]!r} in the "
                        "vocabulary (pieces must be prefix-closed)"
                    )
            missing = next((ch for ch in piece if ch not in alphabet), None)
            if missing is not None:  # encode refuses the character, so no merge reaches it
                raise ValueError(
                    f"piece {piece!r} holds the character {missing!r}, which is not a "
                    "single-character piece: the alphabet is the single-character pieces, "
                    "so no text could be segmented into this piece"
                )
        self.p = _merge_probability(p)
        self.seed = _merge_seed(seed)
        self.rng = random.Random(self.seed)

    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        max_pieces: int = 100,
        max_piece_length: int = 4,
        min_count: int = 2,
        p: float = 0.5,
        seed: int = 0,
        specials: Sequence[str] = DEFAULT_SPECIALS,
    ) -> StochasticMergeTokenizer:
        """Characters of ``texts`` plus up to ``max_pieces`` frequent substrings (prefix-closed).

        Substrings of length 2..``max_piece_length`` seen at least ``min_count`` times are taken
        by decreasing count (ties: shorter, then alphabetical) if their prefix is already taken.
        """
        texts = _texts(texts)
        check_int("max_pieces", max_pieces, minimum=0)
        check_int("max_piece_length", max_piece_length, minimum=1)
        check_int("min_count", min_count, minimum=1)
        counts: Counter[str] = Counter()
        for text in texts:
            for length in range(2, max_piece_length + 1):
                for i in range(len(text) - length + 1):
                    counts[text[i : i + length]] += 1
        chars = sorted({ch for text in texts for ch in text})
        chosen: set[str] = set(chars)
        multi: list[str] = []
        for piece, c in sorted(counts.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0])):
            if len(multi) >= max_pieces or c < min_count:
                break
            if piece[:-1] in chosen and piece not in specials:
                chosen.add(piece)
                multi.append(piece)
        return cls([*chars, *multi], p=p, seed=seed, specials=specials)

    def encode(
        self, text: str, p: float | None = None, rng: random.Random | None = None
    ) -> list[int]:
        """Segment ``text``; ``p`` and ``rng`` override the tokenizer's own for this call."""
        self._check_text(text)
        p = self.p if p is None else _merge_probability(p)
        rng = self.rng if rng is None else rng
        ids: list[int] = []
        current = ""
        n_specials = len(self.specials)
        for pos, ch in enumerate(text):
            self._char_id(ch, pos)
            mergeable = self.stoi.get(current + ch, -1) >= n_specials  # a piece, not "<pad>"
            if current and mergeable and p > 0 and (p >= 1 or rng.random() < p):
                current += ch
                continue
            if current:
                ids.append(self.stoi[current])
            current = ch
        if current:
            ids.append(self.stoi[current])
        return ids

    def reseed(self, seed: int) -> None:
        """Restart the sequence of segmentations from ``seed`` (checked as in the constructor:
        ``int`` took 1.9 for 1 and "3" for 3)."""
        self.seed = _merge_seed(seed)
        self.rng = random.Random(self.seed)

    def to_dict(self) -> dict[str, Any]:
        n = len(self.specials)
        return {
            "specials": list(self.specials),
            "pieces": list(self.itos[n:]),
            "p": self.p,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StochasticMergeTokenizer:
        return cls(data["pieces"], p=data["p"], seed=data["seed"], specials=data["specials"])


class BPETokenizer(StringTokenizer):
    """Byte-pair encoding on characters, trained locally with Hugging Face ``tokenizers``."""

    kind = "bpe"
    UNK = "<unk>"

    def __init__(self, hf_tokenizer: Any, specials: Sequence[str] = DEFAULT_SPECIALS) -> None:
        self.hf = hf_tokenizer
        # The text is data: "<pad>" written in it is five characters, not the padding id (which
        # decode would then drop). Not kept by ``to_str``, so set on every construction.
        self.hf.encode_special_tokens = True
        self.specials = tuple(specials)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (a DataLoader worker, ``copy.deepcopy``) rebuilds the Hugging Face
        tokenizer from its JSON, which drops ``encode_special_tokens``: set it again, or the
        copy would cut "a<pad>b" at "<pad>" and give other ids than the original."""
        self.__dict__.update(state)
        self.hf.encode_special_tokens = True

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int = 100,
        min_frequency: int = 2,
        specials: Sequence[str] = DEFAULT_SPECIALS,
    ) -> BPETokenizer:
        """Learn merges on ``texts`` until ``vocab_size`` tokens (specials and ``<unk>`` count)."""
        from tokenizers import Tokenizer, decoders, models, trainers

        texts = _texts(texts)
        for k, text in enumerate(texts):
            _check_utf8(text, f"texts[{k}]")
        check_int("vocab_size", vocab_size)
        check_int("min_frequency", min_frequency, minimum=0)
        alphabet = sorted({ch for text in texts for ch in text})
        least = len(specials) + 1 + len(alphabet)  # the specials, <unk> and every character
        if int(vocab_size) < least:
            raise ValueError(
                f"vocab_size={vocab_size} cannot hold the {len(specials)} special tokens, "
                f"{cls.UNK} and the {len(alphabet)} characters of the texts: it must be >= {least}"
            )
        hf = Tokenizer(models.BPE(unk_token=cls.UNK))
        hf.decoder = decoders.Fuse()
        trainer = trainers.BpeTrainer(
            vocab_size=int(vocab_size),
            min_frequency=int(min_frequency),
            special_tokens=[*specials, cls.UNK],
            initial_alphabet=alphabet,
            limit_alphabet=len(alphabet) + 1,
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(hf, specials)

    @property
    def vocab_size(self) -> int:
        return int(self.hf.get_vocab_size(with_added_tokens=True))

    def token_id(self, token: str) -> int:
        i = self.hf.token_to_id(token)
        if i is None:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return int(i)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"a tokenizer encodes a str, got {type(text).__name__} {text!r}")
        _check_utf8(text, "the text")
        encoding = self.hf.encode(text, add_special_tokens=False)
        reserved = {self.hf.token_to_id(t) for t in (*self.specials, self.UNK)}
        ids: list[int] = []
        for i, (start, end) in zip(encoding.ids, encoding.offsets):
            if i not in reserved:
                ids.append(i)
                continue
            # ``<unk>`` for a character outside the alphabet, or a learned merge that spells a
            # reserved token (text "<pad>" merged into the padding id, which decode drops):
            # the text is written character by character instead.
            for pos in range(start, end):
                char_id = self.hf.token_to_id(text[pos])
                if char_id is None or char_id in reserved:
                    raise ValueError(
                        f"character {text[pos]!r} at position {pos} is not in the alphabet"
                    )
                ids.append(char_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = token_ids(ids)
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise DecodeError(f"token id {i} is outside 0..{self.vocab_size - 1}")
        return self.hf.decode(ids, skip_special_tokens=True)

    def to_dict(self) -> dict[str, Any]:
        return {"specials": list(self.specials), "hf": json.loads(self.hf.to_str())}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(json.dumps(data["hf"])), data["specials"])


_KINDS: dict[str, type[StringTokenizer]] = {
    "char": CharTokenizer,
    "stochastic_merge": StochasticMergeTokenizer,
    "bpe": BPETokenizer,
}


def _merge_probability(p: Any) -> float:
    """The merge probability ``p`` checked: a finite number in [0, 1], named in the error."""
    return check_float("merge probability p", p, minimum=0.0, maximum=1.0)


def _merge_seed(seed: Any) -> int:
    """The seed of the merge draws checked: an ``int`` >= 0 (``random.Random`` seeds with
    ``abs(seed)``, so -3 would repeat the segmentations of 3)."""
    return check_int("seed", seed, minimum=0)


def _check_utf8(text: str, what: str) -> None:
    """``ValueError`` naming the first lone surrogate of ``text`` (a ``str`` may hold one, but
    it is no Unicode character and has no UTF-8 form): the Hugging Face library works on UTF-8
    and said "TextInputSequence must be str" (a ``TypeError``) for such a text."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{what} has the lone surrogate {text[err.start]!r} at position "
                         f"{err.start}, which is not a Unicode character: BPE works on "
                         "UTF-8 text") from None


def _texts(texts: Any) -> list[str]:
    """The training texts as a list of strings: a single string (whose characters would each be
    taken for a text) or a non-string entry is a ``TypeError`` naming it."""
    if isinstance(texts, str):
        raise TypeError(f"texts must be an iterable of strings, got the string {texts!r}; "
                        "wrap it in a list")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__} {text!r}")
    return texts


def load_tokenizer(path: str | Path) -> StringTokenizer:
    """Read a tokenizer saved by any ``save``; ``ValueError`` on an unknown ``type`` field."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    kind = data.pop("type", None)
    if kind not in _KINDS:
        raise ValueError(
            f"{path}: unknown tokenizer type {kind!r}, expected one of {sorted(_KINDS)}"
        )
    return _KINDS[kind].from_dict(data)
