"""The attention-backend protocol: the base class, its capabilities and incremental decoding.

A backend receives per-head tensors already projected and split (002 Algorithm 1, steps after
the reshape): ``q`` (B, H, Tq, D), ``k`` (B, H, Tk, D), ``v`` (B, H, Tk, Dv), with the softmax
scaling *not* applied. Masks use the keep convention of
:func:`torch.nn.functional.scaled_dot_product_attention`: ``key_padding_mask`` (B, Tk) is ``True``
at padding (ignored keys); ``attn_mask`` is a boolean keep-mask (``True`` = may attend)
broadcastable to (B, H, Tq, Tk). Causal masks are aligned bottom-right (query ``i`` sits at
absolute position ``Tk - Tq + i``), as in :func:`graded.attention.functional.causal_mask`.

Convention shared by all backends: a query with no admissible key returns a zero vector (the
fused kernel alone would return NaN there).

What every backend shares beside the protocol has a module of its own, and is importable from
here too: the checks of a call's tensors and masks (:mod:`.inputs`), the checks of the options
and the properties that run them (:mod:`.options`), and the softmax arithmetic of the exact
backends (:mod:`.softmax`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from graded.attention.backends.inputs import (
    check_inputs,
    check_self_attention,
    empty_output,
    reject_attn_mask,
)
from graded.attention.backends.options import (
    check_bool_option,
    check_int_option,
    check_kernel,
    check_option,
    check_scale,
    check_seed,
    checked_bool_option,
    checked_int_option,
    checked_option,
    fixed_option,
)
from graded.attention.backends.softmax import compute_dtype, default_scale, softmax_rows
from graded.checks import check_bool

__all__ = [
    "FEATURES",
    "AttentionBackend",
    "Capabilities",
    "DecodeState",
    "PatternDecoding",
    "capabilities_of",
    "check_bool_option",
    "check_inputs",
    "check_int_option",
    "check_kernel",
    "check_option",
    "check_scale",
    "check_seed",
    "check_self_attention",
    "checked_bool_option",
    "checked_int_option",
    "checked_option",
    "compute_dtype",
    "decodes_with_state",
    "default_scale",
    "empty_output",
    "fixed_option",
    "reject_attn_mask",
    "softmax_rows",
]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can serve; each backend class states it once, as ``capabilities``.

    ``causal``: ``is_causal=True`` (decoders, LMs); ``cross_attention``: Tq ≠ Tk (seq2seq);
    ``key_padding_mask``; ``attn_bias``: an additive float bias on the scores (ALiBi,
    Press et al. 2022); ``custom_score``: a score function other than scaled dot (002 §2.4,
    passed as ``score=``); ``attention_weights``: ``forward_with_weights`` returns the weights
    of the attention it computes; ``incremental``: decoding one query at a time against cached
    keys (Tq = 1 < Tk, causal, bottom-right aligned) equals the full computation. A backend
    with ``incremental`` either takes the whole cached key/value sequence each step (the dense
    backends) or keeps a state of its own through :meth:`AttentionBackend.decode` (a rolling
    window, the running sums of kernel attention, the cached keys of a sparse pattern).
    ``shift_invariant``: a row's output at its real tokens does not depend on how many masked
    padding slots come before them (dense attention; a pattern placed relative to each query,
    as a window); a pattern placed by slot index (blocks, chunks, summary positions) is not,
    and generation decodes a left-padded batch by real length for it.
    """

    causal: bool = False
    cross_attention: bool = False
    key_padding_mask: bool = False
    attn_bias: bool = False
    custom_score: bool = False
    attention_weights: bool = False
    incremental: bool = False
    shift_invariant: bool = False


FEATURES: dict[str, str] = {
    "causal": "causal (decoder) attention",
    "cross_attention": "cross-attention (query and key lengths differ)",
    "key_padding_mask": "a key_padding_mask",
    "attn_bias": "an additive float attention bias (e.g. ALiBi positions)",
    "custom_score": "a custom score function (attn_score other than 'scaled_dot')",
    "attention_weights": "attention weights (need_weights=True)",
    "incremental": "incremental decoding with a KV cache (generate with use_cache=True)",
    "shift_invariant": "left padding that leaves a row's output as without it",
}


