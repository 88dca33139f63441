"""One routed morphic layer: typed blocks, a per-token router and a named update (004 §4.1-4.2).

Forward, per token t: candidates φ_e(z_t) for every edge e; context logits ℓ_t(e) from the causal
context; when a ``UtilityProbe`` is given (training only: it holds the targets), exact or
first-order utilities ΔL_t(e) and ℓ̃_t = ℓ_t + β(ΔL_t − τ_e); routing weights α_t from ℓ̃
(``train_routing="utility"``, 004's rule) or from ℓ (``"context"``); then the update rule.
Without a probe the layer cannot see targets and routes by ℓ alone: that is the evaluation path.

Execution (``execution=``). "dense" computes φ_e on every token for every edge, then mixes them by
α. "sparse" routes first (ℓ needs only z), then for each edge e gathers the rows R_e = {t : α_t(e)
≠ 0}, runs the block on those rows only and scatters mix_h = Σ_{e→h} α_e φ_e back (the gather /
scatter of mixture-of-experts layers), so a layer's block cost grows with the number of selected
edges per token, not with |E|; an external tool sees only its routed tokens. Blocks that are not
``token_local`` (grade-typed attention mixes tokens) still run on the whole sequence and only
their routed rows are kept. Sparse needs a router whose α is exactly zero off the selection
(mode "hard", "gumbel" or "reinforce"), and a probe forces dense (utilities need every φ_e).
Sparse gives dense's outputs; its gradients equal dense's when α carries no gradient (evaluation,
REINFORCE samples). Under straight-through α (hard / Gumbel training) dense also sends the router
the term ∂L/∂α_e = ⟨∂L/∂z_h, φ_e − ·⟩ of unselected edges, which needs their φ_e; sparse sends it
for selected edges only (the mixture-of-experts estimator). "auto" (default) is sparse exactly
when it is exact: a non-soft router, no probe, and α without gradient (and never under
``torch.compile``, where the gather's data-dependent shapes would break the graph).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from graded._precision import held_precision, widen_loaded
from graded.checks import check_float
from graded.morphic.banded import BandedBlocks
from graded.morphic.edges import Edge, EdgeSet
from graded.morphic.norm import GradewiseNorm
from graded.morphic.objective import utility_augmented_logits
from graded.morphic.router import Router
from graded.morphic.state import GradedStateSpace
from graded.morphic.update import UPDATE_MODES, apply_update
from graded.morphic.utilities import UTILITY_KINDS, compute_utilities

EXECUTIONS = ("auto", "dense", "sparse")
THRESHOLD_DTYPE = torch.float64  # what ``MorphicLayer.thresholds`` is held in, whatever the cast
_HELD = {"thresholds": lambda dtype: THRESHOLD_DTYPE}  # graded._precision


@dataclass
class UtilityProbe:
    """What utilities need and evaluation never has: the readout and the next-token targets."""

    weight: Tensor
    bias: Tensor | None
    targets: Tensor
    kind: str = "exact"
    ignore_index: int = -100
    attach: str = "phi"

    def __post_init__(self) -> None:
        if self.kind not in UTILITY_KINDS:
            raise ValueError(f"utility kind must be one of {UTILITY_KINDS}, got {self.kind!r}")

    @property
    def valid(self) -> Tensor:
        return self.targets != self.ignore_index


@dataclass
class LayerTrace:
    """Routing record of one layer: ℓ, the logits used, α, soft probabilities, and ΔL/ℓ̃ if any."""

    context_logits: Tensor
    routing_logits: Tensor
    alpha: Tensor
    probs: Tensor
    utilities: Tensor | None = None
    utility_logits: Tensor | None = None
    log_prob: Tensor | None = None
    execution: str = "dense"


def _check_call(e: Edge, block: nn.Module) -> None:
    """A ValueError naming the edge when ``block`` cannot be called as ``block(x_src, x_dst)``,
    the call every block gets (``blocks.py``): an ``nn.Linear`` or ``nn.Sequential`` handed to
    a layer used to fail on the first forward pass with "forward() takes 2 positional
    arguments but 3 were given", naming neither the edge nor the protocol."""
    try:
        signature = inspect.signature(block.forward)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call will tell
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise ValueError(
            f"edge {e.name!r} ({e.dest} <- {e.source}): block {type(block).__name__} has "
            f"forward{signature}; expected a block called as block(x_src, x_dst) with x_src = "
            f"z^({e.source}) and x_dst = z^({e.dest}) (graded.morphic.blocks), e.g. a forward "
            "(x_src, x_dst=None) that ignores x_dst, or LinearBlock / FFNBlock") from None


