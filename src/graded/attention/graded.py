"""Graded multi-head attention: 000 Def 5.13, Def 5.22 (LGT) and §6.2 (EGT).

The grading M = diag(m) acts on the head dimension d_k. Each variant is a diagonal scaling of
queries, keys or values, and those come out of a linear projection: q·m is the projection with
its rows rescaled, (W_q x + b_q)·m = (diag(m) W_q) x + m·b_q. So the grading is folded into the
projection weights (O(E·d) once per call, instead of O(B·T·d) on the activations) and the fused
``scaled_dot_product_attention`` kernel (or any backend) does the rest: graded attention costs
what plain attention costs, plus that rescaling.

==================  =========================================  ================  ==================
variant             formula (000 Def 5.22)                     activation form   folded form
==================  =========================================  ================  ==================
``"scores"``        (1) softmax(Q M Kᵀ/√d_k) V                 q ← q·m           W_q, b_q
``"queries_keys"``  (2) softmax((QM)(KM)ᵀ/√d_k) V              q ← q·m, k ← k·m  W_q, b_q, W_k, b_k
``"values"``        (4) softmax(Q Kᵀ/√d_k) (V M)               v ← v·m           W_v, b_v
``"multi_head"``    (3) softmax(Q_h M_h K_hᵀ/√d_k) V_h, per h  q ← q·m_h         W_q, b_q of head h
==================  =========================================  ================  ==================

The folded form (the default) multiplies the rows of the weights and biases listed by m, which
is the activation form: (W x + b)·m = (diag(m) W) x + m·b. The rows are laid out (head,
head_dim), so shared grades (head_dim,) repeat over the heads and per-head grades (num_heads,
head_dim) are flattened onto them (m_h on the rows of head h). The two forms are the same map
with the same gradients, up to rounding. :meth:`project` returns the folded parts graded, and
:meth:`transform_heads` grades on the activations (the activation form, after the projection)
only what is not folded:

- everything with ``fold_grading=False`` (the activation form, kept as the reference);
- a grading module that is not a plain diagonal :class:`~graded.grading.GradingMap`;
- queries and keys when the caller rotates them between :meth:`project` and :meth:`attend`
  (``qk_rotated=True``, rotary positions): a rotation of the pairs (2i, 2i+1) commutes with M
  only when m_{2i} = m_{2i+1}, which learnable grades need not keep, so the decision is
  structural; values are never rotated and stay folded;
- keys and values with ``add_bias_kv`` (the appended bias_k, bias_v are graded too), and under
  grouped-query attention with per-head grades (the heads of a group share one key and value
  projection, but not their grades).

A key-value cache between :meth:`project` and :meth:`attend` therefore holds keys and values
graded exactly when they are folded, and :meth:`attend` grades the rest, cached or new, so
cached and uncached decoding agree; ``fold_grading`` must not change while a cache is in use.
Code that must see the ungraded q, k, v between the stages (what :meth:`attend` received before
folding) switches folding off with :func:`graded.folding.activation_grading`.
:func:`graded.folding.graded_linear` scales the activations instead of the weight when that is
cheaper (a decoding step of a few tokens): still inside :meth:`project`.

``"queries_keys"`` applies M to both sides, so its bilinear form is Q M² Kᵀ: it *squares* the
grading relative to ``"scores"`` (λ^{2q} for EGT, f(q)² for LGT). 000 writes the variant's score
as qᵀ M k, which holds only if one side is left unscaled; we follow the formula Q' = MQ, K' = MK
and document the squaring (notes: seeds_001_004 §A, 001 Thm 4.6). ``"multi_head"`` is the
per-head form of ``"scores"`` (Def 5.22 (3) prints it with M on both Q_h and K_h; the text calls
it "distinct grade tuples per head", the property we keep; the printed form is
``"queries_keys"`` with per-head grades): grades must have shape (num_heads, head_dim).
Every other variant accepts shared (head_dim,) or per-head grades.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from graded.attention.multihead import MultiheadAttention
from graded.checks import check_bool
from graded.folding import _autocast_on
from graded.grading import ExponentialGrading, LinearGrading, is_diagonal

__all__ = [
    "PER_HEAD_VARIANTS",
    "VARIANTS",
    "GradedMultiheadAttention",
    "apply_grading",
    "grade_heads",
    "graded_parts",
    "make_grading",
    "packed_rows_together",
    "rows_together",
]

VARIANTS = ("scores", "queries_keys", "values", "multi_head")
# The variants whose grades are one tuple per head, shape (num_heads, head_dim).
PER_HEAD_VARIANTS = ("multi_head",)
# What each variant scales by M: "q", "k", "v" (the table above).
_GRADED_PARTS = {"scores": ("q",), "queries_keys": ("q", "k"), "values": ("v",),
                 "multi_head": ("q",)}


def graded_parts(variant: str) -> tuple[str, ...]:
    """The per-head tensors among ``"q"``, ``"k"``, ``"v"`` that ``variant`` scales by M, as
    in the table above: the one place that says it (the attention module, its folding and the
    rank diagnostics all read it)."""
    if variant not in _GRADED_PARTS:
        raise ValueError(f"unknown graded attention variant {variant!r}; expected one of "
                         f"{VARIANTS}")
    return _GRADED_PARTS[variant]


def apply_grading(grading: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """The activation form x ↦ x·m of ``grading``, in the dtype of the activations ``x``.

    A diagonal grading (:func:`~graded.grading.is_diagonal`) multiplies ``x`` by its scales
    cast to ``x``'s dtype, as the folded form casts them to the weight's dtype; per-head scales
    (heads, dim) act on the heads at axis -3 of ``x`` (batch, heads, tokens, dim), as
    :meth:`~graded.grading.GradingMap.forward`. Any other grading module runs on ``x`` and
    its output is cast to ``x``'s dtype. A grading held in another dtype than the model (say
    float64 grades beside float32 weights) would otherwise promote the activations, which the
    attention backends (one dtype for q, k and v) and the next layer refuse."""
    if not is_diagonal(grading) or grading.grades.dtype == x.dtype:
        y = grading(x)  # (a diagonal grading: its scales once, with its forward's checks)
        return y if not isinstance(y, Tensor) or y.dtype == x.dtype else y.to(x.dtype)
    m = grading.scales()
    if m.ndim == 2:  # per head: (heads, 1, dim) against (batch, heads, tokens, dim)
        m = m.unsqueeze(-2)
    return x * m.to(x.dtype)


def grade_heads(
    variant: str, grade: Callable[[Tensor], Tensor], q: Tensor, k: Tensor, v: Tensor, *,
    skip: tuple[str, ...] = (),
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-head queries, keys and values after the variant's diagonal grading ``grade``
    (x ↦ x·m over head_dim), as in the table above; the parts named in ``skip`` (already
    graded, folded into the projection) are returned as they are."""
    parts = graded_parts(variant)
    q, k, v = (grade(x) if name in parts and name not in skip else x
               for name, x in zip("qkv", (q, k, v)))
    return q, k, v


