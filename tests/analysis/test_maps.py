"""Attention maps, entropy and rollout against independent computations."""

from __future__ import annotations

import math

import pytest
import torch
from analysis_helpers import is_png, tiny_config

from graded import Seq2SeqTransformer, TransformerClassifier, TransformerLM
from graded.analysis import (
    attention_entropy,
    attention_maps,
    attention_rollout,
    capture_attention,
    plot_attention_maps,
)


def test_entropy_of_uniform_rows_is_log_n_and_of_one_hot_rows_is_zero():
    n = 5
    uniform = torch.full((2, 3, n), 1.0 / n)
    one_hot = torch.eye(n).expand(2, n, n)
    assert torch.allclose(attention_entropy(uniform), torch.full((2, 3), math.log(n)))
    assert torch.equal(attention_entropy(one_hot), torch.zeros(2, n))


def test_entropy_matches_a_python_loop():
    w = torch.softmax(torch.randn(2, 3, 4, 6, generator=torch.Generator().manual_seed(1)), -1)
    w[0, 0, 0] = torch.tensor([0.5, 0.5, 0, 0, 0, 0])  # zeros count as 0·ln 0 = 0
    got = attention_entropy(w)
    for idx in torch.cartesian_prod(torch.arange(2), torch.arange(3), torch.arange(4)):
        row = w[tuple(idx)].tolist()
        want = -sum(p * math.log(p) for p in row if p > 0)
        assert got[tuple(idx)].item() == pytest.approx(want, abs=1e-6)


def test_entropy_rejects_negative_weights():
    with pytest.raises(ValueError, match=r"attention weights must be finite and >= 0, got "
                                         r"values in \[-0\.1"):
        attention_entropy(torch.tensor([[0.5, -0.1, 0.6]]))


def _rollout_by_hand(layers, residual=True):
    """Abnar & Zuidema (2020): per layer, head mean, (A + I)/2, then the product, by loops."""
    b, t = layers[0].shape[0], layers[0].shape[-1]
    out = []
    for s in range(b):
        r = [[float(i == j) for j in range(t)] for i in range(t)]
        for w in layers:
            a = w[s].mean(0).tolist()
            if residual:
                a = [[0.5 * a[i][j] + 0.5 * (i == j) for j in range(t)] for i in range(t)]
                a = [[v / sum(row) for v in row] for row in a]
            r = [[sum(a[i][m] * r[m][j] for m in range(t)) for j in range(t)] for i in range(t)]
        out.append(r)
    return torch.tensor(out, dtype=layers[0].dtype)


@pytest.mark.parametrize("residual", [True, False])
def test_rollout_equals_the_manual_matrix_product(residual):
    g = torch.Generator().manual_seed(2)
    layers = [torch.softmax(torch.randn(2, 3, 5, 5, generator=g), -1) for _ in range(3)]
    got = attention_rollout(layers, residual=residual)
    assert torch.allclose(got, _rollout_by_hand(layers, residual), atol=1e-6)
    assert torch.allclose(got.sum(-1), torch.ones(2, 5), atol=1e-6)  # rows stay stochastic


def test_rollout_of_identity_attention_is_identity():
    eye = torch.eye(4).expand(1, 2, 4, 4)
    assert torch.allclose(attention_rollout([eye, eye]), torch.eye(4).expand(1, 4, 4))


def test_rollout_rejects_unknown_head_fusion():
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout([torch.eye(3).expand(1, 1, 3, 3)], head_fusion="median")


@pytest.mark.parametrize("grading", [None, "linear", "exponential"])
def test_captured_maps_equal_the_models_own_weights(grading, tokens):
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading=grading, grade_init="constant",
                                      grade_init_value=0.5))
    model.eval()
    _, want = model(tokens, need_weights=True)
    got = attention_maps(model, tokens)
    assert list(got) == [f"decoder.stack.blocks.{i}.self_attn.attn" for i in range(2)]
    for g, w in zip(got.values(), want):
        assert g.shape == (3, 2, 7, 7)
        assert torch.allclose(g, w, atol=1e-6)
        assert torch.equal(g.triu(1), torch.zeros_like(g))  # causal


def test_maps_of_a_feature_classifier_with_padding(tokens):
    torch.manual_seed(0)
    model = TransformerClassifier(tiny_config(vocab_size=None, input_dim=3), num_outputs=2)
    x = torch.randn(2, 5, 3)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    maps = attention_maps(model, x, key_padding_mask=pad)
    for w in maps.values():
        assert torch.equal(w[1, :, :, 3:], torch.zeros(2, 5, 2))  # padded keys get no mass
        assert torch.allclose(w.sum(-1), torch.ones(2, 2, 5), atol=1e-6)


def test_plot_attention_maps_writes_a_png(tmp_path, egt_lm, tokens):
    path = plot_attention_maps(attention_maps(egt_lm, tokens), tmp_path, sample=1)
    assert path == tmp_path / "attention_maps.png" and is_png(path)
    with pytest.raises(ValueError, match="sample=5"):
        plot_attention_maps(attention_maps(egt_lm, tokens), tmp_path, sample=5)


