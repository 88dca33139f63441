"""Vocabulary / Codec base helpers and MatrixCodec: the checks no other test reaches, the
default-vocabulary ids against the ids counted by hand, and tensor inputs."""

import inspect
import re

import numpy as np
import pytest
import torch

from graded.encodings import (
    AdjacencyCodec,
    DensePolynomialCodec,
    EdgeListCodec,
    PermutationCycleCodec,
    PermutationMatrixCodec,
    PermutationOneLineCodec,
    SparsePolynomialCodec,
    SubsetIndicatorCodec,
    SubsetListCodec,
    UpperTriangleCodec,
)
from graded.encodings.base import Codec, DecodeError, Vocabulary
from graded.encodings.integers import IntegerCodec
from graded.encodings.matrices import MatrixCodec


@pytest.mark.parametrize("bad", ["", 3])
def test_vocabulary_refuses_a_non_string_or_empty_token(bad):
    with pytest.raises(TypeError, match=rf"tokens must be non-empty strings, got {bad!r}"):
        Vocabulary(["a", bad])


def test_vocabulary_membership_equality_hash_and_repr():
    v = Vocabulary(["a", "b"])
    assert "a" in v and "<pad>" in v and "c" not in v
    same, other = Vocabulary(["a", "b"]), Vocabulary(["b", "a"])
    assert v == same and hash(v) == hash(same) and v != other
    assert len({v, same, other}) == 2
    assert repr(v) == "Vocabulary(size=5, specials=('<pad>', '<bos>', '<eos>'))"


def test_codec_default_vocabulary_ids_are_specials_then_tokens():
    codec = MatrixCodec(2, 2)
    m = np.array([[1, 0], [0, 1]])
    # specials <pad>, <bos>, <eos> take 0..2, then "0" = 3 and "1" = 4
    assert codec.encode_ids(m) == [4, 3, 3, 4]
    assert codec._default_vocabulary() is codec._default_vocabulary()  # built once, cached
    bos, eos, pad = 1, 2, 0
    np.testing.assert_array_equal(codec.decode_ids([bos, 4, 3, 3, 4, eos, pad, pad]), m)


def test_is_valid_is_whether_decode_succeeds():
    codec = MatrixCodec(1, 2)
    assert codec.is_valid(["0", "1"])
    assert not codec.is_valid(["0"])
    assert not codec.is_valid(["0", "2"])
    with pytest.raises(DecodeError):
        codec.decode(["0"])


def test_matrix_codec_entries_must_be_an_integer_codec():
    with pytest.raises(TypeError, match=r"entries must be an IntegerCodec or None, got 'base 10'"):
        MatrixCodec(2, 2, entries="base 10")


def test_matrix_codec_accepts_a_tensor_and_integral_floats():
    codec = MatrixCodec(2, 3)
    t = torch.tensor([[1, 0, 1], [0, 0, 1]])
    assert codec.encode(t) == ["1", "0", "1", "0", "0", "1"]
    assert codec.encode(t.float()) == codec.encode(t)


def test_matrix_codec_checks_shape_dtype_and_entries():
    codec = MatrixCodec(2, 2)
    with pytest.raises(ValueError, match=r"matrix has shape \(3,\), expected \(2, 2\)"):
        codec.encode([1, 0, 1])
    with pytest.raises(TypeError, match=r"matrix entries must be integers, got dtype float64"):
        codec.encode(np.array([[0.5, 0.0], [1.0, 0.0]]))
    with pytest.raises(ValueError, match=r"0/1 matrix codec got entries \[-1, 2\]; expected only "
                                         r"0 and 1"):
        codec.encode([[2, 0], [1, -1]])
    integer = MatrixCodec(1, 2, entries=IntegerCodec(10))
    np.testing.assert_array_equal(integer.decode(integer.encode([[2, -1]])), [[2, -1]])


@pytest.mark.parametrize("entry", [np.inf, -np.inf, 1e20, -1e19])
def test_matrix_codec_refuses_a_float_entry_outside_int64_naming_it(entry):
    # the cast to int64 made each of these -2^63 and encoded that: a different matrix
    message = re.escape(f"matrix entry {entry} is outside the int64 range")
    with pytest.raises(ValueError, match=message):
        MatrixCodec(1, 2, entries=IntegerCodec(10)).encode(np.array([[entry, 1.0]]))
    with pytest.raises(ValueError, match=message):
        MatrixCodec(1, 2).encode(np.array([[entry, 1.0]]))


