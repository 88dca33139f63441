"""Named update rules z ↦ z^{new} of a routed layer (004 has seven, mutually inconsistent; B6).

With candidates φ_e = φ_{h←g}(z^{(g)}), per-token weights α_e (B, T, |E|) and the identity mass of
destination h, s_h = 1 − Σ_{e→h} α_e, slot h of z^{new}:

- ``gated_replace`` (§3.2, default): z^{(h)} + Σ_{e→h} α_e (φ_e − z^{(h)})
  = s_h z^{(h)} + Σ_{e→h} α_e φ_e. The skip path is the identity mass s_h, which the router's
  normalisation keeps > 0 under soft routing by holding the identity ("stay") as an option of
  every destination (``Router(stay=True)``, the default; the formulas per normalisation are in
  :mod:`graded.morphic.router`). A destination with one incoming edge still routes: α_e < 1.
- ``residual_typed`` (§4.1.1, Prop 4.1): z^{(h)} + Σ_{e→h} α_e (φ_e − 1[g=h] z^{(h)}); self-edges
  replace, shifting edges add. 004 writes it ungated (α ≡ 1), which this equals at α = 1.
- ``convex_identity`` (§4.1.4): Σ_h α(h) z̃^{(h)} + (1 − Σ_h α(h)) z as printed: z̃^{(h)} =
  Σ_{e→h} α_e φ_e / α(h) ∈ V_h, so Σ_h α(h) z̃^{(h)} puts Σ_{e→h} α_e φ_e in slot h, and the
  leftover 1 − Σ_{e∈𝓔} α_e (the stay option's mass) scales *every* grade of z, those without an
  incoming edge too. It is a convex combination only when Σ_e α_e ≤ 1, so the layer takes it
  with a router normalised globally over 𝓔 (:class:`~graded.morphic.layer.MorphicLayer` refuses
  ``"dest"`` and ``"logistic"``, under which the leftover is negative: −1 with two
  destinations); without a stay option the leftover is 0 and routed slots are Σα φ alone.
  (The per-destination leftover 1 − Σ_{e→h} α_e is ``gated_replace``.)
- ``eta_step`` (Thm 4.13): z^{(h)} + η Σ_{e→h} α_e (φ_e − z^{(h)}).
- ``simplex_dest`` (Def 2.5, §2.4): Σ_{e→h} α_e φ_e, no residual; grades without an incoming edge
  become 0 (with a stay option the stay mass goes to 0, not to z^{(h)}).
- ``sample_one`` (§4.7): z − z^{(h)} + φ_e for one sampled edge e; it is ``gated_replace`` with a
  one-hot α, which the layer obtains from a sampling router with global normalisation (a
  sampled stay option is α ≡ 0: z unchanged).
- ``routed_LN`` (§4.2.2, Prop 4.6, App. B): LN_h(z^{(h)} + (Σ_{e→h} α_e φ_e − z^{(h)})) on grades
  with an incoming edge, others unchanged. **The residual cancels**: this is LN_h(Σ α_e φ_e). Kept
  because it is the paper's rule; computed literally so tests can show the cancellation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from graded.morphic.edges import EdgeSet
from graded.morphic.norm import GradewiseNorm
from graded.morphic.state import GradedStateSpace

UPDATE_MODES = ("gated_replace", "residual_typed", "convex_identity", "eta_step", "simplex_dest",
                "sample_one", "routed_LN")


# the rules whose slot h is z^{(h)} + c_1 mix_h − c_2 s'_h z^{(h)} with one mass per destination:
# computed on the whole state at once (one (…, D) expression instead of a loop over grades)
_MASS_RULES = ("gated_replace", "sample_one", "eta_step", "convex_identity")


def apply_update(
    mode: str, z: Tensor, candidates: Sequence[Tensor], alpha: Tensor, edges: EdgeSet,
    space: GradedStateSpace, *, norm: GradewiseNorm | None = None, eta: float = 1.0,
    parts: dict[str, Tensor] | None = None, mixes: dict[str, Tensor] | Tensor | None = None,
) -> Tensor:
    """z^{new} under ``mode``; ``parts`` is ``space.split(z)`` when the caller has it already.

    Shapes: z (…, D), ``alpha`` (…, |E|) and ``candidates[i]`` (…, d_h) for ``edges[i]`` = h ← g,
    over the same rows …; a ValueError names a tensor of another shape (a (1, 1, d_h)
    candidate broadcast silently over every token).

    ``mixes`` replaces the sum over ``candidates`` when the caller has formed it already (sparse
    execution in ``layer.py`` runs each block on its routed rows only): a dict dest h →
    Σ_{e→h} α_e φ_e, or one tensor (…, D) holding every destination's mix in its grade's
    columns (zeros in grades without an incoming edge).
    """
    if mode not in UPDATE_MODES:
        raise ValueError(f"update mode must be one of {UPDATE_MODES}, got {mode!r}")
    if mode == "routed_LN" and norm is None:
        raise ValueError("routed_LN needs a GradewiseNorm (norm=...)")
    if alpha.shape[-1] != len(edges):
        raise ValueError(f"alpha has {alpha.shape[-1]} edge weights, expected {len(edges)}")
    _check_shapes(z, candidates, alpha, edges, space, mixes)
    if mode in _MASS_RULES:
        return _mass_rule(mode, z, candidates, alpha, edges, space, eta, mixes)
    if isinstance(mixes, Tensor):
        mixes = space.split(mixes)
    parts = space.split(z) if parts is None else parts
    slots = []
    for h in space.labels:
        zh = parts[h]
        idx = [i for i, e in enumerate(edges) if e.dest == h]
        if not idx:
            if mode == "simplex_dest":
                zh = torch.zeros_like(zh)
            slots.append(zh)
            continue
        mix = (mixes[h] if mixes is not None
               else sum(alpha[..., i : i + 1] * candidates[i] for i in idx))
        # the rules of _MASS_RULES returned above: residual_typed, simplex_dest, routed_LN here
        if mode == "residual_typed":
            self_idx = [i for i in idx if edges[i].source == h]
            self_mass = alpha[..., self_idx].sum(-1, keepdim=True) if self_idx else 0.0
            new = zh + mix - self_mass * zh
        elif mode == "simplex_dest":
            new = mix
        else:  # routed_LN, literally as 004 App. B step 5
            new = norm.grade(zh + (mix - zh), h)
        slots.append(new)
    return torch.cat(slots, dim=-1)


def _check_shapes(z: Tensor, candidates: Sequence[Tensor], alpha: Tensor, edges: EdgeSet,
                  space: GradedStateSpace, mixes: dict[str, Tensor] | Tensor | None) -> None:
    """A ValueError naming the first tensor whose shape is not the one its rows need: z (…, D),
    α (…, |E|), candidate φ_e (…, d_h) for e = h ← g, mixes (…, D) or mix_h (…, d_h), … the
    rows of z. A (1, 1, d_h) candidate broadcast silently over every token."""
    if not isinstance(z, Tensor) or z.dim() == 0 or z.shape[-1] != space.total_dim:
        raise ValueError(f"z has shape {tuple(getattr(z, 'shape', ()))}; expected (…, D) with "
                         f"D = Σ d_g = {space.total_dim}")
    rows = tuple(z.shape[:-1])
    if tuple(alpha.shape[:-1]) != rows:
        raise ValueError(f"alpha has shape {tuple(alpha.shape)}; expected {(*rows, len(edges))}, "
                         f"one weight per edge for each of the rows {rows} of z")

    def check(name: str, y: object, dim: int, what: str) -> None:
        if not isinstance(y, Tensor) or tuple(y.shape) != (*rows, dim):
            raise ValueError(f"{name} has shape {tuple(getattr(y, 'shape', ()))}; expected "
                             f"{(*rows, dim)}: the rows {rows} of z, {what}")

    if isinstance(mixes, Tensor):
        check("mixes", mixes, space.total_dim, f"D = {space.total_dim} columns")
    elif mixes is not None:
        for h in dict.fromkeys(e.dest for e in edges):
            if h not in mixes:
                raise ValueError(f"mixes has no mix for grade {h!r}, which edges enter; "
                                 f"expected one for each of {sorted({e.dest for e in edges})}")
            check(f"mixes[{h!r}]", mixes[h], space.dim(h), f"d_{h} = {space.dim(h)} columns")
    else:
        if len(candidates) != len(edges):
            raise ValueError(f"{len(candidates)} candidates for {len(edges)} edges; expected one "
                             "candidate φ_e per edge, in the order of the edges")
        for i, (e, y) in enumerate(zip(edges, candidates)):
            check(f"candidate {i} (edge {e.name!r}, {e.dest} <- {e.source})", y,
                  space.dim(e.dest), f"d_{e.dest} = {space.dim(e.dest)} columns")


def _mass_rule(mode: str, z: Tensor, candidates: Sequence[Tensor], alpha: Tensor, edges: EdgeSet,
               space: GradedStateSpace, eta: float, mixes: dict[str, Tensor] | Tensor | None
               ) -> Tensor:
    """The rules of ``_MASS_RULES`` on the whole state, as c·M + (1 − c·m) ⊙ z: M holds the
    mixes in their grades' columns, m the routed mass Σ_{e→h} α_e over the columns of h (0 where
    no edge enters) and c = η for eta_step, 1 otherwise. That is z + M − m z for gated_replace
    and sample_one, z + η(M − m z) for eta_step; convex_identity is M + (1 − Σ_e α_e) z, the
    mass over all of 𝓔 on every grade."""
    labels = list(space.labels)
    if isinstance(mixes, Tensor):
        mix = mixes
    else:
        slots = []
        for h in labels:
            idx = [i for i, e in enumerate(edges) if e.dest == h]
            if not idx:
                slots.append(z.new_zeros(*z.shape[:-1], space.dim(h)))
            elif mixes is not None:
                slots.append(mixes[h])
            else:
                slots.append(sum(alpha[..., i : i + 1] * candidates[i] for i in idx))
        mix = torch.cat(slots, dim=-1)
    c = eta if mode == "eta_step" else 1.0
    dest = torch.tensor([labels.index(e.dest) for e in edges], device=alpha.device)
    mass = alpha.new_zeros(*alpha.shape[:-1], len(labels)).index_add(-1, dest, alpha)
    if mode == "convex_identity":  # one leftover for the whole state
        keep = (1 - alpha.sum(-1, keepdim=True)).expand_as(mass)
    else:
        keep = 1 - c * mass  # (…, |G|): the weight left on each grade's own state
    mix = mix * c if c != 1.0 else mix
    dims = [space.dim(h) for h in labels]
    if len(set(dims)) == 1:  # equal grades: broadcast over a (…, |G|, d) view, no copy
        shape = (len(labels), dims[0])
        return torch.addcmul(mix.unflatten(-1, shape), z.unflatten(-1, shape),
                             keep.unsqueeze(-1)).flatten(-2)
    # the grade of every column, from Python ints: a repeat_interleave by a tensor of counts
    # has a data-dependent shape, a graph break under torch.compile
    columns = torch.tensor([i for i, d in enumerate(dims) for _ in range(d)], device=alpha.device)
    return torch.addcmul(mix, z, keep.index_select(-1, columns))
