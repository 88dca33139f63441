"""Per-token router over an edge set (004 §4.2.1, §4.2.2, §4.7, Remark 4.12).

Context logits ℓ_t(h←g) = u(z_{<t})ᵀ W_{h←g} v_g(z_t^{(g)}), computed for every token (never a
batch mean, unlike 004 App. B), with u a causal pooling of the strictly earlier states (zeros at
t = 0) and v_g a grade-local projection cached per source grade. u and v are affine by default
(004 App. B has no bias), so the bilinear form also holds a pure-context and a pure-source term.

Normalisation: "global" (softmax over all of 𝓔), "dest" (softmax over the edges into each
destination, Remark 4.12 iv) or "logistic" (independent gates σ(ℓ/temperature), §3.2).
Modes: "soft"; "hard" (argmax forward, straight-through gradient: 004's hard mode has none);
"gumbel" (Gumbel-softmax, straight-through, biased); "reinforce" (a sample per group, no
pathwise gradient: the objective adds the score-function term, §6.3.1, Remark 4.17). Stochastic
modes route by argmax when ``stochastic=False`` (evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from graded.morphic.edges import EdgeSet
from graded.morphic.state import GradedStateSpace

NORMALIZATIONS = ("global", "dest", "logistic")
MODES = ("soft", "hard", "gumbel", "reinforce")
POOLINGS = ("mean", "last", "attention")


@dataclass
class Route:
    """Routing weights α (B, T, |E|), the soft probabilities, and log K_θ(sample) for REINFORCE."""

    weights: Tensor
    probs: Tensor
    log_prob: Tensor | None = None


class Router(nn.Module):
    def __init__(
        self, space: GradedStateSpace, edges: EdgeSet, *, rank: int = 16, pooling: str = "mean",
        temperature: float = 1.0, normalization: str = "dest", mode: str = "soft",
        affine: bool = True, init_std: float = 0.02, gumbel_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"rank must be a positive int, got {rank!r}")
        self.space, self.edges = space, edges
        self.rank, self.pooling, self.temperature = rank, pooling, float(temperature)
        self.normalization, self.mode = normalization, mode
        self.gumbel_temperature = gumbel_temperature
        self.proj_u = nn.Linear(space.total_dim, rank, bias=affine)
        self.sources = list(dict.fromkeys(e.source for e in edges))
        self.proj_v = nn.ModuleDict({g: nn.Linear(space.dim(g), rank, bias=affine)
                                     for g in self.sources})
        self.bilinear = nn.Parameter(torch.randn(len(edges), rank, rank) * init_std)
        self.register_buffer("source_of_edge", torch.tensor(
            [self.sources.index(e.source) for e in edges], dtype=torch.long), persistent=False)
        if pooling == "attention":
            self.pool_key = nn.Linear(space.total_dim, rank, bias=False)
            self.pool_query = nn.Parameter(torch.zeros(rank))
        if normalization == "global":
            groups = [list(range(len(edges)))]
        else:
            groups = [[i for i, e in enumerate(edges) if e.dest == h] for h in edges.dests]
        self.groups = [torch.tensor(g, dtype=torch.long) for g in groups]

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

    def context_logits(self, z: Tensor, parts: dict[str, Tensor] | None = None) -> Tensor:
        """ℓ (B, T, |E|) from the causal context and the current source components only.

        ``parts`` is ``space.split(z)`` when the caller has it already."""
        parts = self.space.split(z) if parts is None else parts
        # every pooling is linear in the pooled rows, so project to rank r first, then pool:
        # proj_u(pool(z)) = pool(z W_uᵀ) + b_u, at r/D of the cost
        u = self.pool(F.linear(z, self.proj_u.weight), keys=z)  # (B, T, r)
        if self.proj_u.bias is not None:
            u = u + self.proj_u.bias
        v = torch.stack([self.proj_v[g](parts[g]) for g in self.sources], dim=2)
        v_e = v.index_select(2, self.source_of_edge)  # (B, T, E, r)
        uw = torch.einsum("btr,ers->btes", u, self.bilinear)
        return (uw * v_e).sum(-1)

    # ---------------------------------------------------- normalisation
    def _mask(self, logits: Tensor, disabled: frozenset[int] | set[int] | None) -> Tensor:
        if not disabled:
            return logits
        mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        mask[list(disabled)] = True
        return logits.masked_fill(mask, float("-inf"))

    def log_probs(self, logits: Tensor, disabled: set[int] | None = None) -> Tensor:
        """log α per edge under the normalisation (log σ for logistic gates); −∞ where disabled."""
        x = self._mask(logits, disabled) / self.temperature
        if self.normalization == "logistic":
            return F.logsigmoid(x)
        out = torch.empty_like(x)
        for idx in self.groups:
            idx = idx.to(x.device)
            out[..., idx] = torch.log_softmax(x.index_select(-1, idx), dim=-1)
        return out

    def probabilities(self, logits: Tensor, disabled: set[int] | None = None) -> Tensor:
        return self.log_probs(logits, disabled).exp().nan_to_num(0.0)

    def entropy(self, logits: Tensor) -> Tensor:
        """Routing entropy per token (B, T): Σ_groups H(α_group), or Σ_e H_Bernoulli for gates."""
        logp = self.log_probs(logits)
        p = logp.exp()
        if self.normalization == "logistic":
            log1m = F.logsigmoid(-logits / self.temperature)
            return -(p * logp + (1 - p) * log1m).sum(-1)
        return -(p * logp.clamp(min=-1e30)).sum(-1)

    def kl(self, teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
        """KL(α_teacher ‖ α_student) per token (B, T), summed over normalisation groups."""
        lt, ls = self.log_probs(teacher_logits), self.log_probs(student_logits)
        pt = lt.exp()
        if self.normalization == "logistic":
            lt0 = F.logsigmoid(-teacher_logits / self.temperature)
            ls0 = F.logsigmoid(-student_logits / self.temperature)
            return (pt * (lt - ls) + (1 - pt) * (lt0 - ls0)).sum(-1)
        return (pt * (lt - ls)).sum(-1)

    # ------------------------------------------------------------ routing
    def route(
        self, logits: Tensor, *, stochastic: bool = False, disabled: set[int] | None = None,
        generator: torch.Generator | None = None,
    ) -> Route:
        probs = self.probabilities(logits, disabled)
        mode = self.mode
        if mode == "soft":
            return Route(probs, probs)
        if mode in ("gumbel", "reinforce") and not stochastic:
            mode = "hard"
        if mode == "gumbel":
            return Route(self._gumbel(logits, disabled, generator), probs)
        hard, log_prob = self._discrete(probs, sample=mode == "reinforce", generator=generator)
        if mode == "reinforce":
            return Route(hard, probs, log_prob)
        return Route(hard + probs - probs.detach(), probs)

    def _discrete(
        self, probs: Tensor, *, sample: bool, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        p = probs.detach()
        if self.normalization == "logistic":
            if sample:
                u = torch.rand(p.shape, generator=generator, device=p.device)
                hard = (u < p).to(p.dtype)
            else:
                hard = (p > 0.5).to(p.dtype)
            log_prob = (hard * probs.clamp_min(1e-12).log()
                        + (1 - hard) * (1 - probs).clamp_min(1e-12).log()).sum(-1)
            return hard, log_prob
        hard = torch.zeros_like(p)
        log_prob = torch.zeros(p.shape[:-1], dtype=p.dtype, device=p.device)
        for idx in self.groups:
            idx = idx.to(p.device)
            pg = p.index_select(-1, idx)
            if sample:
                flat = pg.reshape(-1, pg.shape[-1]).clamp_min(0)
                choice = torch.multinomial(flat + (flat.sum(-1, keepdim=True) == 0), 1,
                                           generator=generator).view(pg.shape[:-1])
            else:
                choice = pg.argmax(-1)
            chosen = idx[choice]
            hard.scatter_(-1, chosen.unsqueeze(-1), 1.0)
            log_prob = log_prob + probs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).clamp_min(
                1e-12).log()
        return hard, log_prob

    def _gumbel(self, logits: Tensor, disabled: set[int] | None,
                generator: torch.Generator | None) -> Tensor:
        x = self._mask(logits, disabled) / self.temperature
        g = -torch.empty_like(x).exponential_(generator=generator).log()
        if self.normalization == "logistic":
            g2 = -torch.empty_like(x).exponential_(generator=generator).log()
            soft = torch.sigmoid((x + g - g2) / self.gumbel_temperature)
            return (soft > 0.5).to(soft.dtype) + soft - soft.detach()
        out = torch.zeros_like(x)
        for idx in self.groups:
            idx = idx.to(x.device)
            y = F.softmax((x.index_select(-1, idx) + g.index_select(-1, idx))
                          / self.gumbel_temperature, dim=-1).nan_to_num(0.0)
            hard = F.one_hot(y.argmax(-1), y.shape[-1]).to(y.dtype)
            out[..., idx] = hard + y - y.detach()
        return out
