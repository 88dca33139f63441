"""Dyck-k languages (balanced brackets of k types): next-token prediction and recognition.

Tokens: ``<pad>``, ``<bos>``, ``<eos>`` and k bracket pairs, ``( )``, ``[ ]``, ``{ }``, ``< >`` for
k <= 4 and ``(1 )1``, ``(2 )2``, ... for larger k. An example word of Dyck-2::

    ( [ ] ( ) )

The grade of a token is its nesting depth: the number of pairs strictly enclosing it, so a pair's
opening and closing brackets share a depth and the outermost pairs have depth 0 (004 §5.3.3 uses
the stack depth; 004's Dyck construction is the k = 1 case).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor

from graded.checks import check_float, check_int
from graded.tasks.base import (
    IGNORE_INDEX,
    Task,
    TaskDataset,
    Vocab,
    check_seed,
    lm_tensors,
    pad_sequences,
)

SMALL_PAIRS = (("(", ")"), ("[", "]"), ("{", "}"), ("<", ">"))


def bracket_pairs(k: int) -> tuple[tuple[str, str], ...]:
    if k <= len(SMALL_PAIRS):
        return SMALL_PAIRS[:k]
    return tuple((f"({i}", f"){i}") for i in range(1, k + 1))


def is_dyck(tokens: list[str], pairs: tuple[tuple[str, str], ...]) -> bool:
    """Whether ``tokens`` is a balanced word over ``pairs`` (a stack recogniser)."""
    closer_of = dict(pairs)
    opener_of = {c: o for o, c in pairs}
    stack: list[str] = []
    for t in tokens:
        if t in closer_of:
            stack.append(t)
        elif t in opener_of:
            if not stack or stack[-1] != opener_of[t]:
                return False
            stack.pop()
        else:
            raise ValueError(f"unknown Dyck token {t!r}; expected one of {pairs}")
    return not stack


def nesting_depths(tokens: list[str], pairs: tuple[tuple[str, str], ...]) -> list[int]:
    """Pairs strictly enclosing each token, ignoring types; clamped at 0 for invalid words."""
    openers = {o for o, _ in pairs}
    closers = {c for _, c in pairs}
    out, depth = [], 0
    for t in tokens:
        if t in openers:
            out.append(depth)
            depth += 1
        elif t in closers:
            depth = max(depth - 1, 0)
            out.append(depth)
        else:
            out.append(0)
    return out


@dataclasses.dataclass
class DyckLM(Task):
    """Next-token prediction on random Dyck-k words (SPEC C10; 004 §5.3.3 for k = 1).

    A word of even length uniform in [min_length, max_length] is a random walk on the depth:
    open (a uniform type) with probability ``p_open`` when both moves are allowed, close (the
    type on top of the stack) when the depth is ``max_depth`` or the remaining length equals the
    depth. The sequence is ``<bos> word <eos>``; every target is trained and scored
    (``loss_mask``; headline metric ``token_accuracy``, as the trainer evaluates it). Opening
    moves are random, so ``metric_mask`` marks the positions whose target is a closing bracket,
    the only ones whose answer is determined (its type must match the open bracket):
    ``masked_token_accuracy`` in ``graded.evaluation`` scores those.

    Grades (``graded_object = "tokens"``): nesting depth 0..max_depth-1 per token.
    """

    k: int = 2
    min_length: int = 2
    max_length: int = 32
    max_depth: int = 8
    p_open: float = 0.5

    name: ClassVar[str] = "dyck"
    kind: ClassVar[str] = "lm"
    metric: ClassVar[str] = "token_accuracy"
    graded_object: ClassVar[str] = "tokens"
    causal_grades: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_int("k", self.k, minimum=1)
        check_int("min_length", self.min_length, minimum=2)
        check_int("max_length", self.max_length, minimum=self.min_length)
        if self.min_length % 2 or self.max_length % 2:
            raise ValueError(f"Dyck lengths must be even, got min_length={self.min_length}, "
                             f"max_length={self.max_length}")
        check_int("max_depth", self.max_depth, minimum=1)
        check_float("p_open", self.p_open, minimum=0.0, maximum=1.0, strict_min=True)
        self.pairs = bracket_pairs(self.k)
        self._vocab = Vocab(["<pad>", "<bos>", "<eos>", *(b for p in self.pairs for b in p)])

    @property
    def vocab(self) -> Vocab:
        return self._vocab

    @property
    def grades(self) -> tuple[float, ...]:
        return tuple(float(d) for d in range(self.max_depth))

    @property
    def max_len(self) -> int:
        return self.max_length + 1  # <bos> word <eos> minus one

    def grade_tokens(self, tokens: str | Sequence[str]) -> list[int]:
        """Nesting depths (:func:`nesting_depths`; ``<bos>``, ``<eos>`` have depth 0), as
        the datasets grade ``<bos> word <eos>`` (LM) or the word (recognition)."""
        return nesting_depths(self._tokens(tokens), self.pairs)

    def sample_word(self, rng: random.Random, length: int | None = None) -> list[str]:
        """One balanced word (the random walk described in the class docstring) of ``length``
        tokens, an even number >= 0; by default uniform among the even lengths in
        [min_length, max_length]."""
        if length is None:
            length = 2 * rng.randint(self.min_length // 2, self.max_length // 2)
        elif check_int("length", length, minimum=0) % 2:
            raise ValueError(f"a balanced word has an even length, got length={length}")
        stack: list[tuple[str, str]] = []
        word = []
        for step in range(length):
            remaining = length - step
            can_open = len(stack) < self.max_depth and remaining > len(stack)
            can_close = bool(stack)
            if can_open and (not can_close or rng.random() < self.p_open):
                pair = rng.choice(self.pairs)
                stack.append(pair)
                word.append(pair[0])
            else:
                word.append(stack.pop()[1])
        return word

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        rng = random.Random(seed)
        words = [self.sample_word(rng) for _ in range(n)]
        return self._encode_words(words)

    def _encode_words(self, words: list[list[str]]) -> dict[str, Tensor]:
        seqs = [self.vocab.encode(["<bos>", *w, "<eos>"]) for w in words]
        grades = [[0, *nesting_depths(w, self.pairs), 0] for w in words]
        out = lm_tensors(seqs, [1] * len(seqs), self.max_len, self.vocab.pad_id, grades)
        closers = torch.tensor([self.vocab.id(c) for _, c in self.pairs])
        out["metric_mask"] = torch.isin(out["targets"], closers)
        return out

    def words(self, data: TaskDataset) -> list[list[str]]:
        """The words of an LM dataset (inputs without ``<bos>``, up to ``<eos>``)."""
        out = []
        for inp, pad in zip(data.inputs, data.tensors["key_padding_mask"]):
            out.append(self.vocab.decode(inp[1: int((~pad).sum())]))
        return out

    def size_configs(self) -> tuple[DyckLM, DyckLM]:
        """Train on lengths [min_length, mid], test on (mid, max_length] (even lengths)."""
        mid = 2 * ((self.min_length + self.max_length) // 4)
        if mid >= self.max_length:
            raise ValueError(f"a size split needs two lengths, max_length >= min_length + 2, "
                             f"got {self.min_length}..{self.max_length}")
        return (dataclasses.replace(self, max_length=mid),
                dataclasses.replace(self, min_length=mid + 2))

    def type_permutation(self, seed: int) -> Tensor:
        """A token-id permutation that permutes bracket types (a derangement when k > 1).

        ``seed`` is checked as ``relabel`` checks it, an int in [0, ``MAX_SEED``]:
        ``random.Random`` seeds from |seed|, so −5 would draw the permutation of 5."""
        rng = random.Random(check_seed(seed))
        perm = list(range(self.k))
        while self.k > 1 and any(i == p for i, p in enumerate(perm)):
            rng.shuffle(perm)
        table = torch.arange(len(self.vocab))
        for i, j in enumerate(perm):
            for side in range(2):
                table[self.vocab.id(self.pairs[i][side])] = self.vocab.id(self.pairs[j][side])
        return table

    def relabel(self, data: TaskDataset, seed: int) -> TaskDataset:
        """Rename the bracket types by a permutation: balance, depths and every correct next
        token are preserved, so the relabelled targets are the mapped targets. With k = 1 the
        only permutation is the identity, which would make a relabelled split a random split
        under another name: ValueError."""
        seed = check_seed(seed)
        if self.k == 1:
            raise ValueError(f"a relabelled split is not meaningful for task {self.name!r} with "
                             "k=1: one bracket type has no other type to be renamed to, so the "
                             "relabelling is the identity; use k >= 2")
        table = self.type_permutation(seed)
        changes = {"inputs": table[data.inputs]}
        if self.kind == "lm":
            t = data.targets
            changes["targets"] = torch.where(t == IGNORE_INDEX, t, table[t.clamp(min=0)])
        return data.replace(**changes)


@dataclasses.dataclass
class DyckRecognition(DyckLM):
    """Decide whether a bracket word is balanced (label 1) or not (label 0).

    Half the examples are random balanced words (as in ``DyckLM``); the other half are balanced
    words with one corruption that makes them unbalanced: a closing bracket of the wrong type
    (k > 1), two adjacent different tokens swapped, or one bracket flipped between open and
    close (this changes the word's balance). Corruptions are re-drawn until the stack recogniser
    rejects the word. Inputs (N, max_length) without ``<bos>``/``<eos>``.

    Grades: the depth counter of :func:`nesting_depths` on the word as shown. A balanced word
    stays below ``max_depth``, but a corrupted one can go higher: a close flipped to an open
    lifts every later depth by 2 (an adjacent swap by at most 1), so ``grades`` is
    0..max_depth+1, the values the data can hold.
    """

    name: ClassVar[str] = "dyck_recognition"
    kind: ClassVar[str] = "classification"
    metric: ClassVar[str] = "accuracy"

    @property
    def grades(self) -> tuple[float, ...]:
        return tuple(float(d) for d in range(self.max_depth + 2))

    @property
    def num_outputs(self) -> int:
        return 2

    @property
    def max_len(self) -> int:
        return self.max_length

    def corrupt(self, word: list[str], rng: random.Random) -> list[str]:
        """An unbalanced word one edit away from ``word``."""
        flip = {o: c for o, c in self.pairs} | {c: o for o, c in self.pairs}
        closers = [c for _, c in self.pairs]
        for _ in range(100):
            w = list(word)
            kind = rng.randrange(3 if self.k > 1 else 2)
            i = rng.randrange(len(w))
            if kind == 0:
                j = i + 1 if i + 1 < len(w) else i - 1
                w[i], w[j] = w[j], w[i]
            elif kind == 1:
                w[i] = flip[w[i]]
            else:
                idx = [t for t, tok in enumerate(w) if tok in closers]
                i = rng.choice(idx)
                w[i] = rng.choice([c for c in closers if c != w[i]])
            if not is_dyck(w, self.pairs):
                return w
        raise RuntimeError(f"could not corrupt the word {' '.join(word)!r}")

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        rng = random.Random(seed)
        words, labels = [], []
        for _ in range(n):
            w = self.sample_word(rng)
            label = int(rng.random() < 0.5)
            words.append(w if label else self.corrupt(w, rng))
            labels.append(label)
        ids = pad_sequences([self.vocab.encode(w) for w in words], self.max_len,
                            self.vocab.pad_id)
        return {
            "inputs": ids,
            "targets": torch.tensor(labels, dtype=torch.long),
            "key_padding_mask": ids == self.vocab.pad_id,
            "token_grades": pad_sequences([nesting_depths(w, self.pairs) for w in words],
                                          self.max_len, 0),
        }

    def words(self, data: TaskDataset) -> list[list[str]]:
        return [self.vocab.decode(row) for row in data.inputs]
