"""One naming rule for attention calls (graded.analysis.call_keys), shared by every diagnostic
that reports per call, so that their results join on the keys."""

from __future__ import annotations

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import (
    attention_maps,
    attention_modules,
    attention_rank,
    call_keys,
    capture_attention,
    early_attention_mass,
    head_diversity,
    positional_bias_sweep,
)
from graded.analysis.capture import AttentionCall

BLOCKS = "decoder.stack.blocks"


def _shared_block_lm(order: list[int], **changes: object) -> TransformerLM:
    """A TransformerLM whose block i is block ``order[i]``: a block listed twice runs twice."""
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(n_layers=len(order), **changes))
    blocks = model.decoder.stack.blocks
    own = list(blocks)
    for i, j in enumerate(order):
        blocks[i] = own[j]
    return model


def _named_calls(names: list[str]) -> list[AttentionCall]:
    return [AttentionCall(name, None, *([None] * 3), None, None, False, None, None)
            for name in names]


def test_call_keys_number_each_modules_later_calls_from_one():
    names = ["a", "b", "a", "b", "a", "c"]
    assert call_keys(_named_calls(names)) == ["a", "b", "a#1", "b#1", "a#2", "c"]
    # a module whose own name has the form "name#n" is not shadowed
    assert call_keys(_named_calls(["a", "a#1", "a"])) == ["a", "a#1", "a#2"]


def test_single_calls_are_keyed_by_the_plain_module_names(tokens):
    model = TransformerLM(tiny_config(n_layers=3, grading="exponential"))
    names = list(attention_modules(model))
    assert list(attention_maps(model, tokens)) == names
    assert list(head_diversity(model, tokens)) == names
    assert list(attention_rank(model, tokens)) == names


@pytest.mark.parametrize("order", [[0, 1, 0], [0, 1, 0, 1], [0, 0, 0]])
def test_maps_heads_and_rank_key_repeated_calls_alike(order, tokens):
    model = _shared_block_lm(order, grading="exponential", grade_init="warm_start",
                             grade_init_value=0.2)
    with capture_attention(model) as calls:
        model(tokens)
    seen: dict[int, int] = {}
    expected = []
    for j in order:
        name = f"{BLOCKS}.{j}.self_attn.attn"
        expected.append(name if j not in seen else f"{name}#{seen[j]}")
        seen[j] = seen.get(j, 0) + 1
    assert [c.name for c in calls] == [f"{BLOCKS}.{j}.self_attn.attn" for j in order]
    maps = attention_maps(model, tokens)
    assert list(maps) == expected
    assert list(head_diversity(model, tokens)) == expected
    assert list(attention_rank(model, tokens)) == expected
    # the keys name the same calls: each key's weights are that call's
    for key, call in zip(expected, calls, strict=True):
        torch.testing.assert_close(maps[key], call.weights)


def test_positional_sweep_keeps_one_value_per_alpha_for_a_repeated_call(tokens):
    model = _shared_block_lm([0, 1, 0], grading="exponential", grade_init="constant",
                             grade_init_value=0.3)
    alphas = [0.0, 0.2, 0.5]
    sweep = positional_bias_sweep(model, tokens, alphas, k=2)
    assert list(sweep["layers"]) == list(attention_maps(model, tokens))
    assert all(len(v) == len(alphas) for v in sweep["layers"].values())
    for key, w in attention_maps(model, tokens).items():  # the model's own α is 0
        assert sweep["layers"][key][0] == pytest.approx(early_attention_mass(w, 2), abs=1e-6)


def test_plot_labels_keep_the_call_number_and_stay_distinct():
    from graded.analysis._common import short_names

    keys = [f"{BLOCKS}.0.self_attn.attn", f"{BLOCKS}.1.self_attn.attn",
            f"{BLOCKS}.0.self_attn.attn#1"]
    assert short_names(keys) == ["blocks.0.self_attn", "blocks.1.self_attn",
                                 "blocks.0.self_attn#1"]
    # an encoder's and a decoder's block 0 would both read "blocks.0.self_attn"
    seq2seq = ["encoder.stack.blocks.0.self_attn.attn", "decoder.stack.blocks.0.self_attn.attn",
               "decoder.stack.blocks.0.cross_attn.attn"]
    assert short_names(seq2seq) == [*seq2seq[:2], "blocks.0.cross_attn"]
