"""The exact backends in bfloat16 are as accurate as torch's fused kernel.

Torch's math SDPA (``_scaled_dot_product_attention_math``) upcasts half-precision q, k and v to
float32 and rounds the output once; its fused kernels accumulate in float32. Scores, softmax and
weighted sum formed in bfloat16 had about twice the fused kernel's error against a float64
reference. Each backend's error is measured here against float64 softmax attention over the
backend's keep-set, beside the fused kernel's error on the same bfloat16 inputs and mask.
"""

import pytest
import torch
import torch.nn.functional as F

from graded.attention.backends import get_backend

B, H, T, D = 2, 2, 83, 32  # T not a multiple of any block size below

BACKENDS = {
    "explicit": ("explicit", {}),
    "chunked": ("chunked", {"kernel": "native", "query_chunk": 32, "key_chunk": 8}),
    "sliding_window": ("sliding_window", {"window": 12, "kernel": "native"}),
    "dilated": ("dilated", {"dilation": 3, "kernel": "native"}),
    "dilated_window": ("dilated", {"dilation": 3, "window": 5, "kernel": "native"}),
    "sparse_fixed": ("sparse_fixed", {"block": 16, "summary": 4, "kernel": "native"}),
    "sparse_fixed_heads": ("sparse_fixed", {"block": 16, "summary": 4, "part": "heads",
                                            "kernel": "native"}),
    "block_sparse": ("block_sparse", {
        "layout": torch.tensor([[1, 0, 1, 0, 1, 0], [1, 1, 0, 0, 0, 1], [0, 1, 1, 0, 1, 0],
                                [1, 0, 0, 1, 0, 0], [0, 1, 1, 1, 1, 0], [1, 0, 0, 1, 0, 1]],
                               dtype=torch.bool),
        "block_size": 16, "kernel": "native"}),
    "bigbird": ("bigbird", {"block_size": 8, "num_random_blocks": 2, "kernel": "native"}),
}


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) * 1.5 for _ in range(3))
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, T - 29:] = True
    return q, k, v, pad


def keep_set(backend, causal, pad):
    """(B, H, T, T) keep-mask: the backend's pattern (all pairs for the dense ones), causality
    and the padding."""
    if hasattr(backend, "pattern_keep"):
        keep = backend.pattern_keep(T, causal, heads=H).expand(H, T, T)
    else:
        keep = torch.ones(T, T, dtype=torch.bool)
        keep = keep.tril() if causal else keep
    return keep[None] & ~pad[:, None, None, :]


def float64_attention(q, k, v, keep):
    scores = (q @ k.transpose(-2, -1)) * D ** -0.5
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0) @ v


def rms(x, ref):
    return (x.double() - ref).square().mean().sqrt().item()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", sorted(BACKENDS))
def test_bfloat16_backend_error_is_no_larger_than_the_fused_kernels(case, causal):
    name, options = BACKENDS[case]
    backend = get_backend(name, **options)
    q, k, v, pad = inputs()
    keep = keep_set(backend, causal, pad)
    exact = float64_attention(q, k, v, keep)
    # the keep-set is the backend's: in float64 it computes this very attention
    torch.testing.assert_close(backend(q, k, v, key_padding_mask=pad, is_causal=causal), exact)
    low = [x.bfloat16() for x in (q, k, v)]
    out = backend(*low, key_padding_mask=pad, is_causal=causal)
    fused = F.scaled_dot_product_attention(*low, attn_mask=keep)
    fused = torch.where(keep.any(-1, keepdim=True), fused, 0.0)  # rows with no key: zeros
    assert out.dtype == torch.bfloat16
    assert rms(out, exact) <= 1.1 * rms(fused, exact), (rms(out, exact), rms(fused, exact))


@pytest.mark.parametrize("case", ["sliding_window", "sparse_fixed", "block_sparse", "bigbird"])
def test_bfloat16_decoding_steps_are_as_accurate_as_the_fused_kernel(case):
    """Decoding after the prompt attends the new queries over the kept keys: in bfloat16 it
    computes in float32 too."""
    name, options = BACKENDS[case]
    backend = get_backend(name, **options)
    q, k, v, _ = inputs(1)
    no_pad = torch.zeros(B, T, dtype=torch.bool)
    keep = keep_set(backend, True, no_pad)
    exact = float64_attention(q, k, v, keep)[:, :, 50:]
    low = [x.bfloat16() for x in (q, k, v)]
    _, state = backend.decode(*(x[:, :, :50] for x in low), None)
    steps = []
    for i in range(50, T):
        out, state = backend.decode(*(x[:, :, i:i + 1] for x in low), state)
        steps.append(out)
    out = torch.cat(steps, dim=2)
    fused = F.scaled_dot_product_attention(*low, attn_mask=keep)[:, :, 50:]
    assert out.dtype == torch.bfloat16
    assert rms(out, exact) <= 1.1 * rms(fused, exact), (rms(out, exact), rms(fused, exact))


def test_explicit_weights_of_bfloat16_inputs_are_the_float32_softmax_rounded_once():
    """The materialised weights are softmax(q kᵀ/√D) computed in float32 and rounded to
    bfloat16, as the math SDPA's (equal within one bfloat16 step: the two float32 softmaxes
    may differ in their last bit, across a rounding boundary); the output is their float32
    product with v, rounded once."""
    q, k, v, _ = inputs(2)
    low = [x.bfloat16() for x in (q, k, v)]
    out, weights = get_backend("explicit").forward_with_weights(*low)
    q32, k32, v32 = (x.float() for x in low)
    expected = torch.softmax(q32 @ k32.transpose(-2, -1) * D ** -0.5, dim=-1)
    assert weights.dtype == out.dtype == torch.bfloat16
    torch.testing.assert_close(weights, expected.bfloat16(), atol=0, rtol=2**-7)
    torch.testing.assert_close(out, (expected @ v32).bfloat16(), atol=1e-2, rtol=0)


def test_explicit_refusal_counts_the_float32_scores_of_bfloat16_inputs():
    """Scores and weights of bfloat16 inputs are float32 (4 bytes each), not bfloat16."""
    backend = get_backend("explicit", max_elements=1000)
    q = torch.zeros(2, 3, 20, 8, dtype=torch.bfloat16)
    need = 2 * 2 * 3 * 20 * 20 * 4
    with pytest.raises(MemoryError, match=rf"{need} bytes .* in torch\.float32"):
        backend(q, q, q)
