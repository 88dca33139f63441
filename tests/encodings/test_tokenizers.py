"""Character, stochastic-merge (003 Remark 2.3) and BPE tokenizers round-trip and save/load."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.encodings import (
    BPETokenizer,
    CharTokenizer,
    DecodeError,
    StochasticMergeTokenizer,
    load_tokenizer,
)

CORPUS = ["0110100110010110" * 4, "naive naïve, 12+34=46\n", "(1, 4, 3, 2, 5)", "[(1,2), (1,5)]"]
ALPHABET = sorted({ch for text in CORPUS for ch in text})
texts = st.text(alphabet=ALPHABET, max_size=60)


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=60)


@pytest.fixture(scope="module")
def merge() -> StochasticMergeTokenizer:
    return StochasticMergeTokenizer.from_texts(CORPUS, max_pieces=30, p=0.5, seed=3)


def all_tokenizers(bpe, merge):
    return [CharTokenizer.from_texts(CORPUS), merge, bpe]


@settings(max_examples=60, deadline=None)
@given(texts)
def test_every_tokenizer_round_trips_any_text_over_its_alphabet(bpe, merge, text):
    for tok in all_tokenizers(bpe, merge):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert all(len(tok.specials) <= i < tok.vocab_size for i in ids)


def test_every_tokenizer_saves_and_loads_to_an_equal_tokenizer(bpe, merge, tmp_path):
    for k, tok in enumerate(all_tokenizers(bpe, merge)):
        path = tmp_path / f"tok{k}.json"
        tok.save(path)
        loaded = load_tokenizer(path)
        assert type(loaded) is type(tok)
        assert loaded.vocab_size == tok.vocab_size
        assert (loaded.pad_id, loaded.bos_id, loaded.eos_id) == (0, 1, 2)
        for text in CORPUS:
            assert loaded.encode(
                text, **({"rng": random.Random(0)} if k == 1 else {})
            ) == tok.encode(text, **({"rng": random.Random(0)} if k == 1 else {}))
        assert type(tok).load(path).decode(tok.encode(CORPUS[0])) == CORPUS[0]


def test_tokenizers_reject_characters_outside_the_alphabet_naming_them(bpe, merge):
    for tok in all_tokenizers(bpe, merge):
        with pytest.raises(ValueError, match="'Z' at position 1"):
            tok.encode("0Z")
        with pytest.raises(DecodeError, match="outside"):
            tok.decode([10**6])


def test_char_tokenizer_gives_one_id_per_character_in_sorted_alphabet_order():
    tok = CharTokenizer.from_texts(["naive"])
    assert tok.encode("naive") == [3 + sorted("naive").index(ch) for ch in "naive"]


def test_stochastic_merge_with_p_zero_is_the_character_segmentation(merge):
    chars = [merge.token_id(ch) for ch in CORPUS[2]]
    assert merge.encode(CORPUS[2], p=0.0) == chars


def test_stochastic_merge_with_p_one_is_greedy_left_to_right_longest_match(merge):
    text = CORPUS[0]
    pieces, i = [], 0
    while i < len(text):  # independent greedy longest-prefix segmentation
        j = max(k for k in range(i + 1, len(text) + 1) if text[i:k] in merge.stoi)
        pieces.append(text[i:j])
        i = j
    assert merge.encode(text, p=1.0) == [merge.token_id(p) for p in pieces]


def test_stochastic_merge_is_random_but_reproducible_from_its_seed(merge):
    text = CORPUS[0]
    segmentations = {tuple(merge.encode(text, rng=random.Random(s))) for s in range(20)}
    assert len(segmentations) > 1
    a = StochasticMergeTokenizer.from_texts(CORPUS, max_pieces=30, p=0.5, seed=11)
    b = StochasticMergeTokenizer.from_texts(CORPUS, max_pieces=30, p=0.5, seed=11)
    assert [a.encode(text) for _ in range(3)] == [b.encode(text) for _ in range(3)]


@pytest.mark.parametrize("seed", [1.9, "3", True])
def test_stochastic_merge_reseed_refuses_a_seed_that_is_not_an_int_naming_it(seed):
    # int() took 1.9 for the seed 1 and "3" for 3, which the constructor refuses
    tok = StochasticMergeTokenizer.from_texts(CORPUS, max_pieces=30, p=0.5, seed=3)
    with pytest.raises(TypeError, match=rf"seed must be an int, got {seed!r}"):
        tok.reseed(seed)
    assert tok.seed == 3


def test_stochastic_merge_reseeded_segments_as_a_tokenizer_built_with_that_seed():
    text = CORPUS[0]
    tok = StochasticMergeTokenizer.from_texts(CORPUS, max_pieces=30, p=0.5, seed=3)
    fresh = StochasticMergeTokenizer.from_texts(CORPUS, max_pieces=30, p=0.5, seed=5)
    tok.encode(text)  # advances the generator
    tok.reseed(5)
    assert [tok.encode(text) for _ in range(3)] == [fresh.encode(text) for _ in range(3)]


def test_stochastic_merge_mean_number_of_merges_matches_p():
    """Each eligible merge happens with probability p: on "aaaa..." with pieces {a, aa} a token
    is "aa" with probability p and "a" otherwise, so it covers 1 + p characters on average."""
    tok = StochasticMergeTokenizer(["a", "aa"], p=0.3, seed=0)
    text = "a" * 200
    mean_len = sum(len(tok.encode(text)) for _ in range(200)) / 200
    assert abs(mean_len - 200 / 1.3) < 3


def test_stochastic_merge_requires_prefix_closed_pieces():
    with pytest.raises(ValueError, match="prefix 'ab'"):
        StochasticMergeTokenizer(["a", "b", "c", "abc"])


def test_bpe_compresses_its_training_text(bpe):
    assert len(bpe.encode(CORPUS[0])) < len(CORPUS[0]) // 2


SPECIAL_CORPUS = ["x<pad>y<eos>", "<bos>ab<pad>", "<pad><pad>x", "a<eos>b<bos>"] * 3
special_texts = st.text(alphabet=sorted(set("".join(SPECIAL_CORPUS))), max_size=40)


@pytest.fixture(scope="module")
def special_tokenizers(tmp_path_factory):
    bpe = BPETokenizer.train(SPECIAL_CORPUS, vocab_size=40)
    path = tmp_path_factory.mktemp("tok") / "bpe.json"
    bpe.save(path)
    return [
        CharTokenizer.from_texts(SPECIAL_CORPUS),
        # pieces of length 5 could include "<pad>" itself; length 4 includes "<pad"
        StochasticMergeTokenizer.from_texts(SPECIAL_CORPUS, max_piece_length=5, p=1.0),
        StochasticMergeTokenizer.from_texts(SPECIAL_CORPUS, max_piece_length=4, p=1.0),
        bpe,
        load_tokenizer(path),
    ]


@settings(max_examples=40, deadline=None)
@given(special_texts)
def test_text_spelling_a_special_token_round_trips_and_never_encodes_to_a_special_id(
        special_tokenizers, text):
    for tok in special_tokenizers:
        ids = tok.encode(text + "<pad>")
        assert tok.decode(ids) == text + "<pad>"
        assert all(len(tok.specials) <= i < tok.vocab_size for i in ids)


def test_tokenizers_name_a_text_that_is_not_a_string(bpe, merge):
    for tok in all_tokenizers(bpe, merge):
        with pytest.raises(TypeError, match=r"a tokenizer encodes a str, got int 5"):
            tok.encode(5)


def test_bpe_names_a_vocab_size_too_small_for_its_specials_and_alphabet():
    least = 3 + 1 + len(ALPHABET)  # <pad> <bos> <eos>, <unk>, one token per character
    with pytest.raises(ValueError, match=rf"vocab_size={least - 1} cannot hold the 3 special "
                                         rf"tokens, <unk> and the {len(ALPHABET)} characters of "
                                         rf"the texts: it must be >= {least}"):
        BPETokenizer.train(CORPUS, vocab_size=least - 1)
    assert BPETokenizer.train(CORPUS, vocab_size=least).vocab_size == least