class AttentionBackend(nn.Module):
    """Base class of attention backends: ``forward(q, k, v, *, key_padding_mask, attn_mask,
    is_causal, dropout_p) -> (B, H, Tq, Dv)``. Subclasses set ``name`` and ``capabilities``
    (:class:`Capabilities`) and are registered with
    :func:`graded.attention.backends.register_backend`. A backend whose capabilities include
    ``custom_score`` also takes ``score=``; one with ``attn_bias`` takes a float (additive)
    ``attn_mask``; one with ``attention_weights`` has ``forward_with_weights`` returning
    ``(output, weights)``. A backend module that does not subclass this and states no
    capabilities is treated as :data:`UNDECLARED`: causal, cross-attention and padding only.

    Options a backend reads at its calls (``scale``, ``kernel``, block sizes, windows, ...)
    are properties made by :func:`checked_option`: set after construction, they are checked
    as the constructor checks them and take effect at the next call. Options that shape what
    the constructor built (parameters, or the projections of the attention module around the
    backend) are made by :func:`fixed_option`: set to another value later, they are refused.

    ``is_causal`` takes True or False only (a NumPy bool too), in every backend and in the
    public functions they compute with (``causal`` there): ``TypeError`` naming the backend and
    the value otherwise, since read truthily ``is_causal="false"`` would mask the future and 1
    may be a count given to the wrong argument. The check of a Python bool is one type
    comparison (a constant under ``torch.compile``)."""

    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    # the softmax temperature of the backends that take one (None: 1/√D), checked when set
    scale = checked_option("scale", check_scale)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle (``torch.load`` of a whole module, ``copy.deepcopy``, a worker process),
        also a backend pickled before its options were properties: that one holds each option
        as a plain attribute (``scale``, ``window``, ...), hidden by the property, which reads
        its slot (``_scale``, ...). Such an attribute moves to the slot (a value the class now
        derives, a read-only property such as ``horizon``, is dropped), checked as the
        constructor checks it (a value set after construction was not checked then: a
        ``window`` of 0, ``"false"`` for a bool), so the old pickle loads and computes as it
        did or is refused naming the option. A subclass whose slots are not ``_<option>``
        renames them first."""
        super().__setstate__(state)
        moved = []
        for name in [n for n in self.__dict__ if not n.startswith("_")]:
            attr = inspect.getattr_static(type(self), name, None)
            if isinstance(attr, property):
                value = self.__dict__.pop(name)
                if attr.fset is not None:
                    self.__dict__.setdefault(f"_{name}", value)
                    moved.append((name, attr.fset))
        for name, set_ in moved:  # once all are in place: checks may read other options
            value = self.__dict__[f"_{name}"]
            try:
                set_(self, value)
            except (AttributeError, TypeError, ValueError) as exc:
                raise ValueError(f"a {self.name} backend unpickled with {name}={value!r}, a "
                                 f"value its options refuse: {exc}") from None

    def check_attention_dropout(self, dropout_p: float) -> None:
        """Refuse an attention dropout this backend cannot apply; none here. The attention
        module calls it when it is built, with its own dropout, so that a model the backend
        cannot train is refused then rather than at its first training step."""

    def forward(  # pragma: no cover - interface
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        raise NotImplementedError

    def decode(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: DecodeState | None,
        *,
        key_padding_mask: Tensor | None = None,
        dropout_p: float = 0.0,
    ) -> tuple[Tensor, DecodeState]:
        """Causal attention of the newest positions: ``q, k, v`` (B, H, Tn, ·) are the new
        positions only, ``key_padding_mask`` (B, Tn) their padding, ``state`` what the previous
        call returned (None at the start). Returns the new positions' outputs and the next
        state. Backends that attend over the whole cache (the dense ones) do not override it."""
        raise NotImplementedError(f"{self.name} backend keeps no decoding state")

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


@dataclass
class DecodeState:
    """What a backend keeps between decoding steps (:meth:`AttentionBackend.decode`):
    ``length``, the number of positions decoded so far, and batch-first tensors (keys, values
    and padding of a window, or running sums). Beam search reorders it with :meth:`reorder`.
    ``source`` is what the backend computed the tensors from, for it to check at the next step
    (a performer's feature draw: sums of other features cannot be continued); None where
    nothing is recorded."""

    length: int = 0
    tensors: dict[str, Tensor] = field(default_factory=dict)
    source: object = None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` of every tensor (beam search)."""
        self.tensors = {k: t.index_select(0, index) for k, t in self.tensors.items()}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def decodes_with_state(backend: object) -> bool:
    """Whether ``backend`` decodes through a :class:`DecodeState` of its own (its class
    overrides :meth:`AttentionBackend.decode`) rather than attending over the whole cache."""
    decode = getattr(type(backend), "decode", None)
    return decode is not None and decode is not AttentionBackend.decode


class PatternDecoding:
    """Incremental decoding of a causal positional pattern (a mixin for pattern backends).

    A pattern backend states its keep-set by :meth:`keep` on absolute positions (query ``i``,
    key ``j``, causality applied on top) and :attr:`horizon`, the number of most recent
    positions a later query can still see (None: unbounded). The first call (an empty state,
    the prompt) runs the backend's own forward pass; each later call attends the new queries
    over the kept keys with the pattern's mask, so decoding equals the causal forward pass over
    the whole sequence whenever the pattern of a position does not depend on later positions
    (true of every pattern here). Memory O(horizon) per layer for a windowed pattern."""

    horizon: int | None = None
    per_head_keep: bool = False  # the pattern differs between heads: keep(q, k, head)

    def keep(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:  # pragma: no cover - interface
        """Bool keep-set of absolute query positions ``q_pos`` (n, 1) and keys ``k_pos``
        (1, m), before causality. A backend with :attr:`per_head_keep` takes a third
        argument, broadcastable head indices (H, 1, 1), and returns (H, n, m)."""
        raise NotImplementedError

    def pattern_keep(self, t: int, is_causal: bool, device: torch.device | None = None,
                     heads: int | None = None) -> Tensor:
        """The (T, T) bool keep-set of a self-attention call of length ``t``, causality
        included: the keys each query's softmax runs over (used to show the weights of the
        attention the pattern computes). With :attr:`per_head_keep` the (H, T, T) keep-sets
        of ``heads`` heads, which it then needs; other backends ignore ``heads``."""
        if type(is_causal) is not bool:  # the bool itself passes on one comparison
            is_causal = check_bool(f"{self.name} backend: is_causal", is_causal)
        pos = torch.arange(t, device=device)
        keep = self.keep(pos[:, None], pos[None, :], *self._heads(heads, device))
        return keep & (pos[None, :] <= pos[:, None]) if is_causal else keep

    def _heads(self, heads: int | None, device: torch.device | None) -> tuple[Tensor, ...]:
        """The head argument of :meth:`keep`: none for a pattern shared by the heads."""
        if not self.per_head_keep:
            return ()
        if heads is None:
            raise ValueError(f"{self.name} backend: each head has its own keep-set; pass the "
                             "number of heads (pattern_keep(..., heads=H))")
        return (torch.arange(heads, device=device)[:, None, None],)

    def decode(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: DecodeState | None,
        *,
        key_padding_mask: Tensor | None = None,
        dropout_p: float = 0.0,
    ) -> tuple[Tensor, DecodeState]:
        check_inputs(self.name, q, k, v, key_padding_mask, None, dropout_p)
        b, _, t_new, _ = q.shape
        pad = (torch.zeros(b, t_new, dtype=torch.bool, device=q.device)
               if key_padding_mask is None else key_padding_mask)
        if state is None or state.length == 0:
            out = self.forward(q, k, v, key_padding_mask=key_padding_mask, is_causal=True,
                               dropout_p=dropout_p)
            keys, values, pads, length = k, v, pad, t_new
        else:
            keys = torch.cat([state.tensors["k"], k], dim=2)
            values = torch.cat([state.tensors["v"], v], dim=2)
            pads = torch.cat([state.tensors["pad"], pad], dim=1)
            length = state.length + t_new
            q_pos = torch.arange(state.length, length, device=q.device)[:, None]
            k_pos = torch.arange(length - keys.shape[2], length, device=q.device)[None, :]
            allowed = (self.keep(q_pos, k_pos, *self._heads(q.shape[1], q.device))
                       & (k_pos <= q_pos))  # ([H,] new, kept)
            allowed = allowed.reshape(1, -1, *allowed.shape[-2:]) & ~pads[:, None, None, :]
            scale = default_scale(getattr(self, "scale", None), q.shape[-1])
            acc = compute_dtype(q.dtype)  # half precision computed in float32, rounded once
            scores = torch.matmul(q.to(acc), keys.to(acc).transpose(-2, -1)) * scale
            weights = softmax_rows(scores, allowed)
            if dropout_p > 0.0:
                weights = torch.nn.functional.dropout(weights, p=dropout_p)
            out = torch.matmul(weights, values.to(acc)).to(v.dtype)
        if self.horizon is not None and keys.shape[2] > self.horizon:
            keys, values = keys[:, :, -self.horizon:], values[:, :, -self.horizon:]
            pads = pads[:, -self.horizon:]
        return out, DecodeState(length, {"k": keys, "v": values, "pad": pads})


UNDECLARED = Capabilities(causal=True, cross_attention=True, key_padding_mask=True)


def capabilities_of(backend: object) -> Capabilities:
    """The declared :class:`Capabilities` of a backend instance or class (:data:`UNDECLARED`
    for a module that declares none); a :class:`Capabilities` is returned as it is."""
    if isinstance(backend, Capabilities):
        return backend
    caps = getattr(backend, "capabilities", None)
    return caps if isinstance(caps, Capabilities) else UNDECLARED
