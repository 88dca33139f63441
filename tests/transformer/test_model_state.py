"""Saving and loading whole models: a state dict loads strictly into a model of the same config
and gives the same outputs; a state dict whose tied weights differ is refused, not loaded into
one of them."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM

CONFIG = dict(vocab_size=11, d_model=8, n_heads=2, n_layers=1, max_len=8)


def test_a_tied_lm_round_trips_through_its_state_dict_deepcopy_and_pickle():
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(**CONFIG)).eval()
    ids = torch.randint(0, 11, (2, 5))
    expected = model(ids)
    loaded = TransformerLM(TransformerConfig(**CONFIG)).eval()
    loaded.load_state_dict(model.state_dict(), strict=True)
    for other in (loaded, copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert other.head.proj.weight is other.decoder.embed.tokens.weight
        torch.testing.assert_close(other(ids), expected, rtol=0, atol=0)


def test_an_untied_state_dict_is_refused_by_a_tied_lm_naming_the_keys():
    # before: strict loading succeeded and the embedding silently became the output layer
    torch.manual_seed(0)
    untied = TransformerLM(TransformerConfig(**CONFIG, tie_embeddings=False))
    tied = TransformerLM(TransformerConfig(**CONFIG))
    with pytest.raises(RuntimeError, match=r"head\.proj\.weight differs from "
                                           r"decoder\.embed\.tokens\.weight.*tie_embeddings"):
        tied.load_state_dict(untied.state_dict(), strict=True)
    # the same state dict loads into the untied model of that config, every weight as saved
    again = TransformerLM(TransformerConfig(**CONFIG, tie_embeddings=False))
    again.load_state_dict(untied.state_dict(), strict=True)
    for key, value in untied.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_an_untied_state_dict_is_refused_by_a_tied_seq2seq_model():
    torch.manual_seed(0)
    untied = Seq2SeqTransformer(TransformerConfig(**CONFIG, tie_embeddings=False))
    tied = Seq2SeqTransformer(TransformerConfig(**CONFIG))
    state = untied.state_dict()
    with pytest.raises(RuntimeError, match=r"embed\.tokens\.weight differs from "
                                           r"encoder\.embed\.tokens\.weight"):
        tied.load_state_dict(state, strict=True)
    # a tied state dict loads, under a prefix too (the model inside another module)
    holder = torch.nn.ModuleDict({"inner": Seq2SeqTransformer(TransformerConfig(**CONFIG))})
    saved = torch.nn.ModuleDict({"inner": tied}).state_dict()
    holder.load_state_dict(saved, strict=True)
    src, tgt = torch.randint(0, 11, (2, 4)), torch.randint(0, 11, (2, 3))
    torch.testing.assert_close(holder["inner"].eval()(src, tgt), tied.eval()(src, tgt),
                               rtol=0, atol=0)


def test_a_state_dict_loads_into_a_tied_model_of_another_dtype():
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(**CONFIG)).eval()
    ids = torch.randint(0, 11, (2, 5))
    wide = TransformerLM(TransformerConfig(**CONFIG)).to(torch.float64).eval()
    wide.load_state_dict(model.state_dict(), strict=True)
    assert wide.head.proj.weight is wide.decoder.embed.tokens.weight
    out = wide(ids)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.float(), model(ids), rtol=1e-5, atol=1e-5)
