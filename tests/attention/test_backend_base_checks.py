"""Backend input checks (check_inputs): each check no other test reaches names the backend and
the bad value; the base class names itself and refuses stateful decoding."""

import re

import pytest
import torch

from graded.attention.backends import get_backend
from graded.attention.backends.base import AttentionBackend, check_inputs


def _qkv(q=(1, 2, 3, 4), k=(1, 2, 5, 4), v=(1, 2, 5, 4)):
    return torch.zeros(q), torch.zeros(k), torch.zeros(v)


def test_inputs_must_be_floating_tensors():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"toy backend: k must be a Tensor, got list"):
        check_inputs("toy", q, [[0.0]], v, None, None, 0.0)
    with pytest.raises(TypeError, match=r"toy backend: v must be floating point, got torch.int64"):
        check_inputs("toy", q, k, v.long(), None, None, 0.0)


def test_shapes_must_agree():
    with pytest.raises(ValueError, match=r"toy backend: q \(1, 2, 3, 4\), k \(1, 2, 5, 4\), "
                                         r"v \(1, 2, 6, 4\) must agree"):
        check_inputs("toy", *_qkv(v=(1, 2, 6, 4)), None, None, 0.0)
    with pytest.raises(ValueError, match=r"toy backend: q and k head dims differ \(4 vs 3\)"):
        check_inputs("toy", *_qkv(k=(1, 2, 5, 3)), None, None, 0.0)


def test_an_attn_mask_that_does_not_broadcast_is_named():
    mask = torch.ones(3, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"toy backend: attn_mask of shape \(3, 3\) does not "
                                         r"broadcast to \(B, H, Tq, Tk\) = \(1, 2, 3, 5\)"):
        check_inputs("toy", *_qkv(), None, mask, 0.0)


class _Toy(AttentionBackend):
    name = "toy"

    def forward(self, q, k, v, **kwargs):
        return v


def test_the_base_backend_names_itself_and_keeps_no_decoding_state():
    toy = _Toy()
    assert repr(toy) == "_Toy(name='toy')"
    with pytest.raises(NotImplementedError, match=r"toy backend keeps no decoding state"):
        toy.decode(*_qkv(), None)


_BACKENDS = {
    "chunked": {"query_chunk": 2, "key_chunk": 2}, "sliding_window": {"window": 2},
    "dilated": {"dilation": 2}, "sparse_fixed": {"block": 4, "summary": 1},
    "block_sparse": {"layout": [[True] * 4] * 4, "block_size": 2},
    "bigbird": {"block_size": 2, "num_random_blocks": 1, "window_blocks": 1},
    "linear": {}, "performer": {"num_features": 8}, "lsh": {"n_buckets": 2, "chunk_size": 2},
}


@pytest.mark.parametrize("name", sorted(_BACKENDS))
@pytest.mark.parametrize("shape", [(0, 2, 5, 4), (2, 2, 0, 4)], ids=["empty batch", "no token"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_backend_serves_an_empty_batch_or_sequence_as_the_fused_kernel(name, shape,
                                                                             causal):
    """An empty batch or sequence gives the empty output the fused kernel gives (the blocked
    and kernel computations failed reshaping zero elements by the length)."""
    from graded.attention.backends import get_backend

    q, k, v = torch.randn(3, *shape).unbind(0)
    pad = torch.zeros(shape[0], shape[2], dtype=torch.bool)
    expected = get_backend("full")(q, k, v, key_padding_mask=pad, is_causal=causal)
    out = get_backend(name, **_BACKENDS[name])(q, k, v, key_padding_mask=pad, is_causal=causal)
    assert out.shape == expected.shape == shape
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("name", ["chunked", "linear", "performer"])
def test_queries_without_keys_get_zeros_on_the_cross_attention_backends(name):
    """Tk = 0: no query has an admissible key, so each gets the zero vector (the
    backends' convention)."""
    from graded.attention.backends import get_backend

    q, k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 0, 4), torch.randn(2, 2, 0, 5)
    q.requires_grad_()
    out = get_backend(name, **_BACKENDS[name])(q, k, v)
    torch.testing.assert_close(out, torch.zeros(2, 2, 3, 5))
    (grad,) = torch.autograd.grad(out.sum(), q)  # zeros, not None: the output depends on q
    torch.testing.assert_close(grad, torch.zeros_like(q))


@pytest.mark.parametrize("backend", ["sliding_window", "linear", "lsh"])
def test_an_empty_batch_gives_every_parameter_a_zero_gradient(backend):
    """B = 0 through a whole LM: the loss is 0 and every attention parameter's gradient is
    zeros, not None (an optimizer or DDP's reducer expects one for each parameter)."""
    from graded import TransformerConfig, TransformerLM

    torch.manual_seed(0)
    options = {"sliding_window": {"window": 2}, "linear": {}, "lsh": {"n_buckets": 2,
                                                                     "chunk_size": 2}}[backend]
    lm = TransformerLM(TransformerConfig(vocab_size=7, d_model=8, n_heads=2, n_layers=1,
                                         max_len=8, attn_backend=backend,
                                         attn_backend_options=options))
    lm(torch.zeros(0, 4, dtype=torch.long)).sum().backward()
    attention = [(n, p) for n, p in lm.named_parameters() if ".attn." in n]
    assert attention and all(p.grad is not None and not p.grad.any() for _, p in attention)


@pytest.mark.parametrize("name, options, message", [
    ("explicit", {"max_elements": True}, "max_elements must be a positive int, got True"),
    ("chunked", {"query_chunk": True}, "query_chunk must be a positive int, got True"),
    ("block_sparse", {"layout": [[True]], "block_size": True},
     "block_size must be a positive int, got True"),
    ("block_sparse", {"layout": [[1.0, 0.5], [0.0, 1.0]]},
     "layout must hold bools (or 0 and 1), got the value 0.5"),
    ("bigbird", {"block_size": True}, "block_size must be a positive int, got True"),
    ("bigbird", {"num_global_blocks": True}, "num_global_blocks must be an int >= 0, got True"),
    ("linformer", {"max_len": 8, "rank": True}, "rank must be a positive int, got True"),
    ("linformer", {"max_len": True}, "max_len must be a positive int, got True"),
    ("lsh", {"n_rounds": True}, "n_rounds must be a positive int, got True"),
    ("lsh", {"n_buckets": True}, "n_buckets must be 1 or a positive even int, got True"),
])
def test_size_options_refuse_a_bool_or_a_weight_and_name_it(name, options, message):
    """True passed for a size was taken as 1 (a one-position chunk or block, one round, one
    bucket, a rank-1 projection) or failed inside torch.randn; a layout weight of 0.5 became
    True."""
    with pytest.raises(ValueError, match=re.escape(f"{name} backend: {message}")):
        get_backend(name, **options)
