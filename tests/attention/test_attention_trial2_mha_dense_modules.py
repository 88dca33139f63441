"""A dense backend module (`explicit`, `full`) inside MultiheadAttention computes the call itself
when the weights are asked for, as it does with need_weights=False: its `max_elements`,
`last_weights` and float32 arithmetic for half precision hold at torch's default
need_weights=True too."""

import math

import pytest
import torch

from graded.attention import MultiheadAttention
from graded.attention.backends import get_backend

E, H, B, T = 8, 2, 2, 5


def written_out_weights(module, x, pad):
    """Float64 softmax(q kᵀ/√d) of the module's per-head queries and keys, written out;
    padded keys get no weight."""
    q, k, _ = (t.detach().double() for t in module.project(x, x, x))
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1)


def make(backend, dtype=torch.float64):
    torch.manual_seed(0)
    module = MultiheadAttention(E, H, batch_first=True, backend=backend).to(dtype)
    x = torch.randn(B, T, E, dtype=dtype)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, 3:] = True
    return module, x, pad


def test_explicit_module_keeps_the_weights_of_a_need_weights_call():
    backend = get_backend("explicit")
    module, x, pad = make(backend)
    _, averaged = module(x, x, x, key_padding_mask=pad)  # torch's default need_weights=True
    expected = written_out_weights(module, x, pad)
    assert backend.last_weights is not None
    torch.testing.assert_close(backend.last_weights, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(averaged, expected.mean(dim=1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("need_weights", [False, True])
def test_explicit_module_max_elements_refuses_whether_or_not_weights_are_asked(need_weights):
    module, x, pad = make(get_backend("explicit", max_elements=B * H * T * T - 1))
    with pytest.raises(MemoryError, match=f"{B * H * T * T} elements > max_elements"):
        module(x, x, x, key_padding_mask=pad, need_weights=need_weights)


def test_half_precision_explicit_module_computes_the_same_with_or_without_weights():
    module, x, pad = make(get_backend("explicit", scale=None), torch.bfloat16)
    out_weights, _ = module(x, x, x, key_padding_mask=pad)
    out_plain, _ = module(x, x, x, key_padding_mask=pad, need_weights=False)
    torch.testing.assert_close(out_weights, out_plain, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["explicit", "full"])
def test_half_precision_dense_module_weights_are_the_float32_softmax_rounded(name):
    module, x, pad = make(get_backend(name, scale=None), torch.bfloat16)
    _, weights = module(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    assert weights.dtype == torch.bfloat16
    expected = written_out_weights(module, x, pad)  # float64 on the same bfloat16 heads
    # float32 weights rounded once to bfloat16 are within half an ulp: 2^-8 relative (its
    # 7-bit fraction); scores and softmax in bfloat16 were off by up to 0.0056 here
    err = (weights.double() - expected).abs() / expected.clamp_min(2**-30)
    assert err.max() <= 2**-8 * 1.01


@pytest.mark.parametrize("name", ["explicit", "full"])
@pytest.mark.parametrize("score", ["scaled_dot", "dot", "additive"])
def test_half_precision_plain_named_backend_weights_are_the_float32_softmax_rounded(name, score):
    # backend="explicit" by plain name (and "full" asked for weights) went through
    # functional.attention's weights path, which formed bfloat16 scores, softmax and sum in
    # bfloat16 (weights off by up to ~0.0056); the additive score's weights path likewise
    torch.manual_seed(0)
    module = MultiheadAttention(E, H, batch_first=True, backend=name, score=score).to(
        torch.bfloat16)
    x = torch.randn(B, T, E, dtype=torch.bfloat16)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, 3:] = True
    out, weights = module(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    assert weights.dtype == out.dtype == torch.bfloat16
    q, k, _ = (t.detach() for t in module.project(x, x, x))
    if score == "additive":  # the score module runs on the bfloat16 heads, as given
        scores = module.score(q, k).detach().double()
    else:
        scores = torch.einsum("bhid,bhjd->bhij", q.double(), k.double())
        scores = scores / math.sqrt(q.shape[-1]) if score == "scaled_dot" else scores
    expected = torch.softmax(scores.masked_fill(pad[:, None, None, :], float("-inf")), dim=-1)
    err = (weights.double() - expected).abs() / expected.clamp_min(2**-30)
    assert err.max() <= 2**-8 * 1.01  # half an ulp of bfloat16: rounded once from float32
