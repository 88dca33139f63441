"""Bit-string token code shared by the problems: round trip and rejection of bad sequences."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.search.patternboost import DecodeError, pack_bits, unpack_bits


@given(st.lists(st.integers(0, 1), max_size=80), st.integers(1, 8))
@settings(max_examples=50, deadline=None)
def test_pack_then_unpack_returns_the_bits(bits, k):
    tokens = pack_bits(bits, k)
    assert len(tokens) == -(-len(bits) // k)
    assert all(0 <= t < 2**k for t in tokens)
    assert unpack_bits(tokens, k, len(bits)).tolist() == bits


def test_pack_reads_most_significant_bit_first():
    assert pack_bits([1, 0, 1, 1, 0, 1], 4) == [0b1011, 0b0100]


@given(st.lists(st.integers(0, 1), min_size=1, max_size=40), st.integers(2, 6))
@settings(max_examples=30, deadline=None)
def test_unpack_rejects_wrong_length(bits, k):
    tokens = pack_bits(bits, k)
    with pytest.raises(DecodeError, match="wrong length"):
        unpack_bits([*tokens, 0], k, len(bits))


def test_unpack_rejects_out_of_range_token_and_padding_bits():
    with pytest.raises(DecodeError, match="out of range"):
        unpack_bits([16, 0], 4, 8)
    with pytest.raises(DecodeError, match="padding"):
        unpack_bits([0b0001], 4, 3)  # only three bits are used; the fourth must be zero


@pytest.mark.parametrize("token", [1.5, 1.0, "3", True, None])
def test_unpack_refuses_a_token_that_is_not_an_int_naming_it(token):
    # 1.5 was truncated to the token 1, "3" read as 3 and True as 1: a different object
    with pytest.raises(TypeError, match=rf"token id {re.escape(repr(token))} at position 1 is "
                                        r"not an int"):
        unpack_bits([0, token], 2, 4)


@pytest.mark.parametrize("token", [2**70, -1, 4])
def test_unpack_names_an_out_of_range_token(token):
    # 2**70 was an OverflowError from numpy
    with pytest.raises(DecodeError, match=rf"token {token} at position 1 is out of range 0..3"):
        unpack_bits([0, token], 2, 4)


def test_unpack_accepts_numpy_and_torch_integer_tokens():
    import numpy as np
    import torch

    for tokens in ([2, 3], np.array([2, 3]), torch.tensor([2, 3]), [np.int8(2), np.uint64(3)]):
        assert unpack_bits(tokens, 2, 4).tolist() == [1, 0, 1, 1]


def test_pack_rejects_non_bits_and_bad_chunk():
    with pytest.raises(ValueError, match="0 or 1"):
        pack_bits([0, 2], 1)
    with pytest.raises(ValueError, match="bits_per_token"):
        pack_bits([0, 1], 0)