def test_seq2seq_maps_include_encoder_decoder_and_cross_attention():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(grading="linear", grade_init="constant",
                                           grade_init_value=0.3, n_layers=1))
    src = torch.randint(0, 11, (2, 5))
    tgt = torch.randint(0, 11, (2, 4))
    maps = attention_maps(model, (src, tgt))
    shapes = {name.split(".")[0] + ("/cross" if "cross" in name else ""): tuple(w.shape)
              for name, w in maps.items()}
    assert shapes == {"encoder": (2, 2, 5, 5), "decoder": (2, 2, 4, 4),
                      "decoder/cross": (2, 2, 4, 5)}


PATTERNS = {  # backend options, and the keys query i may see (before causality), by hand
    "sliding_window": ({"window": 2}, lambda i, j: abs(i - j) <= 2),
    "dilated": ({"dilation": 2}, lambda i, j: (i - j) % 2 == 0),
    "sparse_fixed": ({"block": 3, "summary": 1}, lambda i, j: i // 3 == j // 3 or j % 3 == 2),
    "bigbird": ({"block_size": 2, "num_global_blocks": 1, "num_random_blocks": 0},
                lambda i, j: i // 2 == 0 or j // 2 == 0 or abs(i // 2 - j // 2) <= 1),
    "block_sparse": ({"layout": [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 1, 1]],
                      "block_size": 2}, None),
}


def _block_sparse_keep(i, j):
    layout = PATTERNS["block_sparse"][0]["layout"]
    return bool(layout[i // 2][j // 2])


@pytest.mark.parametrize("backend", sorted(PATTERNS))
def test_attention_maps_of_a_pattern_backend_are_the_weights_of_the_attention_it_computes(
    backend, tokens
):
    """A backend that returns no weights used to make every map-based diagnostic raise
    ("pass need_weights=False"). Now its maps are the softmax over its pattern, computed
    beside the backend, which still computes the model's output."""
    options, rule = PATTERNS[backend]
    rule = rule or _block_sparse_keep
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                      grade_init_value=0.2, grades_per_head=True,
                                      attn_backend=backend, attn_backend_options=options))
    model.eval()
    with torch.no_grad():
        plain = model(tokens)
    with torch.no_grad(), capture_attention(model) as calls:
        captured = model(tokens)
    torch.testing.assert_close(captured, plain)  # the capture changes no layer's output
    maps = attention_maps(model, tokens)
    assert len(maps) == 2
    t = tokens.shape[1]
    for call, w in zip(calls, maps.values(), strict=True):
        torch.testing.assert_close(w, call.weights)
        for i in range(t):  # zero outside the pattern and the causal mask, rows sum to 1
            for j in range(t):
                if j > i or not rule(i, j):
                    assert torch.all(w[:, :, i, j] == 0), (backend, i, j)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        # the backend's own output is these weights applied to the graded values
        _, _, v = call.module.transform_heads(call.q, call.k, call.v)
        torch.testing.assert_close(w @ v, call.heads, rtol=1e-5, atol=1e-6)


def test_attention_maps_of_an_approximate_backend_are_the_exact_softmax_of_its_q_and_k(
    tokens
):
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(attn_backend="performer",
                                      attn_backend_options={"num_features": 8, "seed": 0}))
    model.eval()
    with torch.no_grad(), capture_attention(model) as calls:
        captured = model(tokens)
    with torch.no_grad():
        torch.testing.assert_close(captured, model(tokens))  # the backend's own output
    maps = attention_maps(model, tokens)
    t, call_dim = tokens.shape[1], calls[0].q.shape[-1]
    for call, w in zip(calls, maps.values(), strict=True):
        for b in range(tokens.shape[0]):
            for h in range(call.q.shape[1]):
                for i in range(t):
                    s = [float(call.q[b, h, i] @ call.k[b, h, j]) / math.sqrt(call_dim)
                         for j in range(i + 1)]
                    z = sum(math.exp(x) for x in s)
                    want = [math.exp(x) / z for x in s] + [0.0] * (t - i - 1)
                    assert w[b, h, i].tolist() == pytest.approx(want, abs=1e-5)


def test_a_pattern_backend_call_keeps_only_its_pattern_for_the_rank_diagnostics(tokens):
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(attn_backend="sliding_window",
                                      attn_backend_options={"window": 1}))
    with torch.no_grad(), capture_attention(model, need_weights=False) as calls:
        model(tokens)
    keep, bias = calls[0].keep_and_bias()
    t = tokens.shape[1]
    want = torch.tensor([[0 <= i - j <= 1 for j in range(t)] for i in range(t)])
    assert bias is None
    assert torch.equal(keep.broadcast_to(tokens.shape[0], 2, t, t),
                       want.expand(tokens.shape[0], 2, t, t))
