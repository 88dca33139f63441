"""The byte-pair encoding tokenizer (see :mod:`graded.encodings.tokenizers` for the interface).

:class:`BPETokenizer` is trained locally with the Hugging Face ``tokenizers`` library (the
public PatternBoost code uses a 100-token BPE, see notes/seed_003.md §4b), with no pre-tokenizer
(merges may span the whole string) and a concatenating decoder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from graded.checks import check_int
from graded.encodings.base import DEFAULT_SPECIALS, DecodeError, token_ids
from graded.encodings.tokenizer_base import StringTokenizer, _specials, _texts


class BPETokenizer(StringTokenizer):
    """Byte-pair encoding on characters, trained locally with Hugging Face ``tokenizers``."""

    kind = "bpe"
    UNK = "<unk>"

    def __init__(self, hf_tokenizer: Any, specials: Sequence[str] = DEFAULT_SPECIALS) -> None:
        self.hf = hf_tokenizer
        # The text is data: "<pad>" written in it is five characters, not the padding id (which
        # decode would then drop). Not kept by ``to_str``, so set on every construction.
        self.hf.encode_special_tokens = True
        self.specials = _specials(specials)

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
        """Learn merges on ``texts`` until ``vocab_size`` tokens (specials and ``<unk>`` count).

        The specials are distinct, other than ``<unk>`` and other than every character of the
        texts: a special "a" took the id of the character "a", so no text holding an "a" could
        be encoded (the text is data, never read as a special token).
        """
        from tokenizers import Tokenizer, decoders, models, trainers

        texts = _texts(texts)
        for k, text in enumerate(texts):
            _check_utf8(text, f"texts[{k}]")
        check_int("vocab_size", vocab_size)
        check_int("min_frequency", min_frequency, minimum=0)
        specials = _specials(specials)
        alphabet = sorted({ch for text in texts for ch in text})
        if cls.UNK in specials:
            raise ValueError(f"specials {specials} hold {cls.UNK!r}, which BPE adds itself for "
                             "the characters outside the alphabet")
        clash = next((token for token in specials if token in alphabet), None)
        if clash is not None:
            raise ValueError(f"special token {clash!r} is a character of the texts: it would "
                             "take that character's id, and no text holding it could be encoded")
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
