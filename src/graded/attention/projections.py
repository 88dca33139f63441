"""The projections of multi-head attention: the packed Q/K/V input projection into heads and
the output projection of the merged heads (002 §3, 000 §4).

:class:`HeadProjections` is the base of :class:`~graded.attention.multihead.MultiheadAttention`:
it makes the projection parameters with torch's names and layout (a packed ``in_proj_weight``
when keys and values have the embedding's size, else ``q_proj_weight``, ``k_proj_weight``,
``v_proj_weight``; ``in_proj_bias``; ``out_proj``) and holds the stages around attention
itself: :meth:`~HeadProjections.project` (with the row scales a grading folds into the
projections, :meth:`~HeadProjections.projection_scales`), :meth:`~HeadProjections.split_heads`,
:meth:`~HeadProjections.expand_kv` (grouped-query attention) and
:meth:`~HeadProjections.merge`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graded.folding import folds_rows, graded_linear

__all__ = ["HeadProjections"]


def _unbind_blocks(packed: Tensor, blocks: int, heads: int) -> tuple[Tensor, ...]:
    """The ``blocks`` projections of a packed (B, T, blocks·heads·head_dim) tensor, each
    (B, T, heads, head_dim): views, taken with ``unbind`` so that the backward writes their
    gradients into one (B, T, blocks, heads, head_dim) tensor in one kernel. Indexing the
    blocks (torch's module does) costs a zero-filled tensor of the packed size per block and
    their sums, some five passes over it more."""
    return packed.unflatten(-1, (blocks, heads, -1)).unbind(2)


class HeadProjections(nn.Module):
    """The input and output projections of multi-head attention, the base of
    :class:`~graded.attention.multihead.MultiheadAttention`, whose constructor sets the sizes
    read here (``embed_dim``, ``kdim``, ``vdim``, ``num_heads``, ``num_kv_heads``,
    ``head_dim``, ``kv_dim``, ``shared_qk``, ``backend_name``) before it calls
    :meth:`_make_projections`."""

    def _make_projections(self, bias: bool, out_bias: bool | None, factory: dict) -> None:
        """Register the projection parameters in torch's order: the packed ``in_proj_weight``
        or the three separate weights, ``in_proj_bias``, then ``out_proj`` (its bias as
        ``bias`` when ``out_bias`` is None)."""
        embed_dim = self.embed_dim
        # rows: queries (E), keys, values (kv_dim each); no keys with shared QK
        self._proj_rows = [embed_dim] + ([] if self.shared_qk else [self.kv_dim]) + [self.kv_dim]
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(
                torch.empty(sum(self._proj_rows), embed_dim, **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(sum(self._proj_rows), **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.modules.linear.NonDynamicallyQuantizableLinear(
            embed_dim, embed_dim, bias=bias if out_bias is None else out_bias, **factory
        )

    def project(
        self, query: Tensor, key: Tensor | None, value: Tensor | None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Batch-first (B, T, ·) inputs to per-head (B, H, T, head_dim) queries, keys, values,
        each projection's rows scaled by :meth:`projection_scales` (folded into the weight).

        ``key``/``value`` may be None to project the queries only (cached cross-attention).
        """
        e, kv = self.embed_dim, self.kv_dim
        b = self.in_proj_bias
        held = self.__dict__.get("_held_fold")  # the packed weight folded with other layers'
        if (held is not None and query is key and key is value
                and folds_rows(self.in_proj_weight, query)):
            return self._packed_heads(F.linear(query, *held()))
        grouped = self.num_kv_heads != self.num_heads
        if (not self.shared_qk and self._qkv_same_embed_dim and query is key and key is value
                and not grouped):
            return self._packed_heads(graded_linear(query, self.in_proj_weight, b,
                                                    out_scales=self.packed_projection_rows()))
        if self.shared_qk:
            return self._project_shared_qk(query, key, value)
        s_q, s_k, s_v = self.projection_scales()
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.split([e, kv, kv])
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q, b_k, b_v = (None, None, None) if b is None else b.split([e, kv, kv])
        s_q, s_k, s_v = (None if s is None else s.reshape(-1) for s in (s_q, s_k, s_v))
        q = self.split_heads(graded_linear(query, w_q, b_q, out_scales=s_q))
        k = None if key is None else self.split_heads(
            graded_linear(key, w_k, b_k, out_scales=s_k), self.num_kv_heads)
        v = None if value is None else self.split_heads(
            graded_linear(value, w_v, b_v, out_scales=s_v), self.num_kv_heads)
        return q, k, v

    def _packed_heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, 3E) packed projections -> per-head (B, H, T, head_dim) q, k, v."""
        q, k, v = (x.transpose(1, 2) for x in _unbind_blocks(qkv, 3, self.num_heads))
        return q, k, v

    def packs_folded_rows(self) -> bool:
        """Whether self-attention projects through the packed ``in_proj_weight`` with a
        grading folded into its rows (:meth:`projection_scales`): never here, see graded
        attention."""
        return False

    def _project_shared_qk(self, query: Tensor, key: Tensor | None, value: Tensor | None
                           ) -> tuple[Tensor, Tensor, Tensor]:
        """Shared-QK projection: queries and values from the packed (2E, E) weight; the keys
        passed on are the queries (the backend normalises them)."""
        if key is not query or value is not query:
            raise ValueError(
                f"attention backend {self.backend_name!r} with shared_qk=True attends a "
                "sequence to itself: query, key and value must be the same tensor")
        qv = graded_linear(query, self.in_proj_weight, self.in_proj_bias,
                           out_scales=self.packed_projection_rows())
        q, v = (x.transpose(1, 2) for x in _unbind_blocks(qv, 2, self.num_heads))
        return q, q, v

    def packed_projection_rows(self) -> Tensor | None:
        """The row scales of the packed ``in_proj_weight`` (its blocks: query, key and value;
        query and value with ``shared_qk``) from :meth:`projection_scales`, or None when no
        block is scaled."""
        s_q, s_k, s_v = self.projection_scales()
        return self._packed_row_scales((s_q, s_v) if self.shared_qk else (s_q, s_k, s_v))

    def _packed_row_scales(self, scales: tuple[Tensor | None, ...]) -> Tensor | None:
        """The row scales of the packed ``in_proj_weight`` from one (heads, head_dim) scale
        tensor (or None: 1) per block of rows (``_proj_rows``), in one concatenation; None
        when every block is unscaled."""
        if all(s is None for s in scales):
            return None
        return self._packed_rows(scales)

    def _packed_rows(self, scales: tuple[Tensor | None, ...]) -> Tensor:
        """The rows of the packed ``in_proj_weight`` from one (…, heads, head_dim) scale tensor
        (or None: 1) per block of rows, in one concatenation: (…, rows), leading axes (layers
        stacked) kept. At least one block is scaled."""
        weight = self.in_proj_weight
        one = self._one
        if one is None or one.dtype != weight.dtype or one.device != weight.device:
            one = weight.new_ones(())
            if not (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()):
                self._one = one  # a constant, made once per dtype and device (not an
                # inference tensor: a later pass with autograd could not save it)
        lead = next(s.shape[:-2] for s in scales if s is not None)
        blocks = [one.expand(*lead, n // self.head_dim, self.head_dim) if s is None
                  else s.to(one) for s, n in zip(scales, self._proj_rows, strict=True)]
        return torch.cat(blocks, dim=-2).flatten(-2)

    _one: Tensor | None = None

    def projection_scales(self) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """Scales of the output rows of the query, key and value projections, shapes
        (H, head_dim), (H_kv, head_dim), (H_kv, head_dim), or None for none: a diagonal map
        after a projection, folded into it (:func:`graded.folding.graded_linear`). None here;
        graded attention folds its grading in (000 Def 5.22)."""
        return None, None, None

    def split_heads(self, x: Tensor, heads: int | None = None) -> Tensor:
        """(B, T, heads·head_dim) -> (B, heads, T, head_dim); ``heads`` defaults to H."""
        heads = self.num_heads if heads is None else heads
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def expand_kv(self, x: Tensor) -> Tensor:
        """Keys or values of the ``num_kv_heads`` groups, (B, H_kv, T, d), repeated for the
        heads of each group: (B, H, T, d), head i using group i // (H / H_kv) (Ainslie et al.
        2023, as LLaMA's ``repeat_kv``). The identity without grouping."""
        if x.shape[1] == self.num_heads:
            return x
        return x.repeat_interleave(self.num_heads // x.shape[1], dim=1)

    def merge(self, heads: Tensor) -> Tensor:
        """(B, H, T, head_dim) -> output projection of the concatenated heads, (B, T, E)."""
        return self.out_proj(heads.transpose(1, 2).flatten(-2))