def _threshold_tensor(thresholds: float | Sequence[float] | Tensor | Mapping[str, float],
                      edges: EdgeSet) -> Tensor:
    """τ as given, in float64: one float, one per edge, or a mapping {edge name: τ_e} (the
    edges it does not name keep τ_e = 0); a ValueError naming an unknown edge name, the layer's
    edges, or a value that is not a number (a dict or a string used to fail in torch with
    "must be real number, not dict")."""
    if isinstance(thresholds, Mapping):
        names = [e.name for e in edges]
        unknown = [k for k in thresholds if k not in names]
        if unknown:
            raise ValueError(f"thresholds name unknown edges {unknown}; expected names of the "
                             f"layer's edges {names}")
        thresholds = [thresholds.get(name, 0.0) for name in names]
    try:
        return torch.as_tensor(thresholds, dtype=THRESHOLD_DTYPE).detach()
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"thresholds must be a float, {len(edges)} floats (one per edge) or a "
                         f"mapping {{edge name: float}}, got {thresholds!r}") from None


def _check_threshold_values(tau: Tensor, where: str = "") -> None:
    """τ_e finite and ≥ 0, at construction and when a state dict is loaded (a negative or NaN
    τ loaded from a state dict used to be taken as it was)."""
    if not bool((torch.isfinite(tau) & (tau >= 0)).all()):
        raise ValueError(
            f"thresholds must be finite and >= 0, got {tau.tolist()}{where}: τ_e is the margin a "
            "utility must clear (004 §3.3, τ_e ≥ 0); a negative one would favour an edge whose "
            "update raises the loss")


