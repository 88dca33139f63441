"""Per-token router over an edge set (004 §4.2.1, §4.2.2, §4.7, Remark 4.12).

Context logits ℓ_t(h←g) = u(z_{<t})ᵀ W_{h←g} v_g(z_t^{(g)}), computed for every token (never a
batch mean, unlike 004 App. B), with u a causal pooling of the strictly earlier states (zeros at
t = 0) and v_g a grade-local projection cached per source grade. u and v are affine by default
(004 App. B has no bias), so the bilinear form also holds a pure-context and a pure-source term.

The kernel K the logits define and the routes drawn from it (the normalisations "dest",
"global" and "logistic" with their stay options; the modes "soft", "hard", "gumbel" and
"reinforce"; top-k) are :class:`graded.morphic.kernel.RoutingKernel`'s, which :class:`Router`
mixes in; :mod:`graded.morphic.kernel` states their formulas.

Router input (``input_type``), 004 leaves open what the router reads; here it is typed:

- "context" (default): the bilinear logits above, from the pooled context and the token's own
  source components (so the operand at t is read as well as the operator).
- "operator": ℓ_t(e) = ⟨a_e, E[o_t]⟩ + c_e, with o_t the type of the most recent operator token at
  a position ≤ t (one of ``operator_tokens``, index 1..n; 0 before any) and E a learned
  (n + 1, rank) table: routing is a function of the operator alone.
- "operator_state": ℓ_t(e) = ⟨a_e, W_u z_{s(t)} + b_u⟩ + c_e, with s(t) the position of that
  operator token and z_{s(t)} the layer's input state there (0 before any): the hidden state at
  the operator's position, which earlier layers may have mixed with other tokens.

The operator inputs need the token ids (``context_logits(..., input_ids=...)``, passed by
``MorphicTransformer``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from graded.checks import check_float
from graded.morphic.edges import EdgeSet
from graded.morphic.kernel import MODES, NORMALIZATIONS, Route, RoutingKernel, gate_weights
from graded.morphic.state import GradedStateSpace

__all__ = ["INPUT_TYPES", "MODES", "NORMALIZATIONS", "POOLINGS", "Route", "Router",
           "gate_weights"]

POOLINGS = ("mean", "last", "attention")
INPUT_TYPES = ("context", "operator", "operator_state")


class Router(RoutingKernel, nn.Module):
    def __init__(
        self, space: GradedStateSpace, edges: EdgeSet, *, rank: int = 16, pooling: str = "mean",
        temperature: float = 1.0, normalization: str = "dest", mode: str = "soft",
        affine: bool = True, init_std: float = 0.02, gumbel_temperature: float = 1.0,
        stay: bool = True, top_k: int = 1, input_type: str = "context",
        operator_tokens: Sequence[int] = (),
    ) -> None:
        super().__init__()
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        # a temperature of 0 or below, or NaN, would route silently wrong rather than fail
        temperature = check_float("temperature", temperature, minimum=0, strict_min=True)
        gumbel_temperature = check_float("gumbel_temperature", gumbel_temperature, minimum=0,
                                         strict_min=True)
        # NaN would fill the bilinear weights with NaN, a negative std fails deep in nn.init
        init_std = check_float("init_std", init_std, minimum=0)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"rank must be a positive int, got {rank!r}")
        if not isinstance(stay, bool):
            raise ValueError(f"stay must be True or False, got {stay!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
        if top_k > 1 and (mode != "hard" or normalization == "logistic"):
            raise ValueError(f"top_k={top_k} needs mode 'hard' and a softmax normalisation "
                             f"('global' or 'dest'), got mode {mode!r}, normalization "
                             f"{normalization!r}")
        if input_type not in INPUT_TYPES:
            raise ValueError(f"input_type must be one of {INPUT_TYPES}, got {input_type!r}")
        operator_tokens = list(operator_tokens)
        if input_type == "context" and operator_tokens:
            raise ValueError(f"operator_tokens are read only by input_type 'operator' or "
                             f"'operator_state', got them with {input_type!r}")
        if input_type != "context":
            bad = [t for t in operator_tokens
                   if isinstance(t, bool) or not isinstance(t, int) or t < 0]
            if not operator_tokens or bad or len(set(operator_tokens)) != len(operator_tokens):
                raise ValueError(f"input_type {input_type!r} needs operator_tokens: a non-empty "
                                 f"list of distinct token ids >= 0, got {operator_tokens!r}")
        self.space, self.edges = space, edges
        self.rank, self.pooling, self.temperature = rank, pooling, float(temperature)
        self.normalization, self.mode = normalization, mode
        self.gumbel_temperature, self.stay = gumbel_temperature, stay
        self.top_k, self.input_type = top_k, input_type
        self.register_buffer("operator_tokens", torch.tensor(operator_tokens, dtype=torch.long),
                             persistent=False)
        self.sources = list(dict.fromkeys(e.source for e in edges))
        # the edges grouped by source grade (contiguous spans), and back to the edge order
        order = [i for g in self.sources for i, e in enumerate(edges) if e.source == g]
        counts = [sum(e.source == g for e in edges) for g in self.sources]
        ends = torch.tensor(counts).cumsum(0).tolist()
        self.source_spans = [(end - n, end) for n, end in zip(counts, ends)]
        identity = order == list(range(len(edges)))
        self.edge_order = None if identity else order
        self.register_buffer("edge_position", torch.tensor(order).argsort(), persistent=False)
        if input_type != "context":
            # ℓ_t(e) = ⟨a_e, u_t⟩ + c_e with u_t the operator's embedding or projected state
            self.operator_head = nn.Linear(rank, len(edges))
            nn.init.normal_(self.operator_head.weight, std=init_std)
            nn.init.zeros_(self.operator_head.bias)
        if input_type == "operator":
            self.operator_embedding = nn.Embedding(len(operator_tokens) + 1, rank)
        else:
            self.proj_u = nn.Linear(space.total_dim, rank, bias=affine)
        if input_type == "context":
            self.proj_v = nn.ModuleDict({g: nn.Linear(space.dim(g), rank, bias=affine)
                                         for g in self.sources})
            self.bilinear = nn.Parameter(torch.randn(len(edges), rank, rank) * init_std)
        if pooling == "attention" and input_type == "context":
            self.pool_key = nn.Linear(space.total_dim, rank, bias=False)
            self.pool_query = nn.Parameter(torch.zeros(rank))
        self.init_kernel(edges, normalization, stay)

    # ----------------------------------------------------------- context
    def pool(self, z: Tensor, keys: Tensor | None = None) -> Tensor:
        """Causal summary c_t of the rows of z at positions < t (B, T, ·); c_0 = 0.

        ``keys`` (the full states) score the attention pooling when z is already projected.
        """
        b, t, _ = z.shape
        if self.pooling == "last":
            return F.pad(z[:, :-1], (0, 0, 1, 0))
        if self.pooling == "mean":
            prev = F.pad(z.cumsum(dim=1)[:, :-1], (0, 0, 1, 0))
            count = torch.arange(t, device=z.device, dtype=z.dtype).clamp(min=1).view(1, t, 1)
            return prev / count
        keys = z if keys is None else keys
        scores = (self.pool_key(keys) @ self.pool_query).unsqueeze(1).expand(b, t, t)  # [b, t, s]
        allowed = torch.ones(t, t, dtype=torch.bool, device=z.device).tril(-1)
        w = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        return w @ z

    def operator_index(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        """For every token (B, T): the position s(t) of the most recent operator token at a
        position ≤ t (−1 before any) and its type o_t ∈ {1..n} (index in ``operator_tokens``
        plus one; 0 before any)."""
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a (B, T) tensor of token ids, got "
                             f"{tuple(getattr(input_ids, 'shape', ()))}")
        match = input_ids.unsqueeze(-1) == self.operator_tokens.to(input_ids.device)  # (B,T,n)
        is_op = match.any(-1)
        kind = torch.where(is_op, match.long().argmax(-1) + 1, 0)
        t = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        pos = torch.where(is_op, t, -1).cummax(dim=1).values
        op = torch.where(pos >= 0, kind.gather(1, pos.clamp(min=0)), 0)
        return pos, op

    def context_logits(self, z: Tensor, parts: dict[str, Tensor] | None = None,
                       input_ids: Tensor | None = None) -> Tensor:
        """ℓ (B, T, |E|) from what ``input_type`` names (module doc); "context" reads the causal
        context and the current source components only, the operator inputs read
        ``input_ids`` (B, T) as well.

        ``parts`` is ``space.split(z)`` when the caller has it already."""
        if not isinstance(z, Tensor) or z.dim() != 3:
            raise ValueError(f"state must be a (B, T, D) tensor with D = Σ d_g = "
                             f"{self.space.total_dim}, got shape "
                             f"{tuple(getattr(z, 'shape', ()))}")
        if self.input_type != "context":
            if input_ids is None:
                raise ValueError(f"a router with input_type {self.input_type!r} reads the "
                                 "token ids: pass input_ids")
            if input_ids.shape != z.shape[:2]:
                raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}; expected the "
                                 f"state's (B, T) = {tuple(z.shape[:2])}")
            pos, op = self.operator_index(input_ids)
            if self.input_type == "operator":
                u = self.operator_embedding(op)  # (B, T, r)
            else:
                state = z.gather(1, pos.clamp(min=0).unsqueeze(-1).expand(-1, -1, z.shape[-1]))
                u = self.proj_u(state * (pos >= 0).unsqueeze(-1).to(z.dtype))
            return self.operator_head(u)
        parts = self.space.split(z) if parts is None else parts
        # every pooling is linear in the pooled rows, so project to rank r first, then pool:
        # proj_u(pool(z)) = pool(z W_uᵀ) + b_u, at r/D of the cost
        u = self.pool(F.linear(z, self.proj_u.weight), keys=z)  # (B, T, r)
        if self.proj_u.bias is not None:
            u = u + self.proj_u.bias
        # uw[…, e, s] = Σ_r u_r W_e[r, s] for the edges in source order, as one (N, r) × (r, E·r)
        # product; then per source g, ℓ_e = ⟨uw_e, v_g⟩ for its edges by broadcasting v_g
        # (no (B, T, E, r) copy of v per edge)
        r = self.rank
        weights = self.bilinear if self.edge_order is None else self.bilinear[self.edge_order]
        uw = (u.reshape(-1, r) @ weights.transpose(0, 1).reshape(r, -1)).view(
            *u.shape[:-1], len(self.edges), r)
        ell = torch.cat([
            (uw[..., a:b, :] * self.proj_v[g](parts[g]).unsqueeze(-2)).sum(-1)
            for g, (a, b) in zip(self.sources, self.source_spans)], dim=-1)
        return ell if self.edge_order is None else ell.index_select(-1, self.edge_position)
