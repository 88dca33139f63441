"""Grade-typed causal multi-head attention as a block φ_{h←g} (004 §2.1.1, §4.1.2).

For head a: queries from the source grade at t, q_t = W_Q^{(a,g)} z_t^{(g)}; keys from
``key_source`` at s ≤ t; values from ``value_source`` at s ≤ t;
φ^{(a)}_{h←g}(z)_t = Σ_{s≤t} softmax_s(⟨q_t, k_s⟩/√d_q) U^{(a)} W_V^{(a)} z_s^{(value_source)}.

004 is inconsistent about the value grade: §2.1.1/§4.1.2 read values (and keys) from the
destination h, the parameter count of Prop 2.15 reads values from the source g (notes B4), so
both are offered; ``value_source="source"`` makes the block an actual transport V_g → V_h.
``identity_values=True`` fixes U W_V = Id (a typed copy, as the copy morphisms of App. A.3), which
needs the value grade to have the destination's dimension. Attention runs on the fused
``scaled_dot_product_attention`` kernel. The block is not linear in z^{(g)} (softmax), so the
linear-block theory of 004 does not strictly apply to it.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

from graded.morphic.blocks import _check_dims


class GradeTypedAttention(nn.Module):
    differentiable = True

    def __init__(
        self,
        d_src: int,
        d_dst: int,
        *,
        num_heads: int = 1,
        head_dim: int = 16,
        value_source: str = "dest",
        key_source: str = "dest",
        identity_values: bool = False,
    ) -> None:
        super().__init__()
        _check_dims(d_src=d_src, d_dst=d_dst, num_heads=num_heads, head_dim=head_dim)
        if not isinstance(identity_values, bool):
            raise ValueError(f"identity_values must be True or False, got {identity_values!r}")
        for name, v in (("value_source", value_source), ("key_source", key_source)):
            if v not in ("dest", "source"):
                raise ValueError(f"{name} must be 'dest' or 'source', got {v!r}")
        self.num_heads, self.head_dim = num_heads, head_dim
        self.d_in, self.d_out = d_src, d_dst
        self.value_source, self.key_source = value_source, key_source
        self.identity_values = identity_values
        d_key_in = d_dst if key_source == "dest" else d_src
        d_val_in = d_dst if value_source == "dest" else d_src
        self.q = nn.Linear(d_src, num_heads * head_dim, bias=False)
        self.k = nn.Linear(d_key_in, num_heads * head_dim, bias=False)
        if identity_values:
            if d_val_in != d_dst:
                raise ValueError(
                    f"identity_values needs the value grade dim ({d_val_in}) to equal "
                    f"d_dst ({d_dst})"
                )
            self.v = None
            self.out = None
        else:
            self.v = nn.Linear(d_val_in, num_heads * head_dim, bias=False)
            self.out = nn.Linear(num_heads * head_dim, d_dst, bias=False)

    def heads(self, x_src: Tensor, x_dst: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The per-head queries (of ``x_src``), keys and values (of the source or destination
        state, as ``key_source`` and ``value_source`` say): (B, H, T, head_dim) each, the
        values (B, H, T, d_h) with ``identity_values`` (the state itself, every head)."""
        b, t, _ = x_src.shape
        h, dh = self.num_heads, self.head_dim
        key_in = x_dst if self.key_source == "dest" else x_src
        val_in = x_dst if self.value_source == "dest" else x_src
        q = self.q(x_src).view(b, t, h, dh).transpose(1, 2)
        k = self.k(key_in).view(b, t, h, dh).transpose(1, 2)
        if self.identity_values:
            return q, k, val_in.unsqueeze(1).expand(b, h, t, val_in.shape[-1])
        return q, k, self.v(val_in).view(b, t, h, dh).transpose(1, 2)

    def forward(self, x_src: Tensor, x_dst: Tensor) -> Tensor:
        if (not isinstance(x_dst, Tensor) or x_src.dim() != 3
                or x_dst.shape[:-1] != x_src.shape[:-1]):
            raise ValueError(f"grade-typed attention reads z^(g) and z^(h) at the same tokens: "
                             f"expected x_src (B, T, {self.d_in}) and x_dst (B, T, {self.d_out}), "
                             f"got {tuple(x_src.shape)} and "
                             f"{tuple(getattr(x_dst, 'shape', ())) or type(x_dst).__name__}")
        q, k, v = self.heads(x_src, x_dst)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, dh or d_h)
        if self.identity_values:
            return y.mean(dim=1)
        b, t, _ = x_src.shape
        return self.out(y.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))
