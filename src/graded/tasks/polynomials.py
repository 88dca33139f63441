"""Integer polynomial arithmetic as next-token prediction, graded by monomial degree (000 §8.1).

A polynomial a_0 + a_1 x + ... + a_d x^d is written as its coefficients in ascending degree, one
integer token per coefficient. An example for ``operation="product"``::

    <bos> 3 -1 2 * 1 0 -4 = 3 -1 -10 4 -8 <eos>

means (3 - x + 2x²)(1 - 4x²) = 3 - x - 10x² + 4x³ - 8x⁴; ``operation="composition"`` writes
``o`` instead of ``*`` and the answer is the coefficients of p(q(x)). The model reads the prompt
up to ``=`` and is scored on the answer and ``<eos>``; the headline metric is exact match of the
whole answer. Each coefficient token carries the degree of its monomial as its grade
(``token_grades``); special tokens have grade 0.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from torch import Tensor

from graded.checks import check_choice, check_int
from graded.tasks.base import (
    IGNORE_INDEX,
    Task,
    TaskDataset,
    Vocab,
    check_seed,
    lm_tensors,
    pad_sequences,
)

OPERATIONS = {"product": "*", "composition": "o"}
MAX_VOCAB = 20_000


def poly_mul(p: list[int], q: list[int]) -> list[int]:
    """Coefficients of p·q (ascending degree) by the convolution sum."""
    out = [0] * (len(p) + len(q) - 1)
    for i, a in enumerate(p):
        for j, b in enumerate(q):
            out[i + j] += a * b
    return out


def poly_compose(p: list[int], q: list[int]) -> list[int]:
    """Coefficients of p(q(x)) by Horner's rule: (...(p_d q + p_{d-1}) q + ...) + p_0."""
    out = [p[-1]]
    for a in reversed(p[:-1]):
        out = poly_mul(out, q)
        out[0] += a
    return out


def composition_bound(degree: int, coeff_range: int, limit: int | None = None) -> int:
    """The largest |coefficient| of p(q(x)) over deg p, deg q <= degree, |coefficients| <= c.

    With C = c(1 + x + ... + x^degree), |[x^k] p∘q| = |Σ_i p_i [x^k] q^i| <= [x^k] C∘C (the
    triangle inequality in every convolution sum), and p = q = C attains it: the bound is the
    largest coefficient of C∘C. (The l1 bound c Σ_i (c(d+1))^i is 5.3 times larger at d = 3,
    c = 5: 42 105 against 7 875.)

    With ``limit``, a value above it is returned as soon as one is known: c³(d+1) (the
    coefficient of x^d in c·C² alone, degree >= 2), or the first of Horner's partial results
    with a coefficient above it (all coefficients are positive, so they only grow). Below the
    limit every value is at most limit², so the partial products are exact in int64.
    """
    c = coeff_range
    if limit is None:
        top = [c] * (degree + 1)
        out = [c]
        for _ in range(degree):
            out = poly_mul(out, top)
            out[0] += c
        return max(out)
    if degree >= 2 and c**3 * (degree + 1) > limit:
        return c**3 * (degree + 1)
    top_array = np.full(degree + 1, c, dtype=np.int64)
    partial = np.array([c], dtype=np.int64)
    for _ in range(degree):
        if int(partial.max()) > limit:
            break
        partial = np.convolve(partial, top_array)
        partial[0] += c
    return int(partial.max())


