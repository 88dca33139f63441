"""The checks of :class:`~graded.attention.multihead.MultiheadAttention`'s arguments, and the
conversion of its masks from torch's convention to SDPA's.

Construction arguments are checked once (:func:`check_sizes`, :func:`check_kv_heads`,
:func:`check_shared_qk`, :func:`check_backend`); the inputs and masks of every call
(:func:`check_inputs`, :func:`canonical_attn_mask`, :func:`canonical_padding_mask`). At the
public boundary a boolean mask is ``True`` where attention is *not* allowed (torch's
convention); :func:`canonical_attn_mask` turns it into a keep-mask (``True`` = may attend,
SDPA's). A float mask is added, in either convention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from graded.attention.scores import ScaledDotScore
from graded.checks import check_float
from graded.folding import _autocast_on

if TYPE_CHECKING:
    from graded.attention.multihead import MultiheadAttention

__all__ = [
    "canonical_attn_mask",
    "canonical_padding_mask",
    "check_backend",
    "check_input_dtypes",
    "check_inputs",
    "check_kv_heads",
    "check_mask_dtype",
    "check_shared_qk",
    "check_sizes",
    "pad_masks",
]


def check_sizes(embed_dim: int, num_heads: int, dropout: float, kdim: int | None,
                vdim: int | None) -> float:
    """Refuse sizes that are not positive ints (a bool is not one), an ``embed_dim`` that
    ``num_heads`` does not divide, and a dropout outside [0, 1). Returns the dropout as a
    float."""
    if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or embed_dim <= 0:
        raise ValueError(f"embed_dim must be a positive int, got {embed_dim!r}")
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    if embed_dim % num_heads != 0:
        raise ValueError(
            f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
        )
    dropout = check_float("dropout", dropout, minimum=0.0)  # no bool, NaN or string
    if not dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    for name, dim in (("kdim", kdim), ("vdim", vdim)):
        if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool)
                                or dim <= 0):
            raise ValueError(f"{name} must be None (embed_dim) or a positive int, got "
                             f"{dim!r}")
    return dropout


def check_kv_heads(num_kv_heads: int | None, num_heads: int, qkv_same_embed_dim: bool,
                   add_bias_kv: bool) -> int:
    """The number of key/value heads of grouped-query attention (``num_heads`` for None): a
    positive divisor of ``num_heads``; fewer heads need kdim = vdim = embed_dim and no
    ``add_bias_kv``."""
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if (not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1
            or num_heads % kv_heads):
        raise ValueError(f"num_kv_heads must be a positive divisor of num_heads={num_heads}, "
                         f"got {num_kv_heads!r}")
    if kv_heads != num_heads and (not qkv_same_embed_dim or add_bias_kv):
        raise ValueError("grouped-query attention (num_kv_heads < num_heads) needs "
                         "kdim = vdim = embed_dim and add_bias_kv=False")
    return kv_heads


def check_shared_qk(m: MultiheadAttention, add_bias_kv: bool) -> None:
    """Reformer's shared-QK attention (Kitaev et al. 2020, §2): the backend takes its keys
    from the queries (normalised), so the module has no key projection: the packed
    ``in_proj_weight`` (and bias) holds the query rows, then the value rows."""
    if not m._qkv_same_embed_dim or m.num_kv_heads != m.num_heads or add_bias_kv:
        raise ValueError(
            f"attention backend {m.backend_name!r} with shared_qk=True needs kdim = vdim "
            f"= embed_dim, num_kv_heads = num_heads and add_bias_kv=False (its keys are "
            f"its queries), got kdim={m.kdim}, vdim={m.vdim}, num_kv_heads="
            f"{m.num_kv_heads}, add_bias_kv={add_bias_kv}")


def check_backend(m: MultiheadAttention) -> None:
    """Refuse at build time what the backend cannot serve: its declared capabilities, and an
    attention dropout it cannot apply (``check_attention_dropout``; a kernel backend, which
    never forms the weights, refused it only at the first training call)."""
    if m.backend is None:
        return
    from graded.attention.backends import check_capability

    check_dropout = getattr(m.backend, "check_attention_dropout", None)
    if check_dropout is not None:  # a backend module of another library may not have it
        check_dropout(m.dropout)

    if not isinstance(m.score, ScaledDotScore):
        check_capability(m.backend, m.backend_name, "custom_score",
                         f" (score={type(m.score).__name__})")


def check_mask_dtype(name: str, mask: Tensor) -> None:
    """Refuse a mask (``name`` in the error) that is neither boolean nor floating."""
    if mask.dtype != torch.bool and not torch.is_floating_point(mask):
        raise TypeError(f"{name} must be a bool or floating tensor, got dtype {mask.dtype}")


def check_inputs(m: MultiheadAttention, query: Tensor, key: Tensor, value: Tensor) -> bool:
    """Refuse ``query``, ``key``, ``value`` that do not fit ``m`` (their dimensions, feature
    sizes, lengths and batch sizes); returns whether they are batched (3-D)."""
    if query.dim() not in (2, 3):
        raise ValueError(
            "query must be 2-D (length, embed_dim) or 3-D "
            f"({'batch, length' if m.batch_first else 'length, batch'}, embed_dim); "
            f"got shape {tuple(query.shape)}"
        )
    if key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(
            f"query, key and value must have the same number of dimensions; got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    for name, x, dim in (("query", query, m.embed_dim), ("key", key, m.kdim),
                         ("value", value, m.vdim)):
        if x.shape[-1] != dim:
            raise ValueError(
                f"{name} has feature size {x.shape[-1]} (shape {tuple(x.shape)}), "
                f"expected {dim}"
            )
    check_input_dtypes(m, query, key, value)
    seq = 1 if (query.dim() == 3 and m.batch_first) else 0
    if key.shape[seq] != value.shape[seq]:
        raise ValueError(
            f"key and value must have the same length; got shapes {tuple(key.shape)} and "
            f"{tuple(value.shape)}"
        )
    if query.dim() == 3:
        bdim = 0 if m.batch_first else 1
        if not query.shape[bdim] == key.shape[bdim] == value.shape[bdim]:
            raise ValueError(
                f"query, key and value batch sizes differ: {tuple(query.shape)}, "
                f"{tuple(key.shape)}, {tuple(value.shape)} (batch_first={m.batch_first})"
            )
    return query.dim() == 3


def check_input_dtypes(m: MultiheadAttention, query: Tensor, key: Tensor, value: Tensor
                       ) -> None:
    """Refuse a ``query``, ``key`` or ``value`` whose dtype is not the dtype of ``m``'s
    parameters, naming it (the projection would fail on "mat1 and mat2", naming neither),
    except under autocast on the query's device, which casts both to its own dtype."""
    dtype = m.out_proj.weight.dtype
    if query.dtype == key.dtype == value.dtype == dtype:  # the common case: three comparisons
        return
    if _autocast_on(query.device.type) is not None:
        return
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dtype != dtype:
            raise TypeError(
                f"{name} has dtype {x.dtype}, but the attention's parameters are {dtype}; "
                f"convert the inputs or the module (.to({dtype}) or .to({x.dtype})), or run "
                "under torch.autocast")


