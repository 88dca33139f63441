"""Codecs and tokenizers at the edges of their domain: many variables, long cycle notations,
the canonical-labelling limit, text that is no Unicode, tokens of thousands of digits, pickled
copies of a BPE tokenizer.

Each test compares against an independent computation (a filtered product of exponents, a
composition of cycles written as dicts) and bounds the running time where the old code was
quadratic or exponential in the size of the object.
"""

from __future__ import annotations

import copy
import itertools
import math
import pickle
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.encodings import (
    MAX_CANONICAL_VERTICES,
    BPETokenizer,
    DecodeError,
    DensePolynomialCodec,
    EdgeListCodec,
    IntegerCodec,
    PermutationCycleCodec,
    PermutationOneLineCodec,
    SparsePolynomialCodec,
    SubsetListCodec,
    UpperTriangleCodec,
    monomials,
)


def _monomials_by_filtering(n_vars: int, max_degree: int) -> list[tuple[int, ...]]:
    """The definition read literally: every exponent tuple up to the degree, sorted."""
    out = [e for e in itertools.product(range(max_degree + 1), repeat=n_vars)
           if sum(e) <= max_degree]
    return sorted(out, key=lambda e: (sum(e), tuple(-x for x in e)))


@pytest.mark.parametrize("n_vars", range(1, 6))
@pytest.mark.parametrize("max_degree", range(0, 5))
def test_monomials_equal_the_filtered_product_in_graded_descending_lex_order(n_vars, max_degree):
    assert monomials(n_vars, max_degree) == _monomials_by_filtering(n_vars, max_degree)


def test_monomials_of_many_variables_are_listed_without_enumerating_the_cube():
    # the old filtered product walked (D + 1)^n tuples: 3^14 = 4.8e6 for the 120 monomials of
    # degree 2 in 14 variables (1.5 s), 3^20 = 3.5e9 for 20 variables (hours)
    start = time.perf_counter()
    assert len(monomials(14, 2)) == math.comb(16, 2)
    assert time.perf_counter() - start < 0.5
    mons = monomials(20, 2)
    assert len(mons) == math.comb(22, 2) == 231
    assert len(set(mons)) == 231 and all(sum(e) <= 2 and len(e) == 20 for e in mons)
    assert mons[:3] == [(0,) * 20, (1,) + (0,) * 19, (0, 1) + (0,) * 18]
    assert mons[-1] == (0,) * 19 + (2,)
    codec = DensePolynomialCodec(20, 2)
    poly = {(0,) * 20: -7, (1,) + (0,) * 18 + (1,): 3, (0,) * 19 + (2,): 10**30}
    assert codec.decode(codec.encode(poly)) == poly
    assert len(codec.encode(poly)) == 231 * 2 + 30  # a sign and a digit a slot, 10^30 31 digits


def _product_of_cycles(n: int, cycles: list[list[int]]) -> tuple[int, ...]:
    """π = c_1 ∘ c_2 ∘ ... ∘ c_k (the rightmost acts first), each cycle as a dict, applied
    point by point."""
    maps = [dict(zip(c, c[1:] + c[:1])) for c in cycles]
    out = []
    for i in range(1, n + 1):
        x = i
        for m in reversed(maps):
            x = m.get(x, x)
        out.append(x)
    return tuple(out)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.data())
def test_non_strict_cycle_decoding_is_the_product_of_the_cycles(n, data):
    cycles = data.draw(st.lists(
        st.lists(st.integers(1, n), min_size=1, max_size=n, unique=True), max_size=4))
    tokens = [t for c in cycles for t in ("(", *map(str, c), ")")]
    for fixed in (False, True):
        assert PermutationCycleCodec(n, fixed, strict=False).decode(tokens) == (
            _product_of_cycles(n, cycles))


def test_cycle_notation_with_many_fixed_points_decodes_in_linear_time():
    # the identity of 1..6000 with its fixed points written is 6000 cycles; the old decoder
    # rebuilt all n entries for each cycle (3.1 s here), now only the cycle's own entries
    n = 6000
    perm = list(range(1, n + 1))
    random.Random(0).shuffle(perm)
    for target in (tuple(range(1, n + 1)), tuple(perm)):
        codec = PermutationCycleCodec(n, include_fixed_points=True)
        tokens = codec.encode(target)
        start = time.perf_counter()
        assert codec.decode(tokens) == target
        assert time.perf_counter() - start < 0.3
    assert PermutationCycleCodec(n, include_fixed_points=True).encode(range(1, n + 1))[:6] == [
        "(", "1", ")", "(", "2", ")"]


