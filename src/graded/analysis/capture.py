"""Record what every attention layer of a model sees and returns during one forward pass.

The transformer blocks call :meth:`graded.attention.MultiheadAttention.attend` with the
per-head queries, keys and values (after rotary positions and the KV cache, *before* the
grading of :meth:`transform_heads`). :func:`capture_attention` wraps ``attend`` on every
attention module of a model for the duration of a ``with`` block and records each call, so
the diagnostics can recompute attention with and without the grading from the very same Q, K.

A morphic model's grade-typed attention (:class:`graded.morphic.GradeTypedAttention`, 004
§2.1.1) runs on the fused kernel, which returns no weights: a forward hook records each call's
per-head Q, K, V from the block's own projections and the causal softmax weights beside it
(the block's own scale 1/√head_dim), so the same diagnostics read both kinds of model.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from graded.analysis._common import INPUT_PADDING, padding_argument
from graded.attention.backends.base import capabilities_of, default_scale, softmax_rows
from graded.attention.functional import causal_mask
from graded.attention.multihead import MultiheadAttention
from graded.folding import activation_grading
from graded.morphic.attention_block import GradeTypedAttention
from graded.transformer.blocks import AttentionSublayer, DecoderBlock
from graded.transformer.models import InputEmbedding

__all__ = [
    "AttentionCall",
    "attention_modules",
    "call_keys",
    "capture_attention",
    "check_calls",
    "embedding_perturbation",
    "real_queries",
    "self_attention_modules",
]


@dataclass
class AttentionCall:
    """One call of an attention layer: its name, module, inputs and outputs (detached).

    ``q``, ``k``, ``v`` are (B, H, T, head_dim) before the grading; ``heads`` the per-head
    outputs (B, H, Tq, Dv); ``weights`` (B, H, Tq, Tk) when recorded. Masks keep the
    conventions of ``attend``: ``attn_mask`` is a keep-mask (True = may attend) or additive
    float bias, ``key_padding_mask`` is (B, Tk) with True = padding. ``pattern`` is the
    (Tq, Tk) keep-set of a sparse-pattern backend (window, stride, blocks), (H, Tq, Tk) for a
    pattern that differs between heads, None otherwise. ``query_padding_mask`` is (B, Tq) with
    True = a padded query: for a self-attention call its ``key_padding_mask`` (the queries are
    the keys' tokens), for a decoder block's cross-attention call the target padding the block
    gives its self-attention; None when unknown or when the call has no such (B, Tq) mask.
    """

    name: str
    module: MultiheadAttention | GradeTypedAttention
    q: Tensor
    k: Tensor
    v: Tensor
    attn_mask: Tensor | None
    key_padding_mask: Tensor | None
    is_causal: bool
    heads: Tensor
    weights: Tensor | None
    pattern: Tensor | None = None
    query_padding_mask: Tensor | None = None

    def keys_per_head(self) -> Tensor:
        """The keys (B, H, Tk, head_dim), one per query head (grouped-query keys repeated as
        the layer repeats them; a grade-typed attention has one per head already)."""
        expand = getattr(self.module, "expand_kv", None)
        return self.k if expand is None else expand(self.k)

    def scale(self) -> float | None:
        """The layer's softmax scale when its backend sets one; None for the default
        1/√head_dim (a grade-typed attention's)."""
        return getattr(getattr(self.module, "backend", None), "scale", None)

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
        if self.pattern is not None:
            keep = self.pattern if keep is None else keep & self.pattern
        if self.attn_mask is not None:
            m = self.attn_mask
            if m.dtype == torch.bool:
                keep = m if keep is None else keep & m
            else:
                finite = torch.isfinite(m)
                keep = finite if keep is None else keep & finite
                bias = torch.where(finite, m, torch.zeros_like(m))
        return keep, bias


def call_keys(calls: Sequence[AttentionCall]) -> list[str]:
    """The key of each call in the results of the diagnostics, in call order.

    The first call of a module is keyed by the module's qualified name; a later call of the
    same module in the same forward pass by ``name#n``, n = 1, 2, ... counting that module's
    earlier calls (a module called twice gives ``name`` and ``name#1``). Every diagnostic that
    reports per call (:func:`~graded.analysis.attention_maps`,
    :func:`~graded.analysis.head_diversity`, :func:`~graded.analysis.attention_rank`,
    :func:`~graded.analysis.positional_bias_sweep`) uses this rule, so their results join on
    the keys.
    """
    keys: list[str] = []
    taken: set[str] = set()
    seen: dict[str, int] = {}
    for call in calls:
        n = seen.get(call.name, 0)
        key = call.name if n == 0 else f"{call.name}#{n}"
        while key in taken:  # a module whose own name looks like "name#n"
            n += 1
            key = f"{call.name}#{n}"
        seen[call.name] = n + 1
        taken.add(key)
        keys.append(key)
    return keys


def self_attention_modules(model: nn.Module) -> set[int]:
    """Ids of the attention modules of ``model``'s self-attention sublayers (the transformer
    blocks' ``AttentionSublayer`` with ``cross=False``): their queries are the keys' tokens."""
    return {id(m.attn) for m in model.modules()
            if isinstance(m, AttentionSublayer) and not m.cross}


def real_queries(call: AttentionCall) -> Tensor | None:
    """(B, Tq) bool, True at the queries of real tokens: the complement of the call's
    ``query_padding_mask`` (a self-attention call's key padding, a cross-attention call's
    target padding, :func:`capture_attention`). None when every query is real or the call's
    query padding is unknown.

    The diagnostics average over, and take matrices of, these rows only, so a sequence's numbers
    do not depend on the padding that follows it in a batch: a padded query still
    attends (to the real keys) and its row would enter every mean and every rank."""
    if call.query_padding_mask is None:
        return None
    real = ~call.query_padding_mask.to(torch.bool)
    return None if bool(real.all()) else real


#: The attention layers the diagnostics read.
ATTENTION_TYPES = (MultiheadAttention, GradeTypedAttention)


def attention_modules(model: nn.Module) -> dict[str, MultiheadAttention | GradeTypedAttention]:
    """Every attention module of ``model`` by qualified name, in forward order of layers: the
    graded transformers' :class:`~graded.attention.MultiheadAttention` and the morphic models'
    :class:`~graded.morphic.GradeTypedAttention`."""
    return {n: m for n, m in model.named_modules() if isinstance(m, ATTENTION_TYPES)}


def check_calls(calls: Sequence[AttentionCall], model: nn.Module, caller: str) -> None:
    """ValueError when ``model`` made no attention call on the inputs (a diagnostic of its
    attention would otherwise return nothing, silently), naming the model's class and the
    attention layers the diagnostics read; or, for a model that has such layers, that none of
    them ran (a morphic layer with a hard router runs a grade-typed attention only for the
    tokens routed to it)."""
    if calls:
        return
    present = list(attention_modules(model))
    if present:
        why = (f"its attention layers {present} did not run on these inputs (a morphic "
               "layer runs a grade-typed attention block only when its router selects it)")
    else:
        why = "it has no attention layer"
    raise ValueError(
        f"{caller} needs a model with attention layers: {type(model).__name__} made no "
        f"attention call on these inputs ({why}). "
        "Supported are models whose attention layers are graded.attention.MultiheadAttention "
        "(the graded.transformer models) or graded.morphic.GradeTypedAttention (a "
        "MorphicTransformer)")


@contextlib.contextmanager
def capture_attention(
    model: nn.Module, *, need_weights: bool = True
) -> Iterator[list[AttentionCall]]:
    """Inside the block, every ``attend`` call of the model's attention modules is recorded.

    With ``need_weights`` (default) each call's weights are recorded. The dense backends
    (``full``, ``explicit``, ``chunked``) return their own. A backend that returns none keeps
    computing the model's output (so later layers see what they see without the capture),
    and the weights are computed beside it from the same graded Q and K, scale and masks: for
    a sparse-pattern backend (``sliding_window``, ``dilated``, ``sparse_fixed``,
    ``block_sparse``, ``bigbird``) the softmax over its pattern, which is the attention it
    computes; for an approximate backend (``linear``, ``performer``, ``linformer``, ``lsh``)
    the exact softmax, not the backend's approximation.

    Each call records the padding of its queries (``query_padding_mask``): a self-attention
    call's own ``key_padding_mask``; for the cross-attention of a :class:`DecoderBlock`, whose
    mask is the memory's, the ``key_padding_mask`` the block is called with (the target's),
    read by a forward pre-hook that lives only as long as the capture.

    A cached forward pass whose backend decodes through its own state (``attend_incremental``:
    ``sliding_window``, ``linear``, ...) has no keys to record and raises ``ValueError``.
    """
    calls: list[AttentionCall] = []
    patched: list[tuple[nn.Module, str, Any]] = []  # (module, attribute, previous value)
    self_attention = self_attention_modules(model)
    target_padding: dict[int, Tensor | None] = {}  # id(cross-attention) -> its block's mask

    def remember_target_padding(block: nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        target_padding[id(block.cross_attn.attn)] = kwargs.get("key_padding_mask")

    input_padding: dict[str, Tensor | None] = {}  # the model call's key padding

    def remember_input_padding(_model: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        input_padding["mask"] = padding_argument(model, tuple(args), kwargs, INPUT_PADDING)

    def wrap(name: str, module: MultiheadAttention, original: Any) -> Any:
        def attend(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> tuple[Tensor, Any]:
            backend = getattr(module, "backend", None)
            own_weights = backend is None or capabilities_of(backend).attention_weights
            if need_weights and own_weights:
                kwargs["need_weights"] = True
            heads, weights = original(q, k, v, **kwargs)
            pattern = _pattern(backend, q, k, bool(kwargs.get("is_causal", False)))
            if need_weights and not own_weights:
                weights = _softmax_weights(module, backend, q, k, v, kwargs, pattern)
            calls.append(AttentionCall(
                name=name, module=module, q=q.detach(), k=k.detach(), v=v.detach(),
                attn_mask=_detach(kwargs.get("attn_mask")),
                key_padding_mask=_detach(kwargs.get("key_padding_mask")),
                is_causal=bool(kwargs.get("is_causal", False)), heads=heads.detach(),
                weights=_detach(weights), pattern=pattern,
                query_padding_mask=_query_padding(
                    kwargs.get("key_padding_mask") if id(module) in self_attention
                    else target_padding.get(id(module)), q),
            ))
            return heads, weights

        return attend

    hooks = [m.register_forward_pre_hook(remember_target_padding, with_kwargs=True)
             for m in model.modules() if isinstance(m, DecoderBlock) and m.cross_attn is not None]
    hooks.append(model.register_forward_pre_hook(remember_input_padding, with_kwargs=True))
    try:
        for name, module in attention_modules(model).items():
            if isinstance(module, GradeTypedAttention):
                hooks.append(module.register_forward_hook(
                    _typed_attention_recorder(name, calls, input_padding), with_kwargs=True))
                continue
            patched.append((module, "attend", module.__dict__.get("attend")))
            module.attend = wrap(name, module, module.attend)
            patched.append((module, "attend_incremental",
                            module.__dict__.get("attend_incremental")))
            module.attend_incremental = _refuse_incremental(name, module)
        with activation_grading(model):  # attend's inputs ungraded, as documented
            yield calls
    finally:
        for hook in hooks:
            hook.remove()
        for module, attr, previous in reversed(patched):  # nested captures unwind in order
            if previous is None:
                delattr(module, attr)
            else:
                setattr(module, attr, previous)


def _typed_attention_recorder(name: str, calls: list[AttentionCall],
                              input_padding: dict[str, Tensor | None]) -> Any:
    """A forward hook of a :class:`GradeTypedAttention` that records its call: per-head Q, K, V
    (B, H, T, head_dim) from the block's own projections of the inputs it was given, the causal
    softmax weights softmax_s(⟨q_t, k_s⟩/√head_dim) over s ≤ t, which the fused kernel it runs
    on does not return, and the per-head outputs Σ_s A_ts v_s (before the output projection,
    or the head mean of ``identity_values``). The queries' padding is the model call's
    ``key_padding_mask`` (the block reads every token of the sequence; padding follows the
    real tokens, so their rows never see it)."""

    def hook(module: GradeTypedAttention, args: tuple[Any, ...], kwargs: dict[str, Any],
             _output: Tensor) -> None:
        x_src = args[0] if args else kwargs["x_src"]
        x_dst = args[1] if len(args) > 1 else kwargs["x_dst"]
        with torch.no_grad():
            q, k, v = module.heads(x_src, x_dst)
            t, dh = q.shape[-2], q.shape[-1]
            keep = causal_mask(t, t, q.device)
            weights = softmax_rows(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dh), keep)
            calls.append(AttentionCall(
                name=name, module=module, q=q, k=k, v=v, attn_mask=None, key_padding_mask=None,
                is_causal=True, heads=torch.matmul(weights, v), weights=weights,
                query_padding_mask=_query_padding(input_padding.get("mask"), q)))

    return hook


def _refuse_incremental(name: str, module: MultiheadAttention) -> Any:
    """A stand-in for ``attend_incremental`` during a capture: a backend that decodes cached
    positions through its own state (``sliding_window``, ``linear``, ...) keeps no keys, so
    the call has no Q, K, V to record; without this it would go unrecorded, silently."""

    def attend_incremental(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError(
            f"capture_attention cannot record attention layer {name!r}: its backend "
            f"{module.backend_name!r} decodes cached positions through its own state "
            "(attend_incremental), which holds no keys to record; capture a forward pass "
            "without a cache")

    return attend_incremental


def _query_padding(mask: Tensor | None, q: Tensor) -> Tensor | None:
    """``mask`` (detached) when it is the (B, Tq) padding of the queries ``q`` (B, H, Tq, d);
    None otherwise (no mask, or one over a KV cache longer than the new queries)."""
    if mask is None or tuple(mask.shape) != (q.shape[0], q.shape[-2]):
        return None
    return mask.detach()


def _pattern(backend: Any, q: Tensor, k: Tensor, is_causal: bool) -> Tensor | None:
    """The (Tq, Tk) keep-set of a sparse-pattern backend's self-attention call ((H, Tq, Tk)
    where the pattern differs between heads), or None."""
    pattern_keep = getattr(backend, "pattern_keep", None)
    if pattern_keep is None or q.shape[-2] != k.shape[-2]:
        return None
    return pattern_keep(q.shape[-2], is_causal, q.device, heads=q.shape[1])


def _softmax_weights(module: MultiheadAttention, backend: Any, q: Tensor, k: Tensor,
                     v: Tensor, kwargs: dict[str, Any], pattern: Tensor | None) -> Tensor:
    """softmax(Q Kᵀ · scale) of the call, over the keys its masks and ``pattern`` keep, with
    the module's grading applied to q and k as ``attend`` applies it (such backends take no
    custom score and no additive bias)."""
    q, k, _ = module.transform_heads(q, module.expand_kv(k), module.expand_kv(v))
    t_q, t_k = q.shape[-2], k.shape[-2]
    keep = pattern
    if kwargs.get("is_causal", False):
        causal = causal_mask(t_q, t_k, q.device)
        keep = causal if keep is None else keep & causal
    pad = kwargs.get("key_padding_mask")
    if pad is not None:
        keep = (~pad[:, None, None, :]) if keep is None else keep & ~pad[:, None, None, :]
    mask = kwargs.get("attn_mask")
    if mask is not None:
        keep = mask if keep is None else keep & mask
    scale = default_scale(getattr(backend, "scale", None), q.shape[-1])
    return softmax_rows(torch.matmul(q, k.transpose(-2, -1)) * scale, keep).detach()


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
