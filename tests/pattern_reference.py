"""References that the tests of the pattern backends (``sparse_fixed``) share: softmax attention
over a keep-set written out query by query, or as a dense mask, and the tiles a FlexAttention
block mask lists."""

from __future__ import annotations

import torch
from torch import nn


def loop_attention(q, k, v, pad, rule, causal, scale=None):
    """o_i = softmax over the keys j that ``rule(h, i, j)`` admits in head h, unpadded (j ≤ i
    when causal), of q_i·k_j·scale (default 1/√D), one batch row, head and query at a time;
    zeros where no key is left."""
    b_, h_, t, d = q.shape
    scale = d ** -0.5 if scale is None else scale

    def attend(b, h, i):
        keys = [j for j in range(t) if rule(h, i, j) and not pad[b, j] and (j <= i or not causal)]
        if not keys:
            return torch.zeros_like(v[b, h, 0])
        return torch.softmax(q[b, h, i] @ k[b, h, keys].T * scale, -1) @ v[b, h, keys]

    return torch.stack([torch.stack([torch.stack([attend(b, h, i) for i in range(t)])
                                     for h in range(h_)]) for b in range(b_)])


class LoopBackend(nn.Module):
    """An attention backend that is :func:`loop_attention` under ``rule(h, i, j)`` (no backend
    machinery), to put in a model in place of the backend under test."""

    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def forward(self, q, k, v, *, key_padding_mask=None, attn_mask=None, is_causal=False,
                dropout_p=0.0):
        pad = (torch.zeros(q.shape[0], k.shape[2], dtype=torch.bool)
               if key_padding_mask is None else key_padding_mask)
        return loop_attention(q, k, v, pad, self.rule, is_causal)


def dense_reference(q, k, v, pad, rule, causal):
    """The same attention with the keep-set as a dense (B, H, T, T) mask: a masked softmax
    (rows without a key give zeros)."""
    heads, t = q.shape[1], q.shape[2]
    keep = torch.tensor([[[rule(h, i, j) for j in range(t)] for i in range(t)]
                         for h in range(heads)])
    if causal:
        keep = keep & torch.ones(t, t, dtype=torch.bool).tril()
    keep = keep & ~pad[:, None, None, :]
    scores = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


def qkv(t, seed=0, d=4, dv=3, grad=False, heads=2):
    """q, k (2, heads, t, d) and v (2, heads, t, dv) in float64."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, heads, t, d, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, heads, t, dv, generator=g, dtype=torch.float64)
    return [x.requires_grad_(grad) for x in (q, k, v)]


def padding(t, padded=True):
    """(2, t) key padding: row 1 trailing (summary columns among it), row 0 one early key."""
    pad = torch.zeros(2, t, dtype=torch.bool)
    if padded:
        pad[1, t - 4:] = True
        pad[0, 1] = True
    return pad


def tiles(num, idx):
    """(H, nQ, nK) bool: the tiles a BlockMask lists per head and query tile row."""
    num, idx = num[0], idx[0]
    dense = torch.zeros(idx.shape, dtype=torch.bool)
    for h in range(num.shape[0]):
        for r in range(num.shape[1]):
            dense[h, r, idx[h, r, : num[h, r]].long()] = True
    return dense


def assert_same_values_and_gradients(out, ref, inputs):
    """``out`` equals ``ref`` (float64, to 1e-12), and so do their gradients to ``inputs`` under
    one random upstream gradient."""
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, inputs, grad),
                    torch.autograd.grad(ref, inputs, grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def decode_in_steps(backend, q, k, v, pad, steps):
    """The backend's incremental decoding over pieces of ``steps`` tokens: the outputs, joined
    (B, H, T, Dv), and the final decoding state."""
    state, start, outs = None, 0, []
    for n in steps:
        piece = slice(start, start + n)
        out, state = backend.decode(q[:, :, piece], k[:, :, piece], v[:, :, piece], state,
                                    key_padding_mask=pad[:, piece])
        outs.append(out)
        start += n
    return torch.cat(outs, dim=2), state
