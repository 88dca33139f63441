"""Codec flags take True or False: ``bool("false")`` is True, so ``IntegerCodec(reverse="false")``
wrote least significant digits first. A stochastic-merge piece no text can reach (a character
outside the alphabet) is refused, and so is a negative seed, which ``random.Random`` takes as its
absolute value (seed -3 repeated the segmentations of seed 3)."""

from __future__ import annotations

import numpy as np
import pytest

from graded.encodings import (
    IntegerCodec,
    PermutationCycleCodec,
    StochasticMergeTokenizer,
    UpperTriangleCodec,
)

FLAGGED = [
    (lambda v: IntegerCodec(10, reverse=v), "reverse"),
    (lambda v: UpperTriangleCodec(4, canonical=v), "canonical"),
    (lambda v: PermutationCycleCodec(4, include_fixed_points=v), "include_fixed_points"),
    (lambda v: PermutationCycleCodec(4, strict=v), "strict"),
]


@pytest.mark.parametrize("make, flag", FLAGGED)
@pytest.mark.parametrize("bad", ["false", "no", 0, 1, None, 2.0])
def test_a_codec_flag_that_is_not_a_bool_is_refused_naming_it(make, flag, bad):
    with pytest.raises(TypeError, match=rf"{flag} must be True or False, got {bad!r}"):
        make(bad)


@pytest.mark.parametrize("make, flag", FLAGGED)
def test_a_codec_flag_takes_python_and_numpy_bools(make, flag):
    for value in (True, False, np.True_, np.False_):
        assert getattr(make(value), flag) is bool(value)


def test_integer_codec_reverse_false_writes_the_most_significant_digit_first():
    assert IntegerCodec(10, reverse=False).encode(-305) == ["-", "3", "0", "5"]  # the docs
    assert IntegerCodec(10, reverse=np.True_).encode(-305) == ["-", "5", "0", "3"]


def test_a_piece_with_a_character_outside_the_alphabet_is_refused():
    # "b" is no single-character piece: encode refuses "b", so "ab" could never be produced
    with pytest.raises(ValueError, match=r"piece 'ab' holds the character 'b'"):
        StochasticMergeTokenizer(["a", "ab"], p=1.0)
    with pytest.raises(ValueError, match=r"piece 'abc' holds the character 'c'"):
        StochasticMergeTokenizer(["a", "b", "ab", "abc"], p=1.0)
    tok = StochasticMergeTokenizer(["a", "b", "ab"], p=1.0)  # every piece reachable
    assert [tok.itos[i] for i in tok.encode("abab")] == ["ab", "ab"]


@pytest.mark.parametrize("seed", [-1, -3])
def test_a_negative_merge_seed_is_refused(seed):
    with pytest.raises(ValueError, match=rf"seed must be >= 0, got {seed}"):
        StochasticMergeTokenizer(["a", "b", "ab"], seed=seed)
    tok = StochasticMergeTokenizer(["a", "b", "ab"], seed=0)
    with pytest.raises(ValueError, match=rf"seed must be >= 0, got {seed}"):
        tok.reseed(seed)