def test_canonical_upper_triangle_codec_beyond_the_labelling_limit_is_refused_when_built():
    # the old codec was built, then every encode raised, and is_valid raised ValueError
    # instead of answering False
    assert MAX_CANONICAL_VERTICES == 64
    UpperTriangleCodec(64, canonical=True)
    UpperTriangleCodec(65)  # the plain codec has no limit
    with pytest.raises(ValueError, match=r"n=65, canonical=True.*limited to 64 vertices"):
        UpperTriangleCodec(65, canonical=True)


def test_bpe_names_a_lone_surrogate_as_a_bad_character_by_position():
    # a Python str may hold a lone surrogate; the BPE library raised "TextInputSequence must
    # be str" (a TypeError) when encoding one, which the text is
    tok = BPETokenizer.train(["abc", "abc"], vocab_size=10, min_frequency=1)
    assert tok.decode(tok.encode("cab")) == "cab"
    with pytest.raises(ValueError, match=r"lone surrogate '\\udc00' at position 2"):
        tok.encode("ab\udc00")
    with pytest.raises(ValueError, match=r"texts\[1\] has the lone surrogate '\\ud800' at "
                                         r"position 1"):
        BPETokenizer.train(["abc", "a\ud800"], vocab_size=10)


@pytest.mark.parametrize("codec, tokens, reason", [
    (IntegerCodec(10), ["+", "9" * 5000], r"bad digit token '9{12}'\.\.\. \(5000 characters\) "
                                          r"at position 1: base 10 digits are 0\.\.9"),
    (SubsetListCodec(5), ["1", "7" * 5000], r"an element '7{12}'\.\.\. \(5000 characters\) is "
                                            r"outside 1\.\.5"),
    (PermutationOneLineCodec(3), ["1", "2", "30"], r"an entry 30 is outside 1\.\.3"),
    (EdgeListCodec(4), ["1", "2" * 4400], r"a vertex '2{12}'\.\.\. \(4400 characters\) is "
                                          r"outside 1\.\.4"),
    (SparsePolynomialCodec(1), ["+", "1", "e" + "1" * 5000],
     r"exponent token 'e1{11}'\.\.\. \(5001 characters\) at position 2 is outside e0\.\.e9"),
], ids=["integer-digit", "subset-element", "short-entry", "edge-vertex", "exponent"])
def test_a_token_of_thousands_of_digits_is_a_decode_error_not_an_int_conversion_error(
        codec, tokens, reason):
    # int() refuses strings of more than 4300 digits with a plain ValueError, which decode let
    # through and is_valid raised instead of answering False
    with pytest.raises(DecodeError, match=reason):
        codec.decode(tokens)
    assert codec.is_valid(tokens) is False


@pytest.mark.parametrize("clone", [lambda t: pickle.loads(pickle.dumps(t)), copy.deepcopy],
                         ids=["pickle", "deepcopy"])
def test_a_pickled_or_copied_bpe_tokenizer_gives_the_ids_of_the_original(clone):
    # the Hugging Face tokenizer is pickled as its JSON, which drops encode_special_tokens: a
    # DataLoader worker's copy cut "a<pad>b" at "<pad>" and wrote [6, 4, 9, 6, 8, 5, 7] where
    # the original wrote the learned piece [15]
    texts = ["a<pad>b"] * 5 + ["ab"] * 3
    tok = BPETokenizer.train(texts, vocab_size=30, min_frequency=1)
    # reference: the same training where "<pad>" is no special token, only five characters
    plain = BPETokenizer.train(texts, vocab_size=30, min_frequency=1,
                               specials=("[PAD]", "[BOS]", "[EOS]"))
    other = clone(tok)
    for text in ("a<pad>b", "b<pad>a", "<pad>"):
        pieces = [plain.hf.id_to_token(i) for i in plain.encode(text)]
        assert [tok.hf.id_to_token(i) for i in tok.encode(text)] == pieces
        assert other.encode(text) == tok.encode(text)
        assert other.decode(other.encode(text)) == text
    assert [tok.hf.id_to_token(i) for i in tok.encode("a<pad>b")] == ["a<pad>b"]