def test_matrix_codec_refuses_an_integer_entry_outside_int64_naming_it():
    codec = MatrixCodec(1, 2, entries=IntegerCodec(10))
    with pytest.raises(ValueError, match=rf"matrix entry {2**70} is outside the int64 range"):
        codec.encode([[2**70, 1]])
    with pytest.raises(ValueError, match=rf"matrix entry {2**64 - 1} is outside the int64 range"):
        codec.encode(np.array([[2**64 - 1, 1]], dtype=np.uint64))  # was encoded as -1
    # the ends of the range are entries like any other: digits written out by hand
    top, bottom = "9223372036854775807", "9223372036854775808"
    assert codec.encode(np.array([[2**63 - 1, 1]], dtype=np.uint64)) == ["+", *top, "+", "1"]
    assert codec.encode([[-(2**63), 2**63 - 1]]) == ["-", *bottom, "+", *top]


def test_matrix_decoder_rejects_an_entry_beyond_int64_with_reason():
    # a model can write any number of digits; this was an OverflowError, not a DecodeError
    codec = MatrixCodec(1, 2, entries=IntegerCodec(10))
    with pytest.raises(DecodeError, match=rf"entry 1 is {10**20 - 1}, outside the int64 range"):
        codec.decode(["+", *"9" * 20, "+", "1"])
    with pytest.raises(DecodeError, match=rf"entry 2 is -{2**63 + 1}, outside the int64 range"):
        codec.decode(["+", "1", "-", *str(2**63 + 1)])
    np.testing.assert_array_equal(codec.decode(["-", *str(2**63), "+", "1"]), [[-(2**63), 1]])


def _concrete_codecs(cls=Codec):
    for sub in cls.__subclasses__():
        if not inspect.isabstract(sub) and sub.__module__.startswith("graded."):
            yield sub
        yield from _concrete_codecs(sub)


ADJ2 = [[0, 1], [1, 0]]
# each codec, a list of its tokens, the object they encode (worked by hand), and that list
# joined into one string, which a character-per-token reading would also decode
BARE_STRING_CASES = [
    (SubsetListCodec(20), ["1", "2"], frozenset({1, 2})),
    (SubsetIndicatorCodec(2), ["1", "0"], frozenset({1})),
    (IntegerCodec(), ["-", "3", "5"], -35),
    (PermutationOneLineCodec(2), ["2", "1"], (2, 1)),
    (PermutationMatrixCodec(2), ["0", "1", "1", "0"], (2, 1)),
    (PermutationCycleCodec(2), ["(", "1", "2", ")"], (2, 1)),
    (SparsePolynomialCodec(1), ["+", "3", "e1"], {(1,): 3}),  # 3x
    (DensePolynomialCodec(1, 1), ["+", "0", "+", "3"], {(1,): 3}),  # 0·1 + 3·x
    (MatrixCodec(1, 2), ["0", "1"], np.array([[0, 1]])),
    (AdjacencyCodec(2), ["0", "1", "1", "0"], np.array(ADJ2)),
    (UpperTriangleCodec(2), ["1"], np.array(ADJ2)),
    (EdgeListCodec(2), ["1", "2"], np.array(ADJ2)),
]


@pytest.mark.parametrize("codec, tokens, obj", BARE_STRING_CASES,
                         ids=[type(c).__name__ for c, _, _ in BARE_STRING_CASES])
def test_every_codec_refuses_a_bare_string_and_still_decodes_a_list_of_tokens(codec, tokens,
                                                                              obj):
    text = "".join(tokens)
    with pytest.raises(TypeError, match=rf"decode expects a sequence of tokens \(a list of "
                                        rf"strings, as encode returns\), got the str "
                                        rf"{re.escape(repr(text))}"):
        codec.decode(text)
    with pytest.raises(TypeError, match=r"got the bytes"):
        codec.decode(text.encode())
    def same(decoded):
        return np.array_equal(decoded, obj) if isinstance(obj, np.ndarray) else decoded == obj

    assert same(codec.decode(tokens)) and same(codec.decode(tuple(tokens)))
    assert same(codec.decode_ids(codec.encode_ids(obj)))


def test_the_bare_string_cases_cover_every_codec():
    assert {type(c) for c, _, _ in BARE_STRING_CASES} == set(_concrete_codecs())


def test_a_multi_character_token_in_a_list_is_one_token():
    # "12" as a string was read as {1, 2}; as one token it is the element 12
    assert SubsetListCodec(20).decode(["12"]) == frozenset({12})
    assert SubsetListCodec(20).decode(["1", "2"]) == frozenset({1, 2})