def canonical_attn_mask(
    attn_mask: Tensor | None, bsz: int, num_heads: int, t_q: int, t_k: int,
    batched: bool = True,
) -> Tensor | None:
    """torch's (Tq, Tk) or (B·H, Tq, Tk) mask -> keep or additive mask (B|1, H|1, Tq, Tk);
    for an unbatched query (``batched=False``, B = 1) the 3-D mask is (H, Tq, Tk)."""
    if attn_mask is None:
        return None
    check_mask_dtype("attn_mask", attn_mask)
    if attn_mask.dim() == 2 and attn_mask.shape == (t_q, t_k):
        mask = attn_mask[None, None]
    elif attn_mask.dim() == 3 and attn_mask.shape == (bsz * num_heads, t_q, t_k):
        mask = attn_mask.view(bsz, num_heads, t_q, t_k)
    else:
        per_head = ("batch*num_heads, target, source" if batched else
                    "num_heads, target, source, for an unbatched (2-D) query")
        raise ValueError(
            f"attn_mask has shape {tuple(attn_mask.shape)}; expected ({t_q}, {t_k}) or "
            f"({bsz * num_heads}, {t_q}, {t_k}) ({per_head})"
        )
    return ~mask if mask.dtype == torch.bool else mask


def canonical_padding_mask(kpm: Tensor | None, bsz: int, t_k: int) -> Tensor | None:
    """torch's key_padding_mask (B, T_k): bool ``True`` = ignore, or additive float."""
    if kpm is None:
        return None
    check_mask_dtype("key_padding_mask", kpm)
    if kpm.shape != (bsz, t_k):
        raise ValueError(
            f"key_padding_mask has shape {tuple(kpm.shape)}; expected (batch, source "
            f"length) = ({bsz}, {t_k})"
        )
    return kpm


def pad_masks(
    mask: Tensor | None, kpm: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """Extend masks by one attendable key column (for bias_k/zero attention)."""
    if mask is not None:
        fill = True if mask.dtype == torch.bool else 0.0
        mask = F.pad(mask, (0, 1), value=fill)
    if kpm is not None:
        fill = False if kpm.dtype == torch.bool else 0.0
        kpm = F.pad(kpm, (0, 1), value=fill)
    return mask, kpm
