"""The switches of the attention functions and backends (``is_causal``, ``need_weights``, and
``causal``, ``split_heads``, ``ignore_dropout``, ``orthogonal``, ``scaled`` of the public
helpers) take True or False only, as :class:`MultiheadAttention`'s do: read truthily,
``is_causal="false"`` would mask the future and ``need_weights="no"`` materialise the weights.
A bool (a NumPy one too) computes what it always computed: plain softmax attention written out
(torch's ``scaled_dot_product_attention``, or the kernel and LSH rules pair by pair), also
under ``torch.compile`` without a graph break."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from backend_options import OPTIONS as EXACT  # tests/ is on the path (conftest.py)
from backend_options import T
from graded.attention.backends import available_backends, get_backend
from graded.attention.backends.blockwise import gathered_block_attention
from graded.attention.backends.chunked import chunked_attention, fusable, fused_attention
from graded.attention.backends.dense import dense_attention_weights, dense_keep_mask
from graded.attention.backends.fixed import fixed_pattern_attention
from graded.attention.backends.flex import pattern_block_mask
from graded.attention.backends.linear import check_dropout, kernel_attention
from graded.attention.backends.local import sliding_window_attention
from graded.attention.backends.performer import draw_random_features
from graded.attention.functional import attention
from graded.attention.scores import BilinearScore

BAD = ["no", 1, 0, None, torch.tensor(True)]
OPTIONS = {**EXACT, "lsh": {**EXACT["lsh"], "seed": 0}}
SOFTMAX = ["full", "explicit", "chunked", "sliding_window", "dilated", "sparse_fixed",
           "block_sparse", "bigbird"]  # exact softmax attention with these options


def _qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, T, 4, generator=g, dtype=torch.float64) for _ in range(3))


def _backend(name: str) -> torch.nn.Module:
    torch.manual_seed(0)  # linformer's projections
    return get_backend(name, **OPTIONS[name]).double().eval()


def _message(where: str, value: object) -> str:
    return (rf"^{where} must be True or False, got {re.escape(repr(value))} "
            rf"\({type(value).__name__}\)$")


def test_every_registered_backend_is_covered():
    assert sorted(OPTIONS) == available_backends()


# -- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("switch", ["is_causal", "need_weights"])
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_attention_refuses_a_switch_that_is_not_a_bool(switch, value):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=_message(f"attention: {switch}", value)):
        attention(q, k, v, **{switch: value})


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_every_backend_refuses_an_is_causal_that_is_not_a_bool(name, value):
    backend = _backend(name)
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=_message(f"{name} backend: is_causal", value)):
        backend(q, k, v, is_causal=value)


@pytest.mark.parametrize("name", ["full", "explicit", "chunked"])
def test_forward_with_weights_refuses_an_is_causal_that_is_not_a_bool(name):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=_message(f"{name} backend: is_causal", "no")):
        _backend(name).forward_with_weights(q, k, v, is_causal="no")


def _dropout_refused(ignore_dropout) -> bool:
    """Whether kernel attention refuses dropout 0.1 (ValueError) with this ``ignore_dropout``."""
    try:
        check_dropout("linear", 0.1, ignore_dropout)
    except ValueError:
        return True
    return False


def _calls():
    """(where the message says it is, call taking the switch's value) of every public helper
    with a bool argument."""
    q, k, v = _qkv()
    phi = F.elu(q) + 1
    blocks = torch.tensor([[0, 1], [0, 1]])
    bigbird = _backend("bigbird")
    window = _backend("sliding_window")
    return {
        "chunked_attention: is_causal": lambda b: chunked_attention(q, k, v, is_causal=b),
        "fusable: is_causal": lambda b: fusable(q, k, is_causal=b),
        "fused_attention: is_causal": lambda b: fused_attention(q, k, v, is_causal=b),
        "dense_attention_weights: is_causal":
            lambda b: dense_attention_weights(q, k, v, is_causal=b),
        "dense_keep_mask: is_causal": lambda b: dense_keep_mask(q, k, None, None, b),
        "gathered_block_attention: is_causal":
            lambda b: gathered_block_attention(q, k, v, blocks, T // 2, 0.5, is_causal=b),
        "sliding_window_attention: is_causal":
            lambda b: sliding_window_attention(q, k, v, 2, 0.5, block=4, is_causal=b),
        "fixed_pattern_attention: is_causal":
            lambda b: fixed_pattern_attention(q, k, v, 4, 1, 0.5, is_causal=b),
        "fixed_pattern_attention: split_heads":
            lambda b: fixed_pattern_attention(q, k, v, 4, 2, 0.5, split_heads=b),
        "kernel_attention: causal": lambda b: kernel_attention(phi, phi, v, causal=b),
        "pattern_block_mask: causal":
            lambda b: pattern_block_mask(lambda qp, kp: qp >= kp - 2, T, b, "cpu"),
        "linear backend: ignore_dropout": lambda b: _dropout_refused(b),
        "draw_random_features: orthogonal":
            lambda b: draw_random_features(4, 4, orthogonal=b,
                                           generator=torch.Generator().manual_seed(0)),
        "BilinearScore: scaled": lambda b: BilinearScore(2, 4, scaled=b).double()(q, k),
        "sliding_window backend: is_causal": lambda b: window.pattern_keep(T, b),
        "sliding_window backend: causal": lambda b: window.block_mask(T, b, "cpu"),
        "bigbird backend: is_causal": lambda b: bigbird.pattern_keep(T, b),
        "bigbird backend: causal": lambda b: (bigbird.random_blocks(2, b),
                                              bigbird.block_layout(2, b),
                                              bigbird.key_blocks(2, b)),
    }


@pytest.mark.parametrize("where", sorted(_calls()))
@pytest.mark.parametrize("value", ["no", 1], ids=repr)
def test_public_helpers_refuse_a_switch_that_is_not_a_bool(where, value):
    with pytest.raises(TypeError, match=_message(where, value)):
        _calls()[where](value)


@pytest.mark.parametrize("name", ["sliding_window", "bigbird"])
def test_each_part_of_a_pattern_call_refuses_alone(name):
    """The BigBird helpers are checked one by one (the call above runs all three)."""
    backend = _backend(name)
    calls = [backend.pattern_keep]
    if name == "bigbird":
        calls += [backend.random_blocks, backend.block_layout, backend.key_blocks]
    for call in calls:
        with pytest.raises(TypeError, match=r"must be True or False, got 'yes' \(str\)$"):
            call(2, "yes")


# -- bools compute what they computed ------------------------------------------------------

def _out(result):
    """The tensors of a helper's result, for comparison."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _out(r)]
    if result is None or isinstance(result, bool):
        return [result]
    return [result.kv_num_blocks, result.kv_indices, result.full_kv_num_blocks,
            result.full_kv_indices]  # a BlockMask


@pytest.mark.parametrize("where", sorted(_calls()))
@pytest.mark.parametrize("flag", [True, False])
def test_public_helpers_take_a_numpy_bool_as_the_bool(where, flag):
    expected = _out(_calls()[where](flag))
    got = _out(_calls()[where](np.bool_(flag)))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        else:
            assert a == b


def test_causal_and_orthogonal_helpers_agree_with_the_formulas():
    """The helpers' True/False against their definitions: the causal keep-set is j <= i, the
    causal kernel attention normalises over j <= i, orthogonal features are orthogonal within
    a block of head_dim rows, the scaled bilinear score is the dot score over √D."""
    q, k, v = _qkv(1)
    tril = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.equal(dense_keep_mask(q, k, None, None, True), tril)
    assert dense_keep_mask(q, k, None, None, False) is None
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    for causal in (True, False):
        w = (phi_q @ phi_k.mT) * (tril if causal else 1)
        ref = (w @ v) / (w.sum(-1, keepdim=True) + 1e-6)
        torch.testing.assert_close(kernel_attention(phi_q, phi_k, v, causal=causal), ref)
    omega = draw_random_features(4, 4, orthogonal=True,
                                 generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gram = omega @ omega.T
    torch.testing.assert_close(gram, torch.diag(torch.diagonal(gram)))
    raw = draw_random_features(4, 4, orthogonal=False, generator=torch.Generator().manual_seed(0),
                               dtype=torch.float64)
    torch.testing.assert_close(raw, torch.randn(4, 4, generator=torch.Generator().manual_seed(0),
                                                dtype=torch.float64))
    torch.testing.assert_close(BilinearScore(2, 4, scaled=True).double()(q, k),
                               q @ k.mT / math.sqrt(4))
    torch.testing.assert_close(BilinearScore(2, 4, scaled=False).double()(q, k), q @ k.mT)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_with_bools_agrees_with_torch(causal, need_weights):
    q, k, v = _qkv(2)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    scores = (q @ k.mT / 2.0).masked_fill(
        causal & ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    for c, n in [(causal, need_weights), (np.bool_(causal), np.bool_(need_weights))]:
        out, w = attention(q, k, v, is_causal=c, need_weights=n)
        torch.testing.assert_close(out, ref)
        assert (w is None) == (not need_weights)
        if need_weights:
            torch.testing.assert_close(w, torch.softmax(scores, -1))


def _reference(name: str, backend, q, k, v, causal: bool) -> torch.Tensor:
    """The attention each backend computes with these options, written out."""
    tril = torch.ones(T, T, dtype=torch.bool).tril()
    if name in SOFTMAX:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if name == "linformer":  # non-causal only: softmax over the projected keys and values
        e = backend.E.to(q.dtype)
        return F.scaled_dot_product_attention(q, e @ k, e @ v if backend.F is None
                                              else backend.F.to(q.dtype) @ v)
    if name in ("linear", "performer"):
        if name == "linear":
            phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
        else:  # FAVOR+: exp(ωᵀx' − ‖x'‖²/2)/√m with x' = x·(1/√D)^{1/2}
            omega = backend.omega.to(q.dtype)

            def phi(x):
                x = x * q.shape[-1] ** -0.25
                return torch.exp(x @ omega.T - 0.5 * (x * x).sum(-1, keepdim=True))

            phi_q, phi_k = phi(q), phi(k)
        w = (phi_q @ phi_k.mT) * (tril if causal else 1)
        return (w @ v) / w.sum(-1, keepdim=True)
    # lsh, one bucket and one chunk: every other key (j <= i when causal), a query's own
    # position only when it has no other, scores q·k/‖k‖ · 1/√D
    keys = k / k.norm(dim=-1, keepdim=True)
    scores = q @ keys.mT / 2.0
    keep = (tril if causal else torch.ones(T, T, dtype=torch.bool)) & ~torch.eye(T, dtype=bool)
    keep = keep | (torch.eye(T, dtype=bool) & ~keep.any(-1, keepdim=True))
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), -1) @ v


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("causal", [True, False])
def test_backends_with_bools_compute_the_attention_written_out(name, causal):
    backend = _backend(name)
    q, k, v = _qkv(3)
    if name == "linformer" and causal:  # no causal form: refused as before
        for c in (True, np.bool_(True)):
            with pytest.raises(ValueError, match="no causal form"):
                backend(q, k, v, is_causal=c)
        return
    out = backend(q, k, v, is_causal=causal)
    torch.testing.assert_close(backend(q, k, v, is_causal=np.bool_(causal)), out,
                               rtol=0, atol=0)
    torch.testing.assert_close(out, _reference(name, backend, q, k, v, causal),
                               rtol=1e-6, atol=1e-9)
    if hasattr(backend, "forward_with_weights"):
        out_w, _ = backend.forward_with_weights(q, k, v, is_causal=np.bool_(causal))
        torch.testing.assert_close(out_w, out)


def test_the_checks_break_no_graph_under_torch_compile():
    q, k, v = (x.float() for x in _qkv(4))
    full, chunked = _backend("full").float(), _backend("chunked").float()

    def attend(q, k, v):
        out, w = attention(q, k, v, is_causal=True, need_weights=True)
        out2, _ = attention(q, k, v, is_causal=False, need_weights=False)
        return (out + out2 + w.sum() + full(q, k, v, is_causal=True)
                + chunked(q, k, v, is_causal=False))

    torch._dynamo.reset()
    explained = torch._dynamo.explain(attend)(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
