"""Token ids and tokenizer options are checked, not coerced: ``int(1.5)`` is 1, another token
(``<bos>``), so a float id decoded silently to a different sequence; a string of training
texts was read as one text per character; a per-call merge probability was not checked."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graded.encodings import (
    BPETokenizer,
    CharTokenizer,
    IntegerCodec,
    PermutationOneLineCodec,
    StochasticMergeTokenizer,
)

TEXTS = ["abcab", "abba", "cab cab"]


def tokenizers():
    return [CharTokenizer.from_texts(TEXTS),
            StochasticMergeTokenizer.from_texts(TEXTS, min_count=1),
            BPETokenizer.train(TEXTS, vocab_size=12, min_frequency=1)]


@pytest.mark.parametrize("bad", [1.5, 4.0, True, "4"])
def test_a_token_id_that_is_not_an_int_is_refused_naming_it_and_its_position(bad):
    codec = IntegerCodec()
    good = codec.encode_ids(-305)
    with pytest.raises(TypeError, match=rf"token id {bad!r} at position 1 is not an int"):
        codec.decode_ids([good[0], bad, *good[1:]])
    with pytest.raises(TypeError, match=rf"token id {bad!r} at position 1 is not an int"):
        codec.vocabulary().decode([good[0], bad])
    for tok in tokenizers():
        ids = tok.encode("ab")
        with pytest.raises(TypeError, match=rf"token id {bad!r} at position 1 is not an int"):
            tok.decode([ids[0], bad])


@pytest.mark.parametrize("single", [5, np.int64(5), torch.tensor(5)])
def test_one_id_not_in_a_sequence_is_refused_saying_to_wrap_it(single):
    # was Python's "'int' object is not iterable" (or "iteration over a 0-d tensor")
    codec = IntegerCodec()
    for decode in [codec.decode_ids, codec.vocabulary().decode,
                   *(tok.decode for tok in tokenizers())]:
        with pytest.raises(TypeError, match=r"token ids must be a sequence of ints, got the "
                                            r"single value .*wrap one id in a list"):
            decode(single)
    assert codec.vocabulary().decode(torch.tensor([5])) == codec.vocabulary().decode([5])


def test_integer_ids_of_any_integer_type_still_decode_to_the_object():
    codec = PermutationOneLineCodec(5)
    ids = codec.encode_ids((4, 5, 2, 3, 1))
    for same in (ids, np.array(ids), torch.tensor(ids), [np.int64(i) for i in ids]):
        assert codec.decode_ids(same) == (4, 5, 2, 3, 1)
    for tok in tokenizers():
        assert tok.decode(torch.tensor(tok.encode("cab ab"))) == "cab ab"
    with pytest.raises(TypeError, match="token ids must be a sequence of ints"):
        tokenizers()[0].decode("ab")


@pytest.mark.parametrize("p", [-1, 1.5, math.nan, "0.5"])
def test_a_per_call_merge_probability_is_checked_like_the_constructors(p):
    merge = StochasticMergeTokenizer.from_texts(TEXTS, min_count=1)
    with pytest.raises((TypeError, ValueError), match="merge probability p"):
        merge.encode("abcab", p=p)
    with pytest.raises((TypeError, ValueError), match="merge probability p"):
        StochasticMergeTokenizer(["a", "b", "ab"], p=p)


@pytest.mark.parametrize("options, pattern", [
    ({"max_piece_length": 0}, r"max_piece_length must be >= 1, got 0"),
    ({"min_count": 0}, r"min_count must be >= 1, got 0"),
    ({"max_pieces": -1}, r"max_pieces must be >= 0, got -1"),
    ({"max_pieces": 2.5}, r"max_pieces must be an int, got 2\.5"),
])
def test_stochastic_merge_training_options_are_checked_naming_them(options, pattern):
    with pytest.raises((TypeError, ValueError), match=pattern):
        StochasticMergeTokenizer.from_texts(TEXTS, **options)


def test_a_single_string_of_texts_is_refused_not_read_one_text_per_character():
    with pytest.raises(TypeError, match="texts must be an iterable of strings, got the string"):
        BPETokenizer.train("abcab abba", vocab_size=20)
    with pytest.raises(TypeError, match="texts must be an iterable of strings, got the string"):
        StochasticMergeTokenizer.from_texts("abcab abba")
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int 3"):
        BPETokenizer.train(["ab", 3], vocab_size=20)


def test_a_fractional_bpe_vocab_size_is_refused_naming_its_type():
    with pytest.raises(TypeError, match=r"vocab_size must be an int, got 20\.5"):
        BPETokenizer.train(TEXTS, vocab_size=20.5)


@pytest.mark.parametrize("codec_class", ["SubsetIndicatorCodec", "SubsetListCodec"])
def test_a_subset_given_with_a_repeated_element_is_refused_and_a_set_encodes_as_its_sorted_list(
        codec_class):
    import graded.encodings as enc

    codec = getattr(enc, codec_class)(8)
    with pytest.raises(ValueError, match=r"a subset holds each element once, got 5 2 times"):
        codec.encode([3, 5, 8, 5])  # a multiset, not a subset: it used to encode as {3, 5, 8}
    assert codec.decode(codec.encode([8, 3, 5])) == frozenset({3, 5, 8})