def make_grading(
    kind: str, dim: int, grades: Any = None, *, base: float = 2.0, f: str = "shift",
    learnable: bool = False, num_heads: int | None = None,
    device: torch.device | str | None = None, dtype: torch.dtype | None = None,
) -> LinearGrading | ExponentialGrading:
    """A LinearGrading (``kind="linear"``) or ExponentialGrading (``"exponential"``), its
    grades on ``device`` in ``dtype`` (None: as the grading's constructor decides)."""
    factory = {"device": device, "dtype": dtype}
    if kind == "linear":
        return LinearGrading(dim, grades, f=f, learnable=learnable, num_heads=num_heads,
                             **factory)
    if kind == "exponential":
        return ExponentialGrading(dim, grades, base=base, learnable=learnable,
                                  num_heads=num_heads, **factory)
    raise ValueError(f"grading must be 'linear' or 'exponential', got {kind!r}")


class GradedMultiheadAttention(MultiheadAttention):
    """Graded attention with the interface and parameters of :class:`MultiheadAttention`.

    Args:
        grading: ``"linear"`` (LGT, M = diag(f(q))), ``"exponential"`` (EGT, M = diag(λ^q)),
            or a ready grading module over ``head_dim`` features.
        grades: None (neutral: M = I, so the module equals plain attention), a tensor of shape
            (head_dim,) shared by all heads, or (num_heads, head_dim) for per-head grades;
            held in the module's dtype (``dtype``, or the default), as its projections.
        base: λ of the exponential grading. ``f``: the linear grading's function.
        learnable_grades: make the grades a Parameter.
        variant: one of ``"scores"``, ``"queries_keys"``, ``"values"``, ``"multi_head"``.
        fold_grading: fold the grading into the projection weights where that is exact (the
            module docstring); False applies it to the activations after the projection.
        qk_rotated: the caller rotates queries and keys between :meth:`project` and
            :meth:`attend` (rotary positions), so their grading is not folded.
        **mha_kwargs: everything :class:`MultiheadAttention` takes (dropout, bias, kdim, vdim,
            batch_first, backend, ...).

    The switches ``learnable_grades``, ``fold_grading`` and ``qk_rotated`` take True or False
    only (``TypeError`` otherwise): ``bool("false")`` is True, and 0 or 1 may be a count given
    to the wrong argument. So do :class:`MultiheadAttention`'s, those of each call
    (``need_weights``, ``average_attn_weights``, ``is_causal``) included.

    The state dict holds torch's keys plus ``grading.grades`` (and ``grading.base`` for EGT).
    A ``torch.nn.MultiheadAttention`` state dict loads strictly (the grades keep their current
    values); :meth:`torch_state_dict` gives one that torch's module loads strictly.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        grading: str | nn.Module = "linear",
        grades: Any = None,
        base: float = 2.0,
        f: str = "shift",
        learnable_grades: bool = False,
        variant: str = "scores",
        fold_grading: bool = True,
        qk_rotated: bool = False,
        **mha_kwargs: Any,
    ) -> None:
        learnable_grades = check_bool("learnable_grades", learnable_grades)
        fold_grading = check_bool("fold_grading", fold_grading)
        qk_rotated = check_bool("qk_rotated", qk_rotated)
        super().__init__(embed_dim, num_heads, **mha_kwargs)
        if variant not in VARIANTS:
            raise ValueError(f"unknown graded attention variant {variant!r}; expected one of "
                             f"{VARIANTS}")
        self.variant = variant
        if isinstance(grading, nn.Module):
            module = grading
        else:
            per_head = variant in PER_HEAD_VARIANTS and (grades is None or _ndim(grades) == 1)
            if per_head and grades is not None:
                raise ValueError(
                    f"variant {variant!r} needs per-head grades of shape (num_heads, head_dim) = "
                    f"({num_heads}, {self.head_dim}), got a shared tuple"
                )
            # the grades in the projections' dtype, not a grades tensor's: the parts graded on
            # the activations multiply them with the projected q, k, v
            module = make_grading(
                grading, self.head_dim, grades, base=base, f=f, learnable=learnable_grades,
                num_heads=num_heads if per_head else None, dtype=self.out_proj.weight.dtype,
            )
            if mha_kwargs.get("device") is not None:  # validated where the values are read
                module.to(device=mha_kwargs["device"])
        if getattr(module, "dim", self.head_dim) != self.head_dim:
            raise ValueError(
                f"the grading acts on {module.dim} features but head_dim is {self.head_dim}"
            )
        heads = getattr(module, "num_heads", None)
        if heads is not None and heads != num_heads:
            raise ValueError(f"per-head grades for {heads} heads, but num_heads={num_heads}")
        if variant in PER_HEAD_VARIANTS and heads is None:
            raise ValueError(f"variant {variant!r} needs per-head grades (num_heads, head_dim)")
        if getattr(module, "role", None) is None:
            module.role = "attention"  # see graded.grading.GradingMap.role
        self.grading = module
        self.fold_grading = fold_grading
        self.qk_rotated = qk_rotated
        self.register_load_state_dict_pre_hook(_note_plain_state_dict)
        self.register_load_state_dict_post_hook(_tolerate_missing_grading)

    def torch_state_dict(self) -> dict[str, Tensor]:
        """The state dict without the grading: loads strictly into torch's module."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("grading.")}

    @property
    def folded_parts(self) -> tuple[str, ...]:
        """The graded tensors among ``"q"``, ``"k"``, ``"v"`` whose grading :meth:`project`
        folds into the projection weights; :meth:`transform_heads` grades the others. Decided
        from the module's structure alone (the module docstring lists the conditions)."""
        # kept for the switches, the variant and the grading module it was worked out for (not
        # under the compiler, which traces it once)
        compiling = torch.compiler.is_compiling()
        key = (self.fold_grading, self.qk_rotated, self.variant, self._modules["grading"])
        kept = None if compiling else self._folded
        if kept is not None and kept[0] == key:
            return kept[1]
        folded: tuple[str, ...] = ()
        if self.fold_grading and is_diagonal(self.grading):
            per_head_kv = (self.grading.num_heads is not None
                           and self.num_kv_heads != self.num_heads)
            kv_apart = self.bias_k is not None or per_head_kv
            folded = tuple(p for p in graded_parts(self.variant)
                           if not (p in "qk" and self.qk_rotated)
                           and not (p in "kv" and kv_apart))
        if not compiling:
            self._folded = (key, folded)
        return folded

    _folded: tuple | None = None

    def projection_scales(self) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The diagonal of M on the rows (head, head_dim) of each projection it is folded
        into, shape (heads, head_dim): shared grades repeated over the heads (the key-value
        heads for k and v, a view), per-head grades as they are."""
        if not self.folded_parts:
            return None, None, None
        return self._projection_scales_of(self.grading.scales())

    def packed_projection_rows(self) -> Tensor | None:
        """The row scales of the packed ``in_proj_weight``; with fixed grades kept by the
        grading with its scales (:meth:`~graded.grading.GradingMap._kept_value`: returned
        again while the values it computes them from are unchanged) for the folded parts, the
        layout of the rows (one grading may serve modules of other widths), the autocast
        dtype and the weight's dtype and device: a few comparisons per pass instead of the
        scales' chain of calls."""
        folded = self.folded_parts
        if not folded:
            return super().packed_projection_rows()
        if self.grading.grades.requires_grad:  # learnable: new scales every pass, none kept
            return self._packed_rows(self._projection_scales_of(self.grading.scales()))
        weight = self.in_proj_weight
        key = ("packed rows", folded, self.shared_qk, weight.shape[0],
               _autocast_on(weight.device.type), weight.dtype, weight.device)
        return self.grading._kept_value(key, self.grading._sources(),
                                        super().packed_projection_rows)

    def _projection_scales_of(self, m: Tensor) -> tuple[Tensor | None, ...]:
        """:meth:`projection_scales` for the scales ``m`` of the grading, a leading axis (the
        layers of :func:`packed_rows_together`) allowed: (…, heads, head_dim) per folded part."""
        folded = self.folded_parts

        def rows(heads: int) -> Tensor:  # (…, heads, head_dim): flattened where it is used
            if self.grading.num_heads is not None:
                return m
            return m.unsqueeze(-2).expand(*m.shape[:-1], heads, self.head_dim)

        return (rows(self.num_heads) if "q" in folded else None,
                rows(self.num_kv_heads) if "k" in folded else None,
                rows(self.num_kv_heads) if "v" in folded else None)

    def packs_folded_rows(self) -> bool:
        """Whether self-attention projects through the packed ``in_proj_weight`` with part of
        the grading folded into its rows (what a model folds for all its layers at once,
        :class:`graded.folding.FoldedLinears`)."""
        return (bool(self.folded_parts) and self._qkv_same_embed_dim and not self.shared_qk
                and self.num_kv_heads == self.num_heads)

    def _rows_signature(self) -> tuple:
        """What layers must share for :func:`packed_rows_together` to build their rows in one
        chain: structure, the folded parts, and the scales' shape, dtype and device."""
        g = self.grading.grades
        return (self.variant, self.folded_parts, self.num_heads, self.num_kv_heads,
                self.head_dim, self.in_proj_weight.dtype, g.shape, g.dtype, g.device)

    def transform_heads(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The grading of the parts not folded into the projection, on the activations."""
        folded = self.folded_parts
        if len(folded) == len(graded_parts(self.variant)):
            return q, k, v  # every graded part is folded into the projection
        return grade_heads(self.variant, lambda x: apply_grading(self.grading, x), q, k, v,
                           skip=folded)

    def extra_repr(self) -> str:
        return (f"variant={self.variant!r}, fold_grading={self.fold_grading}, "
                f"qk_rotated={self.qk_rotated}")


def rows_together(layers: Sequence[GradedMultiheadAttention]) -> bool:
    """Whether :func:`packed_rows_together` builds the layers' rows in one chain: two or more
    alike layers (``_rows_signature``) with learnable grades."""
    if len(layers) < 2:
        return False
    signature = layers[0]._rows_signature()
    return all(m.grading.grades.requires_grad and m._rows_signature() == signature
               for m in layers)


def packed_rows_together(layers: Sequence[GradedMultiheadAttention],
                         stacked: Tensor | None = None) -> list[Tensor]:
    """The packed row scales of each layer (its :meth:`packed_projection_rows`), built in one
    chain of operators when :func:`rows_together` (learnable scales are new tensors every
    pass): the scales stacked, the rows of all layers in one concatenation, each layer's a
    view. The same values, the same
    gradients to the grades. Otherwise (fixed scales are kept by each layer) layer by
    layer. ``stacked``: the layers' scales stacked already, given by a caller that checked
    :func:`rows_together`."""
    if stacked is None and not rows_together(layers):
        return [m.packed_projection_rows() for m in layers]
    first = layers[0]
    # (L, head_dim) shared, (L, heads, head_dim) per head
    m = stacked if stacked is not None else torch.stack([layer.grading.scales()
                                                         for layer in layers])
    return list(first._packed_rows(first._projection_scales_of(m)).unbind(0))


def _note_plain_state_dict(module: nn.Module, state_dict: dict[str, Any], prefix: str,
                           *_: Any) -> None:
    """Load pre-hook: the prefix of this module's grading keys when ``state_dict`` holds none
    of them (a plain attention state dict), for :func:`_tolerate_missing_grading`."""
    own = prefix + "grading."
    plain = not any(k.startswith(own) for k in state_dict)
    module.__dict__["_plain_grading_prefix"] = own if plain else None


def _tolerate_missing_grading(module: nn.Module, keys: Any) -> None:
    """A plain attention state dict has no grading: keep the current grades when loading it.
    Only this module's grading keys, and only when all of them are absent: ``keys`` lists the
    missing keys of the whole load (other modules' ``grading`` too)."""
    own = module.__dict__.pop("_plain_grading_prefix", None)
    if own is None:
        return
    keys.missing_keys[:] = [k for k in keys.missing_keys if not k.startswith(own)]


def _ndim(grades: Any) -> int:
    if isinstance(grades, Tensor):
        return grades.dim()
    if isinstance(grades, (int, float)):
        return 0
    return 1 + (_ndim(grades[0]) if len(grades) and not isinstance(grades[0], (int, float))
                else 0)
