"""The stochastic left-to-right merge tokenizer of 003 Remark 2.3 (interface: see
:mod:`graded.encodings.tokenizers`).

The text is split into characters, then scanned left to right: the current piece and the next
character are merged with probability ``p`` when the merged string is in the vocabulary,
otherwise the piece is emitted. The piece vocabulary is prefix-closed, so with p = 1 this is
greedy longest-match segmentation and with p = 0 it is the character tokenizer. The notes give
no merge table; :meth:`StochasticMergeTokenizer.from_texts` builds one from the most frequent
substrings.

The draws come from the tokenizer's own ``random.Random``, seeded by ``seed``. A copy
(``copy.copy``, ``copy.deepcopy``, pickling) gets its own generator in the state of the
original at the time of copying: the two then make the same draws, each without advancing the
other's. In a ``torch.utils.data.DataLoader`` worker such a copy would repeat the draws of every
other worker, so there the generator restarts from ``seed`` and the seed torch gave the worker
(``get_worker_info().seed``, drawn from the loader's ``generator`` or the global torch seed): the
workers differ, and a run seeded with ``torch.manual_seed`` repeats, as for the ``random``
module that torch seeds in each worker. :meth:`~StochasticMergeTokenizer.reseed` called in the
worker (a ``worker_init_fn``) chooses its draws instead. Other process pools
(``multiprocessing.Pool``, ``concurrent.futures.ProcessPoolExecutor``) give their workers no
seed to mix in: there copies draw alike, as the ``random`` module's own generator does in them,
and :meth:`~StochasticMergeTokenizer.reseed` in the pool's ``initializer`` (with, say, the
worker's rank) sets each worker's draws. ``save`` keeps the seed, not the state: a loaded
tokenizer starts again from the seed.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from torch.utils.data import get_worker_info

from graded.checks import check_float, check_int
from graded.encodings.base import DEFAULT_SPECIALS
from graded.encodings.tokenizer_base import _PieceTokenizer, _specials, _texts


class StochasticMergeTokenizer(_PieceTokenizer):
    """The stochastic left-to-right merge tokenizer of 003 Remark 2.3 (module docstring).

    The single-character pieces are the alphabet. Every character of a longer piece must be in
    it, and the pieces must be prefix-closed (each prefix of a piece, of length >= 1, is a
    piece), so every piece can be reached by merges; a piece that cannot is refused.
    ``seed`` is an int >= 0 (``random.Random`` takes ``abs(seed)``: -3 would repeat 3). Copies
    and DataLoader workers draw as the module docstring says.
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
        self.reseed(seed)

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
        specials = _specials(specials)  # before it is searched for pieces
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
        rng = self._generator() if rng is None else rng
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
        ``int`` took 1.9 for 1 and "3" for 3). Called in a DataLoader worker (from a
        ``worker_init_fn``), it fixes that worker's draws: the worker's seed is not mixed in."""
        self.seed = _merge_seed(seed)
        self.rng = random.Random(self.seed)
        self._rng_worker = _worker_seed()  # the process (None: not a worker) it was seeded in

    def _generator(self) -> random.Random:
        """The own generator; in a DataLoader worker other than the one it was seeded in, first
        restarted from ``seed`` and the worker's torch seed (a copy sent to every worker in one
        state would make the same draws in each)."""
        worker = _worker_seed()
        if worker != self._rng_worker:
            self.rng = random.Random(f"stochastic merge seed {self.seed}, worker seed {worker}")
            self._rng_worker = worker
        return self.rng

    def __copy__(self) -> StochasticMergeTokenizer:
        """A shallow copy with its own generator in the current state: sharing one, the copy's
        draws advanced the original's and the two drew in turn from one sequence."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.rng = copy.deepcopy(self.rng)
        return new

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


def _worker_seed() -> int | None:
    """The seed torch gave the DataLoader worker this runs in (its base seed plus the worker
    id), or None outside a worker."""
    info = get_worker_info()
    return None if info is None else int(info.seed)


def _merge_probability(p: Any) -> float:
    """The merge probability ``p`` checked: a finite number in [0, 1], named in the error."""
    return check_float("merge probability p", p, minimum=0.0, maximum=1.0)


def _merge_seed(seed: Any) -> int:
    """The seed of the merge draws checked: an ``int`` >= 0 (``random.Random`` seeds with
    ``abs(seed)``, so -3 would repeat the segmentations of 3)."""
    return check_int("seed", seed, minimum=0)
