"""Every registered attention backend computes on the accelerator what it computes on the CPU:
called directly on per-head tensors (causal, padded, cross-attention, as each declares) and
inside ``MultiheadAttention`` (with an additive bias and attention weights where served),
forward and backward, in float64 and in float32 (tolerances in ``device_checks``). On CUDA in
float32 the pattern backends run their FlexAttention kernel (``kernel="auto"``) and ``full``
the fused kernels, so this also compares those kernels with the CPU's."""

from __future__ import annotations

import pytest
import torch
from device_checks import compare_on

from graded.attention import MultiheadAttention
from graded.attention.backends import available_backends, backend_capabilities, get_backend

B, H, T, DH = 2, 2, 16, 16  # batch, heads, length, head width (Triton products want >= 16)
TQ = 10  # query length of cross-attention
LAYOUT = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)

# deterministic settings of every backend for length-16 calls (blocks of 4 positions), keyed
# by backend name, or "name-variant" for a further setting of one backend
OPTIONS = {
    "bigbird": {"block_size": 4, "num_random_blocks": 1, "seed": 0},
    "block_sparse": {"layout": LAYOUT, "block_size": 4},
    "chunked": {"query_chunk": 5, "key_chunk": 3},
    "dilated": {"dilation": 3},
    "explicit": {},
    "full": {},
    "linear": {"chunk_size": 4},
    "linformer": {"max_len": T, "rank": 6},
    "lsh": {"n_buckets": 4, "n_rounds": 2, "chunk_size": 4, "seed": 0},
    "performer": {"num_features": 12, "seed": 0, "head_dim": DH},
    "sliding_window": {"window": 3},
    "sparse_fixed": {"block": 4, "summary": 1},
    "sparse_fixed-split": {"block": 4, "summary": 1, "summary_heads": "split"},  # per-head mask
    "sparse_fixed-local": {"block": 4, "summary": 1, "part": "local"},  # A¹ alone
    "sparse_fixed-summary": {"block": 4, "summary": 2, "summary_heads": "split",
                             "part": "summary"},  # A² alone, per head: rows with no key
    "sparse_fixed-heads": {"block": 4, "summary": 1, "part": "heads"},  # A¹ even, A² odd heads
}
DTYPES = pytest.mark.parametrize("dtype", [torch.float64, torch.float32],
                                 ids=["float64", "float32"])


def backend_name(key: str) -> str:
    """The registered name of an ``OPTIONS`` key."""
    return key.split("-")[0]


def settings() -> list[tuple[str, str]]:
    """(OPTIONS key, setting) for every setting the backend's declared capabilities allow."""
    out = []
    for name in sorted(OPTIONS):
        caps = backend_capabilities(backend_name(name))
        out.append((name, "self-attention"))
        if caps.causal:
            out.append((name, "causal"))
        if caps.key_padding_mask:
            out.append((name, "padding"))
            if caps.causal:
                out.append((name, "causal, padding"))
        if caps.cross_attention:
            out.append((name, "cross-attention"))
    return out


PAD = torch.arange(T)[None, :] >= torch.tensor([T, T - 5])[:, None]  # (B, T), True = padding


def inputs(setting: str) -> tuple:
    """q, k, v (B, H, ·, DH) and key padding (B, T) on the CPU."""
    gen = torch.Generator().manual_seed(0)
    tq = TQ if setting == "cross-attention" else T
    q = torch.randn(B, H, tq, DH, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, H, T, DH, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v, PAD


def call(setting: str):
    causal, padded = "causal" in setting, "padding" in setting

    def run(backend, q, k, v, pad):
        return backend(q, k, v, is_causal=causal, key_padding_mask=pad if padded else None)

    return run


def test_options_cover_every_registered_backend():
    assert sorted({backend_name(key) for key in OPTIONS}) == available_backends()


@DTYPES
@pytest.mark.parametrize(("name", "setting"), settings())
def test_backend_on_the_accelerator_equals_the_cpu(name, setting, dtype, device):
    torch.manual_seed(0)
    backend = get_backend(backend_name(name), **OPTIONS[name])
    compare_on(device, backend, inputs(setting), call(setting), dtype)


def mha_settings() -> list[tuple[str, str]]:
    out = []
    for name in sorted(OPTIONS):
        out.append((name, "masks"))
        if backend_capabilities(backend_name(name)).attn_bias:
            out.append((name, "additive bias, weights"))
    return out


@DTYPES
@pytest.mark.parametrize(("name", "setting"), mha_settings())
def test_multihead_attention_with_each_backend_on_the_accelerator_equals_the_cpu(
        name, setting, dtype, device):
    """Projections, the backend and the output projection together. "masks": causal and
    padded as far as the backend serves them; "additive bias, weights": a float attn_mask
    (H, T, T) and the per-head attention weights."""
    caps = backend_capabilities(backend_name(name))
    torch.manual_seed(0)
    mha = MultiheadAttention(H * DH, H, batch_first=True, backend=backend_name(name),
                             backend_options=OPTIONS[name])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, H * DH, generator=gen, dtype=torch.float64)
    bias = torch.randn(B * H, T, T, generator=gen, dtype=torch.float64)
    if setting == "masks":
        def run(m, x, pad, bias):
            return m(x, x, x, key_padding_mask=pad if caps.key_padding_mask else None,
                     is_causal=caps.causal, need_weights=False)[0]
    else:
        def run(m, x, pad, bias):
            return m(x, x, x, key_padding_mask=pad, attn_mask=bias, need_weights=True,
                     average_attn_weights=False)

    compare_on(device, mha, (x, PAD, bias), run, dtype)
