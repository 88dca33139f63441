"""GradedMultiheadAttention against torch.nn.MultiheadAttention: neutral grades equal torch's
module, and any diagonal grading equals torch's module with the grading put into its
projection rows by hand (000 Def 5.22: (W x + b)·m = (diag(m) W) x + m·b on the graded parts,
and the appended bias_k, bias_v graded with the keys and values, as the docs say), over the
arguments torch takes, in both the folded and the activation form."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from graded.attention import GradedMultiheadAttention

E, H = 8, 2
D = E // H
B, L, S = 2, 3, 4
F64 = torch.float64
PARTS = {"scores": "q", "queries_keys": "qk", "values": "v", "multi_head": "q"}


def graded_by_hand(graded: GradedMultiheadAttention, m: torch.Tensor) -> nn.MultiheadAttention:
    """torch's module with the parameters of ``graded``, the rows of each graded projection
    (and bias_k, bias_v for graded keys, values) multiplied by the scales ``m``."""
    ref = nn.MultiheadAttention(
        E, H, dtype=F64, batch_first=graded.batch_first, kdim=graded.kdim, vdim=graded.vdim,
        bias=graded.in_proj_bias is not None, add_bias_kv=graded.bias_k is not None,
        add_zero_attn=graded.add_zero_attn)
    state = {k: v.detach().clone() for k, v in graded.torch_state_dict().items()}
    rows = m.reshape(-1) if m.dim() == 2 else m.repeat(H)  # (head, head_dim) order
    for i, part in enumerate("qkv"):
        if part not in PARTS[graded.variant]:
            continue
        if graded._qkv_same_embed_dim:
            state["in_proj_weight"][i * E:(i + 1) * E] *= rows[:, None]
        else:
            state[f"{part}_proj_weight"] *= rows[:, None]
        if "in_proj_bias" in state:
            state["in_proj_bias"][i * E:(i + 1) * E] *= rows
        if part in "kv" and graded.bias_k is not None:
            state[f"bias_{part}"] *= rows
    ref.load_state_dict(state)
    return ref


OPTIONS = [dict(), dict(kdim=6, vdim=5), dict(bias=False), dict(add_bias_kv=True),
           dict(add_zero_attn=True), dict(kdim=6, vdim=6, add_bias_kv=True, add_zero_attn=True)]


def _id(options):
    return ",".join(f"{k}={v}" for k, v in options.items()) or "plain"


def masks(batch):
    gen = torch.Generator().manual_seed(1)
    bool3 = torch.rand(batch * H, L, S, generator=gen) > 0.5
    bool3[..., 0] = False
    kpm = torch.zeros(batch, S, dtype=torch.bool)
    kpm[-1, 2:] = True
    return [{}, {"attn_mask": bool3}, {"attn_mask": torch.randn(L, S, generator=gen,
                                                                dtype=F64)},
            {"key_padding_mask": kpm}]


@pytest.mark.parametrize("variant", list(PARTS))
@pytest.mark.parametrize("fold_grading", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("options", OPTIONS, ids=_id)
def test_grading_equals_torch_with_the_grading_in_its_projection_rows(variant, fold_grading,
                                                                      batch_first, options):
    torch.manual_seed(0)
    grades = torch.rand(H, D, dtype=F64) if variant == "multi_head" else torch.rand(D, dtype=F64)
    graded = GradedMultiheadAttention(
        E, H, grading="exponential", grades=grades, base=3.0, variant=variant,
        fold_grading=fold_grading, batch_first=batch_first, dtype=F64, **options)
    ref = graded_by_hand(graded, graded.grading.scales().detach())
    kdim, vdim = options.get("kdim") or E, options.get("vdim") or E

    def make(t, d):
        return torch.randn(B, t, d, dtype=F64) if batch_first else torch.randn(t, B, d, dtype=F64)

    q, k, v = make(L, E), make(S, kdim), make(S, vdim)
    for mask, (need, average) in itertools.product(
            masks(B), [(True, True), (True, False), (False, True)]):
        kwargs = dict(mask, need_weights=need, average_attn_weights=average)
        grads = []
        results = []
        for module in (ref, graded):
            xs = [t.clone().requires_grad_() for t in (q, k, v)]
            out, w = module(*xs, **kwargs)
            out.square().sum().backward()
            results.append((out, w))
            grads.append([x.grad for x in xs])
        (out_r, w_r), (out, w) = results
        what = f"{variant}, fold={fold_grading}, {options}, {kwargs}"
        torch.testing.assert_close(out, out_r, atol=1e-11, rtol=1e-9, msg=what)
        assert (w is None) == (w_r is None), what
        if w is not None:
            torch.testing.assert_close(w, w_r, atol=1e-11, rtol=1e-9, msg=what)
        for a, b in zip(grads[1], grads[0], strict=True):
            torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9, msg=what)


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values"])
@pytest.mark.parametrize("layout", ["unbatched", "seq_first"])
def test_neutral_grades_equal_torch_with_every_mask_and_self_attention(variant, layout):
    """Neutral grades (M = I): outputs, weights and every gradient equal torch's module, for
    one tensor as query, key and value (torch's packed projection) and every mask."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, dtype=F64, add_bias_kv=True)
    graded = GradedMultiheadAttention(E, H, grading="linear", variant=variant, dtype=F64,
                                      add_bias_kv=True)
    graded.load_state_dict(ref.state_dict())
    x = torch.randn(L, E, dtype=F64) if layout == "unbatched" else torch.randn(L, B, E,
                                                                              dtype=F64)
    batch = 1 if layout == "unbatched" else B
    for mask in ({}, {"attn_mask": torch.randn(batch * H, L, L, dtype=F64)},
                 {"key_padding_mask": torch.tensor([False, True, False]) if batch == 1
                  else torch.tensor([[False] * L, [False, True, True]])}):
        results = []
        for module in (ref, graded):
            module.zero_grad()
            xi = x.clone().requires_grad_()
            out, w = module(xi, xi, xi, **mask)
            (out.square().sum() + w.square().sum()).backward()
            results.append((out, w, xi.grad, [p.grad for p in module.parameters()
                                              if p.grad is not None]))
        for a, b in zip(results[1][:3], results[0][:3], strict=True):
            torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)
        for a, b in zip(results[1][3], results[0][3], strict=True):
            torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)
