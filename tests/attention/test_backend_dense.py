"""The `full` and `explicit` backends against a row-by-row softmax reference."""

import math

import pytest
import torch

from graded.attention.backends import get_backend
from graded.attention.scores import AdditiveScore, BilinearScore


def loop_attention(q, k, v, keep, scale):
    """Row-by-row softmax attention over the kept keys; rows with none give zeros."""
    b, h, t_q, _ = q.shape
    out = torch.zeros(b, h, t_q, v.shape[-1], dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            for i in range(t_q):
                idx = [j for j in range(k.shape[2]) if keep[bi][hi][i][j]]
                if not idx:
                    continue
                s = torch.stack([q[bi, hi, i] @ k[bi, hi, j] for j in idx]) * scale
                w = torch.softmax(s, dim=0)
                out[bi, hi, i] = sum(w[n] * v[bi, hi, j] for n, j in enumerate(idx))
    return out


def keep_lists(b, h, t_q, t_k, causal, pad=None, extra=None):
    keep = [[[[True] * t_k for _ in range(t_q)] for _ in range(h)] for _ in range(b)]
    for bi in range(b):
        for hi in range(h):
            for i in range(t_q):
                for j in range(t_k):
                    ok = True
                    if causal and j > i + (t_k - t_q):
                        ok = False
                    if pad is not None and pad[bi, j]:
                        ok = False
                    if extra is not None and not extra[i, j]:
                        ok = False
                    keep[bi][hi][i][j] = ok
    return keep


@pytest.fixture
def qkv():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 7, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 9, 3, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("name", ["full", "explicit"])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_backends_equal_row_loop_with_padding_and_masks(qkv, name, causal):
    q, k, v = qkv
    q = q * torch.tensor([0.3, 1.0, 1.7, 2.5], dtype=q.dtype)  # a graded query
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True
    extra = torch.rand(7, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    backend = get_backend(name)
    out = backend(q, k, v, key_padding_mask=pad, attn_mask=extra, is_causal=causal)
    ref = loop_attention(q, k, v, keep_lists(2, 2, 7, 9, causal, pad, extra), 0.5)
    torch.testing.assert_close(out, ref)


def test_full_backend_gives_zeros_for_queries_with_no_key(qkv):
    q, k, v = qkv
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0] = True
    out = get_backend("full")(q, k, v, key_padding_mask=pad)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.isfinite(out).all()


def test_explicit_weights_are_row_stochastic_and_stored(qkv):
    q, k, v = qkv
    backend = get_backend("explicit", scale=0.3)
    out, weights = backend.forward_with_weights(q, k, v, is_causal=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 7, dtype=q.dtype))
    assert (weights >= 0).all()
    torch.testing.assert_close(out, weights @ v)
    assert torch.equal(backend.last_weights, weights.detach())
    ref = loop_attention(q, k, v, keep_lists(2, 2, 7, 9, True), 0.3)
    torch.testing.assert_close(out, ref)


def test_explicit_refusal_names_the_bytes_needed():
    backend = get_backend("explicit", max_elements=1000)
    q = torch.zeros(2, 3, 20, 8)
    need = 2 * 2 * 3 * 20 * 20 * 4  # scores and weights, float32
    with pytest.raises(MemoryError, match=rf"{need} bytes"):
        backend(q, q, q)
    assert math.prod((2, 3, 20, 20)) > 1000