@dataclasses.dataclass
class PolynomialArithmetic(Task):
    """Coefficients of p·q or p∘q from those of p and q (SPEC C10; 000 §8.1, Ex 5.11).

    Degrees of p and q are uniform in [min_degree, max_degree], coefficients uniform in
    [-coeff_range, coeff_range] with a nonzero leading coefficient. ``vocab_degree`` (default
    ``max_degree``) fixes the vocabulary, so that a size split (train on low degrees, test on
    high ones) shares one vocabulary.

    Grades (``graded_object = "tokens"``): the monomial degree of each coefficient token, given
    per example in ``token_grades``; ``grades`` lists the possible values 0..max answer degree.
    """

    operation: str = "product"
    min_degree: int = 1
    max_degree: int = 3
    coeff_range: int = 5
    vocab_degree: int | None = None

    name: ClassVar[str] = "polynomials"
    kind: ClassVar[str] = "lm"
    metric: ClassVar[str] = "exact_match"
    graded_object: ClassVar[str] = "tokens"
    causal_grades: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_choice("operation", self.operation, tuple(OPERATIONS))
        check_int("min_degree", self.min_degree, minimum=0)
        check_int("max_degree", self.max_degree, minimum=max(1, self.min_degree))
        check_int("coeff_range", self.coeff_range, minimum=1)
        if self.vocab_degree is not None:
            check_int("vocab_degree", self.vocab_degree, minimum=self.max_degree)
        bound = self.coeff_bound
        if 2 * bound + 6 > MAX_VOCAB:
            raise ValueError(
                f"coefficients of a {self.operation} with max_degree={self.max_degree} and "
                f"coeff_range={self.coeff_range} reach at least ±{bound}, more than the "
                f"{MAX_VOCAB} one-token integers allowed; lower max_degree or coeff_range"
            )
        self._vocab = Vocab(["<pad>", "<bos>", "<eos>", "*", "o", "=",
                             *(str(v) for v in range(-bound, bound + 1))])

    @property
    def _vdeg(self) -> int:
        return self.vocab_degree if self.vocab_degree is not None else self.max_degree

    @property
    def coeff_bound(self) -> int:
        """The largest |coefficient| any answer of degree <= ``vocab_degree`` can have:
        c²(d+1) for products, :func:`composition_bound` for compositions (a value above the
        vocabulary's limit once the limit is passed)."""
        d, c = self._vdeg, self.coeff_range
        if self.operation == "product":
            return c * c * (d + 1)
        return composition_bound(d, c, MAX_VOCAB)

    @property
    def answer_degree(self) -> int:
        d = self.max_degree
        return 2 * d if self.operation == "product" else d * d

    @property
    def grades(self) -> tuple[float, ...]:
        return tuple(float(k) for k in range(self.answer_degree + 1))

    @property
    def vocab(self) -> Vocab:
        return self._vocab

    @property
    def max_len(self) -> int:
        # <bos> p op q = r <eos> has 2(d+1) + (answer degree + 1) + 4 tokens; inputs drop one.
        return 2 * (self.max_degree + 1) + self.answer_degree + 4

    # ---- format ----------------------------------------------------------------------------
    def answer(self, p: list[int], q: list[int]) -> list[int]:
        return poly_mul(p, q) if self.operation == "product" else poly_compose(p, q)

    def format_example(self, p: list[int], q: list[int]) -> list[str]:
        """The token list of the documented format for the pair (p, q)."""
        r = self.answer(p, q)
        op = OPERATIONS[self.operation]
        return ["<bos>", *map(str, p), op, *map(str, q), "=", *map(str, r), "<eos>"]

    def parse_example(self, tokens: list[str]) -> tuple[list[int], list[int], list[int]]:
        """(p, q, r) from a token list of the documented format; malformed input raises."""
        op = OPERATIONS[self.operation]
        if len(tokens) < 6 or tokens[0] != "<bos>" or tokens[-1] != "<eos>":
            raise ValueError(f"expected '<bos> p {op} q = r <eos>', got {' '.join(tokens)!r}")
        try:
            i, j = tokens.index(op), tokens.index("=")
            p = [int(t) for t in tokens[1:i]]
            q = [int(t) for t in tokens[i + 1: j]]
            r = [int(t) for t in tokens[j + 1: -1]]
        except ValueError as err:
            raise ValueError(f"malformed polynomial example {' '.join(tokens)!r}: {err}") from None
        return p, q, r

    @staticmethod
    def token_degrees(tokens: list[str]) -> list[int]:
        """Grade of each token: its monomial degree for coefficients, 0 for special tokens
        (``<pad>`` included, as the datasets pad ``token_grades`` with 0)."""
        out, k = [], 0
        for t in tokens:
            if t in ("<pad>", "<bos>", "*", "o", "=", "<eos>"):
                out.append(0)
                k = 0
            else:
                out.append(k)
                k += 1
        return out

    def grade_tokens(self, tokens: str | Sequence[str]) -> list[int]:
        """Monomial degrees (:meth:`token_degrees`), as the datasets grade
        ``<bos> p op q = r <eos>``, a seq2seq source ``p op q`` or its decoder's ``<bos> r``."""
        return self.token_degrees(self._tokens(tokens))

    # ---- generation ----------------------------------------------------------------------
    def _random_poly(self, rng: random.Random) -> list[int]:
        d = rng.randint(self.min_degree, self.max_degree)
        c = self.coeff_range
        coeffs = [rng.randint(-c, c) for _ in range(d)]
        lead = rng.choice([v for v in range(-c, c + 1) if v != 0])
        return [*coeffs, lead]

    def _encode_pairs(self, pairs: list[tuple[list[int], list[int]]]) -> dict[str, Tensor]:
        seqs, starts, grades = [], [], []
        for p, q in pairs:
            toks = self.format_example(p, q)
            seqs.append(self.vocab.encode(toks))
            starts.append(toks.index("=") + 1)
            grades.append(self.token_degrees(toks))
        return lm_tensors(seqs, starts, self.max_len, self.vocab.pad_id, grades)

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        rng = random.Random(seed)
        return self._encode_pairs([(self._random_poly(rng), self._random_poly(rng))
                                   for _ in range(n)])

    def examples(self, data: TaskDataset) -> list[list[str]]:
        """The token lists of every example (inputs followed by the final target)."""
        out = []
        for inp, tgt, pad in zip(data.inputs, data.targets, data.tensors["key_padding_mask"]):
            n = int((~pad).sum())
            last = int(tgt[n - 1])
            if last == IGNORE_INDEX:
                raise ValueError("the last target of an example must be scored")
            out.append(self.vocab.decode([*inp[:n].tolist(), last]))
        return out

    # ---- splits ----------------------------------------------------------------------------
    def size_configs(self) -> tuple[PolynomialArithmetic, PolynomialArithmetic]:
        """Train on degrees [min_degree, mid], test on (mid, max_degree]; one vocabulary."""
        if self.max_degree <= self.min_degree:
            raise ValueError("a size split needs max_degree > min_degree, got "
                             f"{self.min_degree}..{self.max_degree}")
        mid = (self.min_degree + self.max_degree) // 2
        if mid < 1:  # the training side would have max_degree 0, which the task refuses
            raise ValueError(f"a size split of degrees {self.min_degree}..{self.max_degree} "
                             f"(min_degree={self.min_degree}, max_degree={self.max_degree}) "
                             "cuts at degree 0 and would train on constants only; use "
                             "max_degree >= 2")
        small = dataclasses.replace(self, max_degree=mid, vocab_degree=self._vdeg)
        large = dataclasses.replace(self, min_degree=mid + 1, vocab_degree=self._vdeg)
        return small, large

    def relabel(self, data: TaskDataset, seed: int) -> TaskDataset:
        """Substitute x ↦ -x: (p(-x))(q(-x)) = r(-x) for products and p(q(-x)) = r(-x) for
        compositions, so odd-degree coefficients of q, r (and p for products) change sign.
        The map is an involution, hence a bijection. ``seed`` is unused (the map is fixed)."""
        check_seed(seed)  # refused as every task's relabel refuses it
        pairs = []
        for toks in self.examples(data):
            p, q, _ = self.parse_example(toks)
            flip_q = [a if k % 2 == 0 else -a for k, a in enumerate(q)]
            flip_p = ([a if k % 2 == 0 else -a for k, a in enumerate(p)]
                      if self.operation == "product" else p)
            pairs.append((flip_p, flip_q))
        return data.replace(**self._encode_pairs(pairs))


