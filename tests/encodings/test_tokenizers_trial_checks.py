"""Bad special tokens and bad saved files are refused with a message naming them, and a
vocabulary holding a lone surrogate saves and loads."""

from __future__ import annotations

import json

import pytest

from graded.encodings import (
    BPETokenizer,
    CharTokenizer,
    StochasticMergeTokenizer,
    load_tokenizer,
)

TEXTS = ["abab", "ba"]
BUILDERS = {
    "char": lambda specials: CharTokenizer.from_texts(TEXTS, specials=specials),
    "merge": lambda specials: StochasticMergeTokenizer.from_texts(TEXTS, specials=specials),
    "bpe": lambda specials: BPETokenizer.train(TEXTS, vocab_size=12, specials=specials),
}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_specials_given_as_one_string_are_refused_not_split_into_characters(kind):
    # "<p>" was taken for the three specials "<", "p", ">" (merge, BPE without a word; the
    # character tokenizer said "token 'a' appears twice" for "<pad>")
    with pytest.raises(TypeError, match=r"specials must be an iterable of strings, got the "
                                        r"string '<p>'"):
        BUILDERS[kind]("<p>")


@pytest.mark.parametrize("kind", sorted(BUILDERS))
@pytest.mark.parametrize(("specials", "error", "message"), [
    (("<pad>", "<pad>"), ValueError, r"'<pad>' appears twice"),
    (("<pad>", ""), ValueError, r"specials\[1\] is the empty string"),
    (("<pad>", 0), TypeError, r"specials\[1\] must be a str, got int 0"),
    (None, TypeError, r"specials must be an iterable of strings, got NoneType None"),
])
def test_duplicate_empty_or_non_string_specials_are_refused_naming_them(kind, specials, error,
                                                                         message):
    with pytest.raises(error, match=message):
        BUILDERS[kind](specials)


def test_bpe_refuses_a_special_that_is_a_character_of_the_texts():
    # the special "a" took the id of the character "a": "a" and "ba" could not be encoded
    with pytest.raises(ValueError, match=r"special token 'a' is a character of the texts"):
        BPETokenizer.train(TEXTS, vocab_size=12, specials=("<pad>", "a"))


def test_bpe_refuses_unk_among_the_specials():
    with pytest.raises(ValueError, match=r"hold '<unk>', which BPE adds itself"):
        BPETokenizer.train(TEXTS, vocab_size=12, specials=("<pad>", "<unk>"))


def test_a_bpe_tokenizer_with_distinct_specials_encodes_every_character():
    tok = BPETokenizer.train(TEXTS, vocab_size=12, specials=("[P]", "[B]"))
    for text in ("a", "b", "ba", "abab"):
        ids = tok.encode(text)
        assert tok.decode(ids) == text and min(ids) >= 2


@pytest.mark.parametrize(("content", "message"), [
    ([1, 2], r"a saved tokenizer is a JSON object, got a JSON list"),
    ({"type": "char", "specials": ["<pad>"]},
     r"a saved 'char' tokenizer needs the field 'alphabet'; the file has \['specials'\]"),
    ({"type": "stochastic_merge", "specials": [], "pieces": ["a"], "p": 0.5},
     r"a saved 'stochastic_merge' tokenizer needs the field 'seed'"),
    ({"type": ["char"], "alphabet": "ab"}, r"unknown tokenizer type \['char'\]"),
])
def test_load_tokenizer_names_the_file_and_what_it_lacks(tmp_path, content, message):
    # a KeyError naming the field alone; for a list "pop expected at most 1 argument"; for a
    # list type "unhashable type"
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(content), encoding="utf-8")
    with pytest.raises(ValueError, match=message) as err:
        load_tokenizer(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("build", [CharTokenizer.from_texts,
                                   lambda texts: StochasticMergeTokenizer.from_texts(
                                       texts, min_count=1)])
def test_a_vocabulary_with_a_lone_surrogate_saves_and_loads(tmp_path, build):
    # json.dumps(ensure_ascii=False) kept the surrogate, which UTF-8 cannot write:
    # UnicodeEncodeError on save, for a tokenizer that encodes such a text
    text = "a\ud800b\ud800"
    tok = build([text])
    tok.save(tmp_path / "tok.json")
    loaded = load_tokenizer(tmp_path / "tok.json")
    assert loaded.itos == tok.itos
    assert loaded.decode(loaded.encode(text)) == text


def test_a_saved_vocabulary_keeps_non_ascii_characters_readable(tmp_path):
    CharTokenizer.from_texts(["aé"]).save(tmp_path / "tok.json")
    assert '"é"' in (tmp_path / "tok.json").read_text(encoding="utf-8")
