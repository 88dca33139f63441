"""ListOps (Nangia & Bowman 2018) as in Long Range Arena, graded by nesting depth.

Expressions are nested lists of operators over digits 0-9, written in prefix form::

    [MAX 2 9 [MIN 4 7 ] 0 ]   ->   9

with the four Long Range Arena operators: ``[MIN``, ``[MAX``, ``[MED`` (the median, truncated to
an int as LRA's ``int(np.median(...))``: the median of (1, 2) is 1), ``[SM`` (sum mod 10).
LRA's generator also writes round parentheses that carry no information; we leave them out.
The label is the value of the expression (10 classes). The grade of every token is its nesting
depth: the number of lists that contain it, where an operator token and its ``]`` delimit
their list from outside (the outermost ``[MAX`` and the last ``]`` have depth 0, the digits
of the outermost list depth 1).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor

from graded.checks import check_float, check_int
from graded.tasks.base import Task, TaskDataset, Vocab, pad_sequences

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
Tree = int | tuple[str, list["Tree"]]


class _TooLong(Exception):
    """Raised inside the generator once a tree exceeds the length budget."""


def apply_operator(op: str, args: list[int]) -> int:
    """The value of one list (LRA semantics)."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    if op == "[MED":
        s = sorted(args)
        n = len(s)
        # int(np.median): the mean of the two middle values for even n, truncated to an int
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
    raise ValueError(f"unknown ListOps operator {op!r}; expected one of {OPERATORS}")


def evaluate(tree: Tree) -> int:
    """The value of a tree (recursive)."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    return apply_operator(op, [evaluate(a) for a in args])


def to_tokens(tree: Tree) -> list[str]:
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    out = [op]
    for a in args:
        out.extend(to_tokens(a))
    out.append(END)
    return out


def parse(tokens: list[str]) -> Tree:
    """The tree of a token list; unbalanced or unknown tokens raise ``ValueError``."""
    stack: list[tuple[str, list[Tree]]] = []
    result: Tree | None = None
    for i, t in enumerate(tokens):
        if result is not None:
            raise ValueError(f"tokens after the end of the expression at position {i}: {t!r}")
        if t in OPERATORS:
            stack.append((t, []))
        elif t == END:
            if not stack or not stack[-1][1]:
                raise ValueError(f"unexpected {END!r} at position {i}")
            node = stack.pop()
            if stack:
                stack[-1][1].append(node)
            else:
                result = node
        elif t.isdigit() and len(t) == 1:
            if stack:
                stack[-1][1].append(int(t))
            else:
                result = int(t)
        else:
            raise ValueError(f"unknown ListOps token {t!r} at position {i}")
    if result is None:
        raise ValueError(f"incomplete ListOps expression {' '.join(tokens)!r}")
    return result


def token_depths(tokens: list[str]) -> list[int]:
    """Nesting depth of every token (number of enclosing lists; brackets count outside).

    A ``]`` that closes no list (a malformed prompt) encloses nothing: depths are clamped at 0,
    as Dyck's :func:`~graded.tasks.dyck.nesting_depths`, so a grade is never negative."""
    out, depth = [], 0
    for t in tokens:
        if t == END:
            depth = max(depth - 1, 0)
            out.append(depth)
        elif t in OPERATORS:
            out.append(depth)
            depth += 1
        else:
            out.append(depth)
    return out