class MorphicLayer(nn.Module):
    def __init__(
        self, space: GradedStateSpace, edges: EdgeSet,
        blocks: Sequence[nn.Module] | BandedBlocks, *,
        router: Router | dict | None = None, update: str = "gated_replace",
        pre_norm: str | None = None, eta: float = 1.0, beta: float = 5.0,
        thresholds: float | Sequence[float] | Tensor | Mapping[str, float] = 0.0,
        execution: str = "auto",
        train_routing: str = "context",
    ) -> None:
        super().__init__()
        if edges.space is not space and edges.space.grades != space.grades:
            raise ValueError(f"edges were built over the grades {list(edges.space.grades)}; "
                             f"expected the layer's, {list(space.grades)}")
        if isinstance(blocks, BandedBlocks):
            if blocks.edge_set.edges != edges.edges:
                raise ValueError("BandedBlocks edge set differs from the layer's edges")
            blocks = blocks.blocks()
        if len(blocks) != len(edges):
            raise ValueError(f"got {len(blocks)} blocks for {len(edges)} edges")
        for e, block in zip(edges, blocks):  # the dims a block declares (``blocks.py``)
            declared = (getattr(block, "d_in", None), getattr(block, "d_out", None))
            expected = (space.dim(e.source), space.dim(e.dest))
            if None not in declared and declared != expected:
                raise ValueError(
                    f"edge {e.name!r} ({e.dest} <- {e.source}): block {type(block).__name__} "
                    f"maps {declared[0]} -> {declared[1]}; expected d_{e.source} = "
                    f"{expected[0]} -> d_{e.dest} = {expected[1]}")
        if isinstance(router, Router) and (router.edges.edges != edges.edges
                                           or router.space.grades != space.grades):
            raise ValueError(
                f"router was built for edges {[(e.source, e.dest, e.name) for e in router.edges]} "
                f"over {router.space}; expected the layer's edges "
                f"{[(e.source, e.dest, e.name) for e in edges]} over {space}")
        if update not in UPDATE_MODES:
            raise ValueError(f"update must be one of {UPDATE_MODES}, got {update!r}")
        if train_routing not in ("utility", "context"):
            raise ValueError(f"train_routing must be 'utility' or 'context', got {train_routing!r}")
        beta = check_float("beta", beta, minimum=0, strict_min=True)
        eta = check_float("eta", eta, minimum=0, strict_min=True)
        self.space, self.edges = space, edges
        self.blocks = nn.ModuleList(blocks)
        self.router = router if isinstance(router, Router) else Router(space, edges,
                                                                       **(router or {}))
        if update == "sample_one" and (self.router.mode == "soft"
                                       or self.router.normalization != "global"
                                       or self.router.top_k != 1):
            raise ValueError("sample_one draws one edge over all of 𝓔: it needs a router with "
                             "normalization='global', mode in ('hard', 'gumbel', 'reinforce') "
                             f"and top_k=1, got top_k={self.router.top_k}, normalization="
                             f"{self.router.normalization!r}, mode={self.router.mode!r}")
        if update == "convex_identity" and self.router.normalization != "global":
            raise ValueError(
                "convex_identity leaves 1 − Σ_e α_e of the state in place (004 §4.1.4), a convex "
                "combination only when the routing weights of all edges sum to at most 1: it "
                "needs a router with normalization='global', got normalization="
                f"{self.router.normalization!r} (use gated_replace for the per-destination "
                "leftover)")
        self.update, self.eta, self.beta = update, eta, float(beta)
        self.train_routing = train_routing
        if pre_norm not in (None, "layer", "rms"):
            raise ValueError(f"pre_norm must be 'layer', 'rms' or None, got {pre_norm!r}")
        self.pre_norm = GradewiseNorm(space, pre_norm) if pre_norm else None
        self.norm = (GradewiseNorm(space, "layer") if update == "routed_LN" else None)
        # float64, so that a float64 layer uses τ as given (0.1, not float32's 0.10000000149);
        # each use casts it to the dtype of the logits. It stays float64 through casts of the
        # layer (``_apply``) and loads (``_load_from_state_dict``)
        # a copy: never the caller's tensor (shared with another layer, or carrying its graph)
        tau = _threshold_tensor(thresholds, edges)
        tau = tau.expand(len(edges)).clone() if tau.dim() == 0 else tau.clone()
        if tau.shape != (len(edges),):
            raise ValueError(f"thresholds must be a float or {len(edges)} values (one per edge), "
                             f"got shape {tuple(tau.shape)}")
        _check_threshold_values(tau)
        self.register_buffer("thresholds", tau)
        self.disabled: set[int] = set()
        if execution not in EXECUTIONS:
            raise ValueError(f"execution must be one of {EXECUTIONS}, got {execution!r}")
        if execution == "sparse" and self.router.mode == "soft":
            raise ValueError("execution='sparse' needs a router whose weights vanish off the "
                             "selected edges (mode 'hard', 'gumbel' or 'reinforce'), got "
                             "mode 'soft'")
        self.execution = execution
        for e, block in zip(edges, self.blocks):  # last: the arguments' own errors come first
            _check_call(e, block)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> MorphicLayer:
        """``nn.Module._apply`` (``.to``, ``.bfloat16``, ...) with the thresholds τ kept in
        float64: cast with the layer, τ = 0.1 would be 0.10009765625 in bfloat16 and stay so after
        a cast back, and ℓ̃ = ℓ + β(ΔL − τ) (004 §4.2.3) and the penalty would use that τ."""
        with held_precision(self, _HELD):
            super()._apply(fn, recurse)
        return self

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              *args: Any, **kwargs: Any) -> None:
        widen_loaded(state_dict, prefix, _HELD)  # narrow thresholds of an older state dict
        loaded = state_dict.get(prefix + "thresholds")
        if isinstance(loaded, Tensor) and loaded.shape == self.thresholds.shape:
            _check_threshold_values(loaded, f" in the state dict at {prefix}thresholds")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def candidates(self, z: Tensor, parts: dict[str, Tensor] | None = None) -> list[Tensor]:
        """φ_e(z^{(g)}) for every edge, (B, T, d_h) each."""
        if self.pre_norm is not None:
            parts = self.space.split(self.pre_norm(z))
        elif parts is None:
            parts = self.space.split(z)
        out = []
        for e, block in zip(self.edges, self.blocks):
            y = self._checked(e, block, block(parts[e.source], parts[e.dest]), z)
            out.append(y if getattr(block, "differentiable", True) else y.detach())
        return out

    def _checked(self, e: Edge, block: nn.Module, y: Tensor, z: Tensor,
                 rows: torch.Size | None = None) -> Tensor:
        """``y`` if it is φ_e's output for ``rows`` tokens (default: the rows of the state z),
        (…rows, d_h); a ValueError naming the edge otherwise (a narrower output would
        broadcast in the update, silently).

        A floating output whose dtype would promote the state's (a float64 tool in a float32
        model) is cast to z's dtype, as the sparse mix and ``ExternalTool`` cast theirs:
        promoted, the dense update turned the state float64 and the next layer or the readout
        refused it, while sparse execution of the same layer ran. A narrower output (bf16
        under autocast) is left to the update's promotion, which is exact."""
        rows = z.shape[:-1] if rows is None else rows
        expected = (*rows, self.space.dim(e.dest))
        if not isinstance(y, Tensor) or tuple(y.shape) != expected:
            raise ValueError(
                f"edge {e.name!r} ({e.dest} <- {e.source}): block {type(block).__name__} "
                f"returned shape {tuple(getattr(y, 'shape', ()))}; expected {expected} "
                f"(d_{e.dest} = {expected[-1]})")
        wider = y.is_floating_point() and torch.promote_types(y.dtype, z.dtype) != z.dtype
        return y.to(z.dtype) if wider else y

    def sparse_mixes(self, z: Tensor, alpha: Tensor, parts: dict[str, Tensor] | None = None
                     ) -> Tensor:
        """mix_h = Σ_{e→h} α_e φ_e of every destination, each block run on its routed rows, in
        one (B, T, D) tensor (grade h's columns hold mix_h; 0 where no edge enters).

        Rows R_e = {t : α_t(e) ≠ 0}; φ_e runs on z[R_e] (as (|R_e|, 1, d) token batches) when the
        block is ``token_local``, on all of z otherwise, and α_e φ_e is scattered back into R_e.
        A token-local block whose ``reads_dest`` is False is not handed the destination rows.
        """
        if self.pre_norm is not None:
            parts = self.space.split(self.pre_norm(z))
        elif parts is None:
            parts = self.space.split(z)
        b, t, _ = z.shape
        n = b * t
        flat = {g: x.reshape(n, x.shape[-1]) for g, x in parts.items()}
        weights = alpha.reshape(n, len(self.edges))
        # (edge, row) pairs of the selection, edge-major: one nonzero and one sync for all edges
        edge_row = (weights.detach() != 0).T.nonzero()
        counts = torch.bincount(edge_row[:, 0], minlength=len(self.edges)).tolist()
        rows_of = edge_row[:, 1].split(counts)
        selected = weights[edge_row[:, 1], edge_row[:, 0]]
        # 0/1 routing without gradient (hard top-1 at evaluation): α_e φ_e is φ_e itself
        unit = not selected.requires_grad and bool((selected == 1).all())
        weight_of = selected.unsqueeze(1).split(counts)
        mix = z.new_zeros(n, self.space.total_dim)
        for i, (e, block) in enumerate(zip(self.edges, self.blocks)):
            rows = rows_of[i]
            if rows.numel() == 0:
                continue
            if getattr(block, "token_local", False):
                dst = (flat[e.dest].index_select(0, rows).unsqueeze(1)
                       if getattr(block, "reads_dest", True) else None)
                y = block(flat[e.source].index_select(0, rows).unsqueeze(1), dst)
                y = self._checked(e, block, y, z, torch.Size((rows.numel(), 1))).squeeze(1)
            else:
                y = self._checked(e, block, block(parts[e.source], parts[e.dest]), z)
                y = y.reshape(n, -1).index_select(0, rows)
            if not getattr(block, "differentiable", True):
                y = y.detach()
            y = y if unit else weight_of[i] * y
            # under autocast a block may return a narrower dtype than the state's
            mix[:, self.space.slices[e.dest]].index_add_(0, rows, y.to(mix.dtype))
        return mix.view(b, t, self.space.total_dim)  # explicit: b·t may be 0

    def forward(
        self, z: Tensor, probe: UtilityProbe | None = None, *, stochastic: bool = False,
        generator: torch.Generator | None = None, input_ids: Tensor | None = None,
    ) -> tuple[Tensor, LayerTrace]:
        """z (B, T, D) ↦ (z^{new}, trace). ``input_ids`` (B, T) are read only by a router whose
        ``input_type`` is an operator input."""
        if not isinstance(z, Tensor) or z.dim() != 3:
            raise ValueError(f"state must be a (B, T, D) tensor with D = Σ d_g = "
                             f"{self.space.total_dim}, got shape {tuple(getattr(z, 'shape', ()))}")
        parts = self.space.split(z)
        ell = self.router.context_logits(z, parts, input_ids)
        # "auto" stays dense under torch.compile: the sparse gather has data-dependent shapes
        # (a graph break), and dense gives the same outputs
        sparse = self.execution == "sparse" or (self.execution == "auto"
                                                and not torch.compiler.is_compiling())
        if probe is None and sparse and self.router.mode != "soft":
            route = self.router.route(ell, stochastic=stochastic, disabled=self.disabled,
                                      generator=generator)
            if self.execution == "sparse" or not route.weights.requires_grad:
                mixes = self.sparse_mixes(z, route.weights, parts)
                z_new = apply_update(self.update, z, [], route.weights, self.edges, self.space,
                                     norm=self.norm, eta=self.eta, parts=parts, mixes=mixes)
                return z_new, LayerTrace(ell, ell, route.weights, route.probs,
                                         log_prob=route.log_prob, execution="sparse")
        else:
            route = None
        cands = self.candidates(z, parts)
        utilities = ell_tilde = None
        logits = ell
        if probe is not None:
            utilities = compute_utilities(
                probe.kind, z, cands, self.edges, self.space, probe.weight, probe.bias,
                probe.targets, ignore_index=probe.ignore_index, attach=probe.attach)
            # ΔL comes in float32 at least (``utilities.py``); ℓ̃ is rounded once to ℓ's dtype,
            # so that a bfloat16 layer routes, and updates its state, in bfloat16
            ell_tilde = utility_augmented_logits(ell, utilities, self.beta,
                                                 self.thresholds.to(ell.dtype)).to(ell.dtype)
            if self.train_routing == "utility":
                logits = ell_tilde
        if route is None:
            route = self.router.route(logits, stochastic=stochastic, disabled=self.disabled,
                                      generator=generator)
        z_new = apply_update(self.update, z, cands, route.weights, self.edges, self.space,
                             norm=self.norm, eta=self.eta, parts=parts)
        trace = LayerTrace(ell, logits, route.weights, route.probs, utilities, ell_tilde,
                           route.log_prob)
        return z_new, trace