@dataclasses.dataclass
class PolynomialArithmeticSeq2Seq(PolynomialArithmetic):
    """The same arithmetic for an encoder-decoder: source ``p op q``, target the answer.

    Tensors: ``inputs`` (N, S) source tokens ``3 -1 2 * 1 0 -4`` with ``key_padding_mask``;
    ``decoder_inputs`` (N, T) ``<bos> r`` with ``decoder_key_padding_mask``; ``targets``
    (N, T) ``r <eos>`` (``-100`` on padding) with ``loss_mask``; ``token_grades`` and
    ``decoder_token_grades`` hold monomial degrees.
    """

    name: ClassVar[str] = "polynomials_seq2seq"
    kind: ClassVar[str] = "seq2seq"

    @property
    def source_len(self) -> int:
        return 2 * (self.max_degree + 1) + 1

    @property
    def target_len(self) -> int:
        return self.answer_degree + 2

    @property
    def max_len(self) -> int:
        return max(self.source_len, self.target_len)

    def _encode_pairs(self, pairs: list[tuple[list[int], list[int]]]) -> dict[str, Tensor]:
        pad = self.vocab.pad_id
        src, dec, tgt, src_g, dec_g = [], [], [], [], []
        for p, q in pairs:
            toks = self.format_example(p, q)
            eq = toks.index("=")
            grades = self.token_degrees(toks)
            src.append(self.vocab.encode(toks[1:eq]))
            src_g.append(grades[1:eq])
            dec.append(self.vocab.encode(["<bos>", *toks[eq + 1: -1]]))
            dec_g.append([0, *grades[eq + 1: -1]])
            tgt.append(self.vocab.encode(toks[eq + 1:]))
        inputs = pad_sequences(src, self.source_len, pad)
        decoder_inputs = pad_sequences(dec, self.target_len, pad)
        decoder_pad = decoder_inputs == pad
        targets = pad_sequences(tgt, self.target_len, pad).masked_fill(decoder_pad, IGNORE_INDEX)
        return {
            "inputs": inputs,
            "key_padding_mask": inputs == pad,
            "decoder_inputs": decoder_inputs,
            "decoder_key_padding_mask": decoder_pad,
            "targets": targets,
            "loss_mask": ~decoder_pad,
            "token_grades": pad_sequences(src_g, self.source_len, 0),
            "decoder_token_grades": pad_sequences(dec_g, self.target_len, 0),
        }

    def examples(self, data: TaskDataset) -> list[list[str]]:
        out = []
        for src, tgt in zip(data.inputs, data.targets):
            answer = self.vocab.decode(tgt[tgt != IGNORE_INDEX])
            out.append(["<bos>", *self.vocab.decode(src), "=", *answer])
        return out
