"""Record what every attention layer of a model sees and returns during one forward pass.

The transformer blocks call :meth:`graded.attention.MultiheadAttention.attend` with the
per-head queries, keys and values (after rotary positions and the KV cache, *before* the
grading of :meth:`transform_heads`). :func:`capture_attention` wraps ``attend`` on every
attention module of a model for the duration of a ``with`` block and records each call, so
the diagnostics can recompute attention with and without the grading from the very same Q, K.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from graded.attention.functional import causal_mask
from graded.attention.multihead import MultiheadAttention
from graded.grading import activation_grading
from graded.transformer.models import InputEmbedding

__all__ = ["AttentionCall", "attention_modules", "capture_attention", "embedding_perturbation"]


@dataclass
class AttentionCall:
    """One call of an attention layer: its name, module, inputs and outputs (detached).

    ``q``, ``k``, ``v`` are (B, H, T, head_dim) before the grading; ``heads`` the per-head
    outputs (B, H, Tq, Dv); ``weights`` (B, H, Tq, Tk) when recorded. Masks keep the
    conventions of ``attend``: ``attn_mask`` is a keep-mask (True = may attend) or additive
    float bias, ``key_padding_mask`` is (B, Tk) with True = padding.
    """

    name: str
    module: MultiheadAttention
    q: Tensor
    k: Tensor
    v: Tensor
    attn_mask: Tensor | None
    key_padding_mask: Tensor | None
    is_causal: bool
    heads: Tensor
    weights: Tensor | None

    def keep_and_bias(self) -> tuple[Tensor | None, Tensor | None]:
        """The call's masks as a boolean keep-mask and an additive finite bias, both
        broadcastable to (B, H, Tq, Tk) (either may be None)."""
        t_q, t_k = self.q.shape[-2], self.k.shape[-2]
        keep: Tensor | None = None
        bias: Tensor | None = None
        if self.is_causal:
            keep = causal_mask(t_q, t_k, self.q.device)[None, None]
        if self.key_padding_mask is not None:
            kp = ~self.key_padding_mask[:, None, None, :]
            keep = kp if keep is None else keep & kp
        if self.attn_mask is not None:
            m = self.attn_mask
            if m.dtype == torch.bool:
                keep = m if keep is None else keep & m
            else:
                finite = torch.isfinite(m)
                keep = finite if keep is None else keep & finite
                bias = torch.where(finite, m, torch.zeros_like(m))
        return keep, bias


def attention_modules(model: nn.Module) -> dict[str, MultiheadAttention]:
    """Every attention module of ``model`` by qualified name, in forward order of layers."""
    return {n: m for n, m in model.named_modules() if isinstance(m, MultiheadAttention)}


@contextlib.contextmanager
def capture_attention(
    model: nn.Module, *, need_weights: bool = True
) -> Iterator[list[AttentionCall]]:
    """Inside the block, every ``attend`` call of the model's attention modules is recorded.

    With ``need_weights`` (default) each call is forced onto the explicit softmax path so its
    weights are returned; for an approximate backend (Performer, Linformer, ...) these are
    the exact softmax weights of the same Q, K, not the backend's approximation.
    """
    calls: list[AttentionCall] = []
    patched: list[tuple[nn.Module, Any]] = []  # (module, its previous instance attribute)

    def wrap(name: str, module: MultiheadAttention, original: Any) -> Any:
        def attend(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> tuple[Tensor, Any]:
            if need_weights:
                kwargs["need_weights"] = True
            heads, weights = original(q, k, v, **kwargs)
            calls.append(AttentionCall(
                name=name, module=module, q=q.detach(), k=k.detach(), v=v.detach(),
                attn_mask=_detach(kwargs.get("attn_mask")),
                key_padding_mask=_detach(kwargs.get("key_padding_mask")),
                is_causal=bool(kwargs.get("is_causal", False)), heads=heads.detach(),
                weights=_detach(weights),
            ))
            return heads, weights

        return attend

    try:
        for name, module in attention_modules(model).items():
            patched.append((module, module.__dict__.get("attend")))
            module.attend = wrap(name, module, module.attend)
        with activation_grading(model):  # attend's inputs ungraded, as documented
            yield calls
    finally:
        for module, previous in patched:  # nested captures unwind in order
            if previous is None:
                del module.attend
            else:
                module.attend = previous


def _detach(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.detach()


def _first_embedding(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, InputEmbedding):
            return m.tokens
    raise ValueError(f"{type(model).__name__} has no InputEmbedding: this diagnostic needs a "
                     "graded.transformer model")


@contextlib.contextmanager
def embedding_perturbation(model: nn.Module) -> Iterator[dict[str, Tensor | None]]:
    """Inside the block, ``slot["delta"]`` (if set) is added to the output of the model's
    first token embedding: the sequence X = (x_1, ..., x_n) that 000 §5 feeds to φ_q.
    ``slot["clean"]`` holds the last unperturbed embedding output."""
    slot: dict[str, Tensor | None] = {"delta": None, "clean": None}

    def hook(_module: nn.Module, _args: object, output: Tensor) -> Tensor:
        slot["clean"] = output.detach()
        return output if slot["delta"] is None else output + slot["delta"]

    handle = _first_embedding(model).register_forward_hook(hook)
    try:
        yield slot
    finally:
        handle.remove()