@dataclasses.dataclass
class ListOps(Task):
    """Classify the value (0-9) of a random ListOps expression (LRA; SPEC C10).

    Trees follow LRA's generator: below ``max_depth`` a non-root node is a list of
    2..``max_args`` arguments (LRA: 10) under a random operator with probability ``value_p``
    and a digit otherwise (LRA names this probability VALUE_P = 0.25, although it is the
    probability of a list); trees whose token length falls outside [min_length, max_length] are
    rejected (LRA: lengths 500-2000). The root is always a list. ``max_depth`` counts nesting
    levels: lists sit at depths 0..max_depth-1 and digits at most at depth max_depth (LRA counts
    from 1, so its max_depth 10 is our 9).
    Inputs are (N, max_length) token ids padded with ``<pad>``; ``token_grades`` holds depths.

    Grades (``graded_object = "tokens"``): nesting depth 0..max_depth, per token.
    """

    min_length: int = 5
    max_length: int = 64
    max_depth: int = 4
    max_args: int = 5
    value_p: float = 0.25
    max_tries: int = 1000

    name: ClassVar[str] = "listops"
    kind: ClassVar[str] = "classification"
    metric: ClassVar[str] = "accuracy"
    graded_object: ClassVar[str] = "tokens"
    causal_grades: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_int("min_length", self.min_length, minimum=4)
        check_int("max_length", self.max_length, minimum=self.min_length)
        check_int("max_depth", self.max_depth, minimum=1)
        check_int("max_args", self.max_args, minimum=2)
        check_float("value_p", self.value_p, minimum=0.0, maximum=1.0, strict_min=True)
        check_int("max_tries", self.max_tries, minimum=1)
        self._vocab = Vocab(["<pad>", *OPERATORS, END, *map(str, range(10))])

    @property
    def vocab(self) -> Vocab:
        return self._vocab

    @property
    def grades(self) -> tuple[float, ...]:
        return tuple(float(k) for k in range(self.max_depth + 1))

    @property
    def num_outputs(self) -> int:
        return 10

    @property
    def max_len(self) -> int:
        return self.max_length

    def grade_tokens(self, tokens: str | Sequence[str]) -> list[int]:
        """Nesting depths (:func:`token_depths`), as the datasets grade an expression."""
        return token_depths(self._tokens(tokens))

    def _tree(self, rng: random.Random, depth: int, budget: list[int]) -> Tree:
        """LRA's ``generate_tree``; ``budget`` counts tokens left and aborts trees that are
        already too long (they would be rejected anyway, so the accepted law is unchanged)."""
        if depth > 0 and (depth >= self.max_depth or rng.random() > self.value_p):
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooLong
            return rng.randrange(10)
        budget[0] -= 2
        n_args = rng.randint(2, self.max_args)
        args = [self._tree(rng, depth + 1, budget) for _ in range(n_args)]
        return (rng.choice(OPERATORS), args)

    def sample_tree(self, rng: random.Random) -> Tree:
        """One tree with token length in [min_length, max_length] (rejection sampling)."""
        too_long = 0
        for _ in range(self.max_tries):
            try:
                tree = self._tree(rng, 0, [self.max_length])
            except _TooLong:
                too_long += 1
                continue
            if self.min_length <= len(to_tokens(tree)):
                return tree
        # the hint follows the rejections: long trees need smaller ones, short trees larger
        hint = ("widen the length range (raise max_length) or lower max_depth, max_args or "
                "value_p" if too_long * 2 > self.max_tries else
                "widen the length range (lower min_length) or raise max_depth, max_args or "
                "value_p")
        raise ValueError(
            f"no ListOps tree with length in [{self.min_length}, {self.max_length}] in "
            f"{self.max_tries} tries ({too_long} too long, {self.max_tries - too_long} too "
            f"short; max_depth={self.max_depth}, max_args={self.max_args}, "
            f"value_p={self.value_p}); {hint}"
        )

    def encode_trees(self, trees: list[Tree]) -> dict[str, Tensor]:
        toks = [to_tokens(t) for t in trees]
        ids = pad_sequences([self.vocab.encode(t) for t in toks], self.max_length,
                            self.vocab.pad_id)
        return {
            "inputs": ids,
            "targets": torch.tensor([evaluate(t) for t in trees], dtype=torch.long),
            "key_padding_mask": ids == self.vocab.pad_id,
            "token_grades": pad_sequences([token_depths(t) for t in toks], self.max_length, 0),
        }

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        rng = random.Random(seed)
        return self.encode_trees([self.sample_tree(rng) for _ in range(n)])

    def trees(self, data: TaskDataset) -> list[Tree]:
        return [parse(self.vocab.decode(row)) for row in data.inputs]

    def size_configs(self) -> tuple[ListOps, ListOps]:
        """Train on lengths [min_length, mid], test on (mid, max_length]."""
        mid = (self.min_length + self.max_length) // 2
        if mid >= self.max_length:
            raise ValueError(f"a size split needs two lengths, max_length >= min_length + 1, "
                             f"got {self.min_length}..{self.max_length}")
        return (dataclasses.replace(self, max_length=mid),
                dataclasses.replace(self, min_length=mid + 1))