def test_dense_backends_reject_bad_inputs(qkv):
    q, k, v = qkv
    backend = get_backend("full")
    with pytest.raises(ValueError, match="full backend: q must have shape"):
        backend(q[0], k, v)
    with pytest.raises(ValueError, match="key_padding_mask"):
        backend(q, k, v, key_padding_mask=torch.zeros(2, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask must be a bool"):
        backend(q, k, v, attn_mask=torch.zeros(7, 9, dtype=torch.long))
    with pytest.raises(TypeError, match=r"one dtype, got torch\.float64, torch\.float32"):
        backend(q, k.float(), v)
    with pytest.raises(ValueError, match="dropout_p"):
        backend(q, k, v, dropout_p=1.5)


def biased_loop_attention(q, k, v, scores, bias, keep):
    """Row-by-row softmax(s_ij + bias_ij) over the kept keys j with finite bias; rows with
    none give zeros, and the weights beside the output."""
    b, h, t_q, t_k = scores.shape
    out = torch.zeros(b, h, t_q, v.shape[-1], dtype=q.dtype)
    weights = torch.zeros(b, h, t_q, t_k, dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            for i in range(t_q):
                idx = [j for j in range(t_k)
                       if keep[bi][hi][i][j] and bias[hi, i, j] > -math.inf]
                if not idx:
                    continue
                w = torch.softmax(torch.stack([scores[bi, hi, i, j] + bias[hi, i, j]
                                               for j in idx]), dim=0)
                out[bi, hi, i] = sum(w[n] * v[bi, hi, j] for n, j in enumerate(idx))
                weights[bi, hi, i, idx] = w
    return out, weights


@pytest.mark.parametrize("name", ["full", "explicit"])
@pytest.mark.parametrize("score_kind", [None, "bilinear", "additive"])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_backends_serve_the_bias_score_and_weights_they_declare(qkv, name, score_kind,
                                                                      causal):
    """A backend declaring attn_bias, custom_score and attention_weights takes a float
    attn_mask (added to the scores; -inf masks), ``score=`` and has forward_with_weights,
    when called directly as well as through a model."""
    q, k, v = qkv
    g = torch.Generator().manual_seed(2)
    bias = torch.randn(2, 7, 9, generator=g, dtype=q.dtype)  # per head, like ALiBi
    bias[1, 3] = -math.inf  # a query whose every key the bias masks
    bias[0, 2, :4] = -math.inf
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True
    score = None
    scores = q @ k.transpose(-2, -1) / 2.0
    if score_kind == "bilinear":
        score = BilinearScore(2, 4).double()
        with torch.no_grad():
            score.weight.copy_(torch.randn(2, 4, 4, generator=g, dtype=q.dtype))
        scores = torch.einsum("bhid,hde,bhje->bhij", q, score.weight, k)
    elif score_kind == "additive":
        score = AdditiveScore(4, 5).double()
        with torch.no_grad():  # vᵀ tanh(W_q q_i + W_k k_j), Bahdanau et al. 2015
            scores = torch.tensor([[[[score.v.weight[0] @ torch.tanh(
                score.query.weight @ q[b, h, i] + score.key.weight @ k[b, h, j])
                for j in range(9)] for i in range(7)] for h in range(2)] for b in range(2)],
                dtype=q.dtype)
    keep = keep_lists(2, 2, 7, 9, causal, pad)
    want, want_weights = biased_loop_attention(q, k, v, scores, bias, keep)
    backend = get_backend(name)
    kw = {"key_padding_mask": pad, "attn_mask": bias, "is_causal": causal, "score": score}
    torch.testing.assert_close(backend(q, k, v, **kw), want)
    out, weights = backend.forward_with_weights(q, k, v, **kw)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(weights, want_weights)


@pytest.mark.parametrize("name", ["full", "explicit", "chunked"])
@pytest.mark.parametrize("t_q", [0, 3])
def test_weights_of_a_call_without_keys_are_empty_and_the_output_zeros(name, t_q):
    """With no key (Tk = 0) every query has no admissible key: zeros, as the fused kernel
    gives; the materialised path raised "amax(): Expected reduction dim -1 to have non-zero
    size". The inputs still get (zero) gradients."""
    q = torch.randn(2, 2, t_q, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 0, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 0, 3, dtype=torch.float64, requires_grad=True)
    for causal in (False, True):
        out, weights = get_backend(name).forward_with_weights(q, k, v, is_causal=causal)
        assert torch.equal(out, torch.zeros(2, 2, t_q, 3, dtype=q.dtype))
        assert weights.shape == (2, 2, t_q, 0)
        out.sum().backward()
        assert torch.equal(q.grad, torch.zeros_like(q))
