"""The fields of :class:`TransformerConfig` whose None follows another field (``d_ff``,
``n_kv_heads``, ``attn_dropout``, the bias switches, ``final_norm``): :meth:`resolved` gives
the value the model takes, and a config that leaves them None builds the model of one that
spells each out at the value it follows."""

from __future__ import annotations

import pytest
import torch

from graded import TransformerConfig
from graded.search.patternboost.model import model_settings
from graded.transformer import TransformerEncoder, TransformerLM
from graded.transformer.config import FOLLOWS

# settings of the fields followed; each follow-field None stands for a value read from these
BASES = [
    dict(d_model=16, n_heads=4, dropout=0.0, bias=True, norm_first=True),
    dict(d_model=8, n_heads=2, dropout=0.25, bias=False, norm_first=False),
]


def _spelled_out(base: dict) -> dict:
    """Each follow-field at the value its None stands for, as the class docstring says
    (written out here, not read from FOLLOWS)."""
    return {"d_ff": 4 * base["d_model"], "n_kv_heads": base["n_heads"],
            "attn_dropout": base["dropout"], "qkv_bias": base["bias"],
            "out_bias": base["bias"], "ffn_bias": base["bias"],
            "final_norm": base["norm_first"]}


def _config(**fields) -> TransformerConfig:
    return TransformerConfig(vocab_size=11, n_layers=1, max_len=8, **fields)


def test_follows_lists_the_fields_whose_none_follows_another():
    assert set(FOLLOWS) == set(_spelled_out(BASES[0]))
    for name in FOLLOWS:
        assert TransformerConfig.model_fields[name].default is None, name


@pytest.mark.parametrize("base", BASES, ids=["pre-norm-biased", "post-norm-unbiased"])
def test_left_out_resolves_to_the_value_followed(base):
    config = _config(**base)
    expected = _spelled_out(base)
    assert {name: config.resolved(name) for name in FOLLOWS} == expected
    assert {name: config.follows(name) for name in FOLLOWS} == expected
    assert config.ff_dim == 4 * base["d_model"]


@pytest.mark.parametrize("base", BASES, ids=["pre-norm-biased", "post-norm-unbiased"])
@pytest.mark.parametrize("model_class", [TransformerLM, TransformerEncoder])
def test_left_out_and_spelled_out_build_the_same_model(base, model_class):
    left_out = _config(**base)
    spelled = _config(**base, **_spelled_out(base))
    assert {name: spelled.resolved(name) for name in FOLLOWS} == {
        name: left_out.resolved(name) for name in FOLLOWS}
    models = []
    for config in (left_out, spelled):
        torch.manual_seed(0)
        models.append(model_class(config).eval())
    shapes = [{k: tuple(v.shape) for k, v in m.state_dict().items()} for m in models]
    assert shapes[0] == shapes[1]
    assert all(torch.equal(a, b) for a, b in zip(models[0].state_dict().values(),
                                                 models[1].state_dict().values(), strict=True))
    # the attention's dropout, which the state dict does not hold
    dropouts = [[a.dropout for a in m.modules() if hasattr(a, "num_kv_heads")] for m in models]
    assert dropouts[0] == dropouts[1] == [base["dropout"]]


def test_a_value_set_away_from_the_one_followed_is_what_the_model_takes():
    base = BASES[0]
    config = _config(**base, d_ff=24, n_kv_heads=2, attn_dropout=0.5, qkv_bias=False,
                     out_bias=False, ffn_bias=False, final_norm=False)
    assert {name: config.resolved(name) for name in FOLLOWS} == dict(
        d_ff=24, n_kv_heads=2, attn_dropout=0.5, qkv_bias=False, out_bias=False,
        ffn_bias=False, final_norm=False)
    state = TransformerLM(config).state_dict()
    block = "decoder.stack.blocks.0."
    assert tuple(state[f"{block}ff.ffn.fc_in.weight"].shape) == (24, 16)
    # 16 query rows, 2 key and 2 value heads of head_dim 4
    assert tuple(state[f"{block}self_attn.attn.in_proj_weight"].shape) == (16 + 2 * 2 * 4, 16)
    # no projection or FFN bias, no final norm: the norms' own biases only
    assert sorted(state) == sorted(
        ["decoder.embed.tokens.weight", "head.proj.weight"]
        + [f"{block}{name}" for name in (
            "self_attn.attn.in_proj_weight", "self_attn.attn.out_proj.weight",
            "ff.ffn.fc_in.weight", "ff.ffn.fc_out.weight", "res_attn.norm.weight",
            "res_attn.norm.bias", "res_ff.norm.weight", "res_ff.norm.bias")])


def test_resolved_refuses_a_field_that_follows_none():
    with pytest.raises(KeyError, match=r"TransformerConfig\.dropout follows no other field"):
        _config().resolved("dropout")


def test_patternboost_settings_turn_each_value_followed_back_into_none():
    options = dict(d_model=16, n_heads=4, n_layers=1, bias=True, dropout=0.0)
    spelled = model_settings(5, 6, {**options, **_spelled_out({**options, "norm_first": True})})
    assert spelled == model_settings(5, 6, options)
    assert all(spelled[name] is None for name in FOLLOWS)
    away = model_settings(5, 6, {**options, "d_ff": 32, "qkv_bias": False})
    assert (away["d_ff"], away["qkv_bias"], away["out_bias"]) == (32, False, None)
