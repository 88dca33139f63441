"""The routing kernel K_θ over an edge set and the routes drawn from it (004 §4.2.2, §4.7,
Remark 4.12), for :class:`graded.morphic.router.Router`, which computes the logits ℓ.

Normalisation, with temperature T and, by default (``stay=True``), the identity kept as an option
so that every update rule with a skip path keeps one (the "stay" option has logit 0, utility 0):

- "dest" (Remark 4.12 iv): for each destination h, a softmax over {e → h} ∪ {stay_h}:
  α_e = exp(ℓ_e/T) / (1 + Σ_{e'→h} exp(ℓ_{e'}/T)), identity mass
  s_h = 1 / (1 + Σ_{e'→h} exp(ℓ_{e'}/T)).
- "global": one softmax over 𝓔 ∪ {stay}: α_e = exp(ℓ_e/T) / (1 + Σ_{e'∈𝓔} exp(ℓ_{e'}/T)); the
  identity mass of destination h is everything not routed into h, s_h = 1 − Σ_{e→h} α_e.
- "logistic" (§3.2): gates g_e = σ(ℓ_e/T); the identity is "every gate into h closed":
  α_e = g_e / D_h, s_h = Π_{e'→h}(1 − g_{e'}) / D_h, D_h = Σ_{e'→h} g_{e'} + Π_{e'→h}(1 − g_{e'});
  one edge into h gives α_e = g_e exactly.

So under every normalisation Σ_{e→h} α_e + s_h = 1 with s_h > 0 for soft routing; a destination
with one incoming edge still routes (edge or stay). ``stay=False`` gives 004's kernels without the
identity (softmax over the edges alone, raw gates α_e = g_e): a destination with one incoming edge
then has no choice under "dest" (α ≡ 1); it is an *always-on* block, listed in ``always_on``, left
out of ``routed_groups``, of the entropy and of the REINFORCE log-probability (log 1 = 0).
Modes: "soft"; "hard" (argmax forward, straight-through gradient: 004's hard mode has none);
"gumbel" (Gumbel-softmax, straight-through, biased); "reinforce" (a sample per group, no
pathwise gradient: the objective adds the score-function term, §6.3.1, Remark 4.17). Stochastic
modes route by argmax when ``stochastic=False`` (evaluation); ties go to the first option (the
edges in order, then the stay option), under top-k too.

Top-k (``top_k`` = k ≥ 1, mode "hard", softmax normalisations): each group keeps its k most
probable options S (stay included; all of them when the group has fewer), with forward weights
α_e = K_e / Σ_{e'∈S} K_{e'} for e ∈ S and 0 elsewhere (the renormalised top-k of
mixture-of-experts layers; k = 1 gives the one-hot argmax) and the straight-through gradient
∂α_e/∂K_e = 1 of hard routing. A selected stay option keeps its share on the skip path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from graded.morphic.edges import EdgeSet
from graded.morphic.objective import check_edge_positions

__all__ = ["MODES", "NORMALIZATIONS", "Route", "RoutingKernel", "gate_weights"]

NORMALIZATIONS = ("global", "dest", "logistic")
MODES = ("soft", "hard", "gumbel", "reinforce")


@dataclass
class Route:
    """Routing weights α (B, T, |E|), the soft probabilities, and log K_θ(sample) for REINFORCE."""

    weights: Tensor
    probs: Tensor
    log_prob: Tensor | None = None


def gate_weights(gates: Tensor, groups: list[Tensor]) -> Tensor:
    """α_e = g_e / (Σ_{e'→h} g_{e'} + Π_{e'→h}(1 − g_{e'})) per destination group (module doc)."""
    out = torch.empty_like(gates)
    for idx in groups:
        idx = idx.to(gates.device)
        g = gates.index_select(-1, idx)
        denom = g.sum(-1, keepdim=True) + (1 - g).prod(-1, keepdim=True)
        out[..., idx] = (g / denom).to(out.dtype)  # autocast runs prod in float32
    return out


class RoutingKernel:
    """The normalisation groups, the kernel K and the routes of a router (a mixin for
    :class:`graded.morphic.router.Router`, an ``nn.Module``: :meth:`init_kernel` registers a
    buffer).

    The router sets the options read here (``edges``, ``temperature``, ``normalization``,
    ``mode``, ``gumbel_temperature``, ``stay``, ``top_k``), then calls :meth:`init_kernel`,
    which builds the groups over the extended columns [edges | stay options] (module doc)."""

    edges: EdgeSet
    temperature: float
    normalization: str
    mode: str
    gumbel_temperature: float
    stay: bool
    top_k: int
    group_of_column: Tensor

    def init_kernel(self, edges: EdgeSet, normalization: str, stay: bool) -> None:
        """The normalisation groups of ``edges``: one for "global", one per destination
        otherwise, each with its stay option when ``stay`` (softmax normalisations); which of
        them route (``routed_groups``) and which are always on (``always_on``)."""
        if normalization == "global":
            groups = [list(range(len(edges)))]
        else:
            groups = [[i for i, e in enumerate(edges) if e.dest == h] for h in edges.dests]
        # the edges of each normalisation group (for "logistic": the edges into one destination)
        self.groups = [torch.tensor(g, dtype=torch.long) for g in groups]
        # the same groups over the extended columns [edges | stay options], one stay per group
        softmax = normalization != "logistic"
        self.n_stay = len(groups) if (stay and softmax) else 0
        self._ext_group_lists = [g + ([len(edges) + k] if self.n_stay else [])
                                 for k, g in enumerate(groups)]
        self.ext_groups = [torch.tensor(g, dtype=torch.long) for g in self._ext_group_lists]
        n_cols = len(edges) + self.n_stay
        # one group holding every column in order (global softmax): no gather needed
        self.single_group = (len(self.ext_groups) == 1
                             and torch.equal(self.ext_groups[0], torch.arange(n_cols)))
        group_of_column = torch.full((n_cols,), -1, dtype=torch.long)
        for k, idx in enumerate(self.ext_groups):
            group_of_column[idx] = k
        self.register_buffer("group_of_column", group_of_column, persistent=False)
        choice = [len(g) > 1 for g in self.ext_groups] if softmax else [True] * len(groups)
        self.routed_groups: list[list[int]] = [g for g, c in zip(groups, choice) if c]
        self.always_on: list[int] = [g[0] for g, c in zip(groups, choice) if not c]

    # ---------------------------------------------------- normalisation
    def _mask(self, logits: Tensor, disabled: frozenset[int] | set[int] | None) -> Tensor:
        if not disabled:
            return logits
        self.check_disabled(disabled)
        mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        mask[list(disabled)] = True
        return logits.masked_fill(mask, float("-inf"))

    def check_logits(self, logits: Tensor, name: str = "logits") -> None:
        """``logits`` must hold one column per edge, (…, |E|), in edge order: a wrong width
        would be normalised as if it were the edges' (a stay column read as an edge)."""
        if not isinstance(logits, Tensor) or logits.dim() == 0 or (
                logits.shape[-1] != len(self.edges)):
            raise ValueError(f"{name} must have one column per edge, shape (…, "
                             f"{len(self.edges)}) for the edges {[e.name for e in self.edges]}; "
                             f"got shape {tuple(getattr(logits, 'shape', ()))}")

    def check_disabled(self, disabled: frozenset[int] | set[int]) -> None:
        """``disabled`` must hold edge positions 0..|E|−1 (``MorphicLayer.disabled``)."""
        check_edge_positions(disabled, len(self.edges), [e.name for e in self.edges])

    def _extend(self, x: Tensor) -> Tensor:
        """[x | 0 …]: the stay options' logits (0) appended after the |E| edge columns."""
        if not self.n_stay:
            return x
        return torch.cat([x, x.new_zeros(*x.shape[:-1], self.n_stay)], dim=-1)

    def _ext_log_probs(self, logits: Tensor, disabled: set[int] | None = None) -> Tensor:
        """log-probabilities over [edges | stay options], one softmax per group (−∞/NaN for a
        group whose every option is disabled)."""
        x = self._mask(logits, disabled)
        x = self._extend(x if self.temperature == 1.0 else x / self.temperature)
        if self.single_group:
            return torch.log_softmax(_infinite_limit(x, x.detach().amax(-1, keepdim=True))[0],
                                     dim=-1)
        # a segment log-softmax over all groups at once: shift by each group's max (a constant
        # per group, so detached), then log Σ exp per group by index_add
        gid = self.group_of_column.to(x.device)
        n_groups = len(self.ext_groups)
        top = x.detach().new_full((*x.shape[:-1], n_groups), float("-inf")).scatter_reduce(
            -1, gid.expand(x.shape), x.detach(), "amax")
        x, top = _infinite_limit(x, top.index_select(-1, gid))
        shifted = x - top
        total = shifted.new_zeros(top.shape).index_add(-1, gid, shifted.exp())
        return shifted - total.log().index_select(-1, gid)

    def log_probs(self, logits: Tensor, disabled: set[int] | None = None) -> Tensor:
        """log K(e) per edge under the normalisation (log σ for logistic gates); −∞ where
        disabled. With ``stay`` the softmax groups also hold the stay options (not returned)."""
        self.check_logits(logits)
        if self.normalization == "logistic":
            return F.logsigmoid(self._mask(logits, disabled) / self.temperature)
        return self._ext_log_probs(logits, disabled)[..., : len(self.edges)]

    def probabilities(self, logits: Tensor, disabled: set[int] | None = None) -> Tensor:
        """K(e) per edge: the softmax probabilities, or the gates σ(ℓ/T) for logistic. 0 for the
        edges of a group whose every option is disabled (its log-softmax is NaN there); an edge
        whose logit is NaN gets NaN, so a broken routing shows in the loss rather than reading
        as "no edge taken"."""
        p = self.log_probs(logits, disabled).exp()
        return torch.where(torch.isnan(p) & ~torch.isnan(logits), 0.0, p)

    def weights_from(self, probs: Tensor) -> Tensor:
        """The update weights α from per-edge kernel values (soft or 0/1): the probabilities
        themselves for softmax groups, ``gate_weights`` for logistic gates with ``stay``."""
        if self.normalization == "logistic" and self.stay:
            return gate_weights(probs, self.groups)
        return probs

    def identity_mass(self, alpha: Tensor) -> Tensor:
        """s_h = 1 − Σ_{e→h} α_e per destination (…, len(edges.dests)), in ``edges.dests`` order:
        the weight every update rule with a skip path leaves on z^{(h)} (module doc)."""
        return torch.stack([1 - alpha[..., self.edges.incoming(h)].sum(-1)
                            for h in self.edges.dests], dim=-1)

    def entropy(self, logits: Tensor, disabled: set[int] | None = None) -> Tensor:
        """Routing entropy per token (B, T): Σ over routed groups of H(group, stay included), or
        Σ_e H_Bernoulli(g_e) for gates. Always-on groups have no choice and add nothing.
        ``disabled`` edges are off, as in :meth:`route`: a softmax group renormalises over the
        rest (a group with no option left adds 0), a disabled gate is shut and adds 0."""
        self.check_logits(logits)
        if self.normalization == "logistic":
            x = _finite_gate_logits(logits / self.temperature)
            p, logp, log1m = torch.sigmoid(x), F.logsigmoid(x), F.logsigmoid(-x)
            h = -(p * logp + (1 - p) * log1m)
            if disabled:
                self.check_disabled(disabled)
                h = h.index_fill(-1, torch.tensor(sorted(disabled), device=h.device), 0.0)
            return h.sum(-1)
        logp = self._ext_log_probs(logits, disabled)
        h = logits.new_zeros(logits.shape[:-1])
        for idx, routed in zip(self.ext_groups, self._group_routed()):
            if routed:
                lg = logp.index_select(-1, idx.to(logp.device))
                # p log p = 0 where p = 0 (a disabled option: log p = −∞; a group with every
                # option disabled: NaN); masked before the product, so the gradient is 0 there
                live = torch.isfinite(lg)
                lg = torch.where(live, lg, 0.0)
                h = h - torch.where(live, lg.exp() * lg, 0.0).sum(-1)
        return h

    def choices(self, logits: Tensor, disabled: set[int] | None = None) -> Tensor:
        """The argmax option of every routed group (…, len(choice_groups(disabled))), as a
        column of [edges | stay options]: the stay option counts as a choice, always-on groups
        do not.

        With ``disabled`` edges (softmax normalisations) the argmax is over the options left, as
        in :meth:`route`, and only the groups that still have a choice (two options or more
        left, :meth:`choice_groups`) are returned."""
        self.check_logits(logits)
        x = self._extend(self._mask(logits, disabled))
        picks = [idx.to(x.device)[x.index_select(-1, idx.to(x.device)).argmax(-1)]
                 for idx in self.choice_groups(disabled)]
        return torch.stack(picks, dim=-1) if picks else x.new_zeros(*x.shape[:-1], 0,
                                                                    dtype=torch.long)

    def choice_groups(self, disabled: set[int] | None = None) -> list[Tensor]:
        """The normalisation groups that route (as columns of [edges | stay options]), less
        ``disabled`` edges, keeping those left with a choice: two options or more for softmax
        groups, one open gate or more for logistic gates."""
        routed = [idx for idx, r in zip(self.ext_groups, self._group_routed()) if r]
        if not disabled:
            return routed
        self.check_disabled(disabled)
        least = 1 if self.normalization == "logistic" else 2
        left = [[i for i in g if i not in disabled] for g in self._ext_group_lists]
        return [torch.tensor(g, dtype=torch.long)
                for g, r in zip(left, self._group_routed()) if r and len(g) >= least]

    def _top_options(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The k largest options of one group (…, n) and their columns, ties broken as argmax
        breaks them (k = 1): the first column first, the edges in order, then the stay option.
        ``topk`` leaves the order of ties unspecified (on CPU it kept a later edge and the stay
        option over the group's first edge), so the selection depended on the kernel."""
        k = min(self.top_k, x.shape[-1])
        top, where = x.sort(dim=-1, descending=True, stable=True)
        return top[..., :k], where[..., :k]

    def _group_routed(self) -> list[bool]:
        return [len(g) > 1 or self.normalization == "logistic" for g in self.ext_groups]

    def kl(self, teacher_logits: Tensor, student_logits: Tensor,
           disabled: set[int] | None = None) -> Tensor:
        """KL(K_teacher ‖ K_student) per token (B, T), summed over normalisation groups (stay
        options included), or over the Bernoulli gates.

        ``disabled`` edges are off in both kernels, as in :meth:`route`: a softmax group
        renormalises over the options left (a disabled option has probability 0 under teacher
        and student and adds 0 log 0 = 0; a group with no option left adds 0), a disabled gate
        is shut in both and adds 0. Masked before the product, so the gradient is 0 there too."""
        self.check_logits(teacher_logits, "teacher_logits")
        self.check_logits(student_logits, "student_logits")
        if self.normalization == "logistic":
            xt = _finite_gate_logits(teacher_logits / self.temperature)
            xs = _finite_gate_logits(student_logits / self.temperature)
            pt = torch.sigmoid(xt)
            kl = (pt * (F.logsigmoid(xt) - F.logsigmoid(xs))
                  + (1 - pt) * (F.logsigmoid(-xt) - F.logsigmoid(-xs)))
            if disabled:
                self.check_disabled(disabled)
                kl = kl.index_fill(-1, torch.tensor(sorted(disabled), device=kl.device), 0.0)
            return kl.sum(-1)
        lt = self._ext_log_probs(teacher_logits, disabled)
        ls = self._ext_log_probs(student_logits, disabled)
        if not disabled:
            return (lt.exp() * (lt - ls)).sum(-1)
        # −∞ at a disabled option, NaN in a group with every option disabled, in both kernels
        live = torch.isfinite(lt) & torch.isfinite(ls)
        lt, ls = torch.where(live, lt, 0.0), torch.where(live, ls, 0.0)
        return torch.where(live, lt.exp() * (lt - ls), 0.0).sum(-1)

    # ------------------------------------------------------------ routing
    def route(
        self, logits: Tensor, *, stochastic: bool = False, disabled: set[int] | None = None,
        generator: torch.Generator | None = None,
    ) -> Route:
        """α for the update (``weights``), the kernel K per edge (``probs``) and, for REINFORCE,
        log K(sample) summed over the routed groups. Hard and Gumbel weights are 0/1 forward with
        a straight-through gradient; a sampled stay option leaves every edge of its group at 0."""
        self.check_logits(logits)
        n = len(self.edges)
        if self.normalization == "logistic":
            probs = kernel = self.probabilities(logits, disabled)
        else:  # one normalisation pass gives both the edges' K and the stay options'
            kernel = self._ext_log_probs(logits, disabled).exp()
            if disabled:  # a group with every option disabled has NaN probabilities: 0
                kernel = kernel.nan_to_num(0.0)
            probs = kernel[..., :n]
        mode = self.mode
        if mode == "soft":
            return Route(self.weights_from(probs), probs)
        if mode in ("gumbel", "reinforce") and not stochastic:
            mode = "hard"
        if mode == "gumbel":
            return Route(self.weights_from(self._gumbel(logits, disabled, generator)[..., :n]),
                         probs)
        hard, log_prob = self._discrete(kernel, sample=mode == "reinforce", generator=generator)
        hard = hard[..., :n]
        if mode == "reinforce":
            return Route(self.weights_from(hard), probs, log_prob)
        if probs.requires_grad:  # straight-through: 0/1 (or top-k shares) forward, ∂K backward
            hard = hard + probs - probs.detach()
        return Route(self.weights_from(hard), probs)

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
        for idx, routed in zip(self.ext_groups, self._group_routed()):
            idx = idx.to(p.device)
            pg = p if self.single_group else p.index_select(-1, idx)
            if self.top_k > 1 and not sample:  # renormalised top-k of the group (module doc)
                top, where = self._top_options(pg)
                total = top.sum(-1, keepdim=True)
                share = torch.where(total > 0, top / total.clamp_min(1e-30), 0.0)
                hard.scatter_(-1, where if self.single_group else idx[where], share)
                continue
            if sample:
                flat = pg.reshape(-1, pg.shape[-1]).clamp_min(0)
                choice = torch.multinomial(flat + (flat.sum(-1, keepdim=True) == 0), 1,
                                           generator=generator).view(pg.shape[:-1])
            else:
                choice = pg.argmax(-1)
            chosen = choice if self.single_group else idx[choice]
            # a group whose every option is disabled (all mass 0) selects nothing: α ≡ 0 there
            live = (pg.sum(-1) > 0).to(p.dtype)
            hard.scatter_(-1, chosen.unsqueeze(-1), live.unsqueeze(-1))
            if routed and sample:  # log K(sample), used by REINFORCE only
                log_prob = log_prob + live * probs.gather(-1, chosen.unsqueeze(-1)).squeeze(
                    -1).clamp_min(1e-12).log()
        return hard, log_prob

    def _gumbel(self, logits: Tensor, disabled: set[int] | None,
                generator: torch.Generator | None) -> Tensor:
        x = self._mask(logits, disabled) / self.temperature
        if self.normalization == "logistic":
            g = -torch.empty_like(x).exponential_(generator=generator).log()
            g2 = -torch.empty_like(x).exponential_(generator=generator).log()
            soft = torch.sigmoid((x + g - g2) / self.gumbel_temperature)
            return (soft > 0.5).to(soft.dtype) + soft - soft.detach()
        x = self._extend(x)
        g = -torch.empty_like(x).exponential_(generator=generator).log()
        out = torch.zeros_like(x)
        for idx in self.ext_groups:
            idx = idx.to(x.device)
            v = x.index_select(-1, idx) + g.index_select(-1, idx)
            v = _infinite_limit(v, v.detach().amax(-1, keepdim=True))[0]
            y = F.softmax(v / self.gumbel_temperature, dim=-1).nan_to_num(0.0)
            hard = F.one_hot(y.argmax(-1), y.shape[-1]).to(y.dtype)
            hard = hard * (y.detach().sum(-1, keepdim=True) > 0)  # every option disabled: none
            out[..., idx] = hard + y - y.detach()
        return out


def _infinite_limit(x: Tensor, top: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax inputs ``x`` and their group maxima ``top`` (broadcast to x) with a group whose
    maximum is +∞ replaced by its limit: its +∞ options share the group's mass equally
    (logit 0), the others get none (−∞), and the maximum becomes 0. Plain softmax gives NaN
    there (∞ − ∞), which read as "no option": a utility logit ℓ̃ = ℓ + β(ΔL − τ) that
    overflows (float16 holds at most 65504) took the best edge out of its group."""
    inf = top == float("inf")
    at_inf = x == float("inf")  # masked_fill keeps x's dtype (where with floats made float32)
    x = x.masked_fill(inf & ~at_inf, float("-inf")).masked_fill(inf & at_inf, 0.0)
    return x, top.masked_fill(inf, 0.0)


def _finite_gate_logits(x: Tensor) -> Tensor:
    """Gate logits with ±∞ moved to ±(largest finite value): σ is then exactly 1 or 0, as at
    ±∞, and the Bernoulli entropy and KL terms 0 · log 0 come out 0 instead of NaN (NaN stays
    NaN)."""
    big = torch.finfo(x.dtype).max
    return x.clamp(-big, big)
