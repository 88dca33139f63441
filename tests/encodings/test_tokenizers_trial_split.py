"""The tokenizers split into modules (interface, stochastic merge, BPE): every public name is
still given by ``graded.encodings.tokenizers`` and ``graded.encodings`` as the same object, and
a tokenizer pickled under the old module name still loads."""

from __future__ import annotations

import pickle

import pytest

import graded.encodings
from graded.encodings import bpe, merge_tokenizer, tokenizer_base, tokenizers

MOVED = {
    "StringTokenizer": tokenizer_base,
    "StochasticMergeTokenizer": merge_tokenizer,
    "BPETokenizer": bpe,
}


@pytest.mark.parametrize("name", sorted(MOVED))
def test_the_old_module_and_the_package_give_the_moved_class(name):
    cls = getattr(MOVED[name], name)
    assert cls.__module__ == MOVED[name].__name__
    assert getattr(tokenizers, name) is cls
    assert getattr(graded.encodings, name) is cls
    assert name in tokenizers.__all__


def test_a_tokenizer_pickled_under_the_old_module_name_loads_and_segments_alike():
    tok = merge_tokenizer.StochasticMergeTokenizer(["a", "b", "ab", "aba"], p=0.5, seed=4)
    data = pickle.dumps(tok, protocol=0)  # text protocol: the class is named in plain text
    assert b"graded.encodings.merge_tokenizer" in data
    old = pickle.loads(data.replace(b"graded.encodings.merge_tokenizer",
                                    b"graded.encodings.tokenizers"))
    assert type(old) is merge_tokenizer.StochasticMergeTokenizer
    assert [old.encode("abababab") for _ in range(3)] == [tok.encode("abababab")
                                                          for _ in range(3)]


def test_string_tokenizer_load_reads_every_kind_through_the_registry(tmp_path):
    char = tokenizers.CharTokenizer("ab")
    char.save(tmp_path / "char.json")
    loaded = tokenizer_base.StringTokenizer.load(tmp_path / "char.json")
    assert type(loaded) is tokenizers.CharTokenizer and loaded.encode("ba") == [4, 3]
    with pytest.raises(ValueError, match="holds a CharTokenizer, not a BPETokenizer"):
        bpe.BPETokenizer.load(tmp_path / "char.json")
