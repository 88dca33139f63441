"""Admissible edge sets 𝓔 ⊆ G × G (004 Def 2.3, §4.1) and their logit masks (004 Lemma 4.5).

An edge is a typed morphism slot h ← g with a name. 004 treats 𝓔 as a relation (at most one block
per ordered pair); here several named edges may share a type (g, h), which is what a library of
tools of the same type needs (four adders num → num in the variable-k task). Builders:
``EdgeSet.explicit``, ``EdgeSet.banded`` (h = g + δ for δ in Δ, on integer-indexed grades) and
``EdgeSet.dag`` (an explicit set that must be acyclic apart from self-loops, which are the
grade-preserving blocks and are allowed).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from graded.morphic.state import GradedStateSpace


@dataclass(frozen=True)
class Edge:
    """One admissible morphism slot φ_{dest ← source}."""

    source: str
    dest: str
    name: str

    @property
    def is_preserving(self) -> bool:
        return self.source == self.dest


def _as_edge(item: Edge | Sequence[str]) -> Edge:
    if isinstance(item, Edge):
        return item
    if isinstance(item, (tuple, list)) and len(item) in (2, 3):
        source, dest = item[0], item[1]
        name = item[2] if len(item) == 3 else f"{dest}<-{source}"
        return Edge(str(source), str(dest), str(name))
    raise TypeError(f"an edge is Edge or (source, dest[, name]), got {item!r}")


class EdgeSet:
    """An ordered list of admissible edges over a ``GradedStateSpace``; edge order fixes logit
    order."""

    def __init__(
        self, space: GradedStateSpace, edges: Iterable[Edge | Sequence[str]], *,
        acyclic: bool = False,
    ) -> None:
        self.space = space
        self.edges: tuple[Edge, ...] = tuple(_as_edge(e) for e in edges)
        if not self.edges:
            raise ValueError("an edge set needs at least one edge, got none")
        names = [e.name for e in self.edges]
        if len(set(names)) != len(names):
            raise ValueError(f"edge names must be unique, got {names}")
        for e in self.edges:
            for g in (e.source, e.dest):
                if g not in space:
                    raise ValueError(
                        f"edge {e.name!r} uses unknown grade {g!r}; expected one of "
                        f"{list(space.labels)}"
                    )
        self.acyclic = acyclic
        if acyclic:
            cycle = self.find_cycle()
            if cycle is not None:
                raise ValueError(
                    f"edge set must be acyclic (self-loops allowed), found cycle {cycle}")
        self.dests: tuple[str, ...] = tuple(dict.fromkeys(e.dest for e in self.edges))
        pos = {h: i for i, h in enumerate(self.dests)}
        self.dest_group = torch.tensor([pos[e.dest] for e in self.edges], dtype=torch.long)

    # ------------------------------------------------------------ builders
    @classmethod
    def explicit(cls, space: GradedStateSpace, edges: Iterable[Edge | Sequence[str]]) -> EdgeSet:
        return cls(space, edges)

    @classmethod
    def dag(cls, space: GradedStateSpace, edges: Iterable[Edge | Sequence[str]]) -> EdgeSet:
        return cls(space, edges, acyclic=True)

    @classmethod
    def banded(cls, space: GradedStateSpace, shifts: Iterable[int]) -> EdgeSet:
        """𝓔 = {(g, h) : index(h) − index(g) ∈ Δ} (004 §4.1): a shift that leaves G from every
        grade adds no edge (and no kernel) and is named in a warning; shifts that give no edge
        at all are refused."""
        shifts = list(shifts)
        if not shifts or not all(isinstance(d, int) and not isinstance(d, bool) for d in shifts):
            raise ValueError(f"shifts must be a non-empty list of ints, got {shifts!r}")
        if len(set(shifts)) != len(shifts):  # a repeated δ would name one edge twice
            raise ValueError(f"shifts must be distinct, got {shifts!r}")
        edges = []
        used: set[int] = set()
        for g in space.labels:
            for delta in shifts:
                h = space.label_at_index(space.index(g) + delta)
                if h is not None:
                    edges.append(Edge(g, h, f"{h}<-{g}"))
                    used.add(delta)
        indices = [space.index(g) for g in space.labels]
        if not edges:
            raise ValueError(f"banded shifts {shifts} give no edge; expected some shift δ with "
                             f"index(g) + δ = index(h) for grades g, h (indices {indices})")
        idle = [d for d in shifts if d not in used]
        if idle:
            warnings.warn(f"banded shift{'s' if len(idle) > 1 else ''} {idle} of {shifts} "
                          f"give{'' if len(idle) > 1 else 's'} no edge: index(g) + δ is no "
                          f"grade's index for any grade g (indices {indices}); "
                          f"{'they add' if len(idle) > 1 else 'it adds'} nothing",
                          UserWarning, stacklevel=2)
        return cls(space, edges)

    # -------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self.edges)

    def __iter__(self) -> Iterator[Edge]:
        return iter(self.edges)

    def __getitem__(self, i: int) -> Edge:
        return self.edges[i]

    def __repr__(self) -> str:
        return f"EdgeSet({[e.name for e in self.edges]})"

    def position(self, name: str) -> int:
        for i, e in enumerate(self.edges):
            if e.name == name:
                return i
        raise ValueError(f"unknown edge {name!r}; expected one of {[e.name for e in self.edges]}")

    def incoming(self, dest: str) -> list[int]:
        self.space.check(dest)
        return [i for i, e in enumerate(self.edges) if e.dest == dest]

    def find_cycle(self) -> list[str] | None:
        """A directed cycle of length ≥ 2 among distinct grades, or None."""
        adj: dict[str, list[str]] = {g: [] for g in self.space.labels}
        for e in self.edges:
            if e.source != e.dest:
                adj[e.source].append(e.dest)
        state: dict[str, int] = {}
        stack: list[str] = []

        def visit(g: str) -> list[str] | None:
            state[g] = 1
            stack.append(g)
            for h in adj[g]:
                if state.get(h) == 1:
                    return [*stack[stack.index(h) :], h]
                if h not in state:
                    found = visit(h)
                    if found:
                        return found
            stack.pop()
            state[g] = 2
            return None

        for g in self.space.labels:
            if g not in state:
                found = visit(g)
                if found:
                    return found
        return None

    def pair_mask(self, device: torch.device | None = None) -> Tensor:
        """Boolean (|G|, |G|) mask M[h, g] = True iff some edge h ← g is admissible."""
        n = len(self.space)
        mask = torch.zeros(n, n, dtype=torch.bool, device=device)
        for e in self.edges:
            mask[self.space.position(e.dest), self.space.position(e.source)] = True
        return mask


def masked_pair_softmax(dense_logits: Tensor, mask: Tensor, temperature: float = 1.0) -> Tensor:
    """Softmax over all (h, g) pairs with logits −∞ outside 𝓔 (004 Lemma 4.5).

    ``dense_logits`` has shape (..., |G|, |G|) indexed [h, g]; the result is supported exactly on
    ``mask`` (zero mass elsewhere, not merely small).
    """
    if mask.dtype != torch.bool or mask.shape != dense_logits.shape[-2:]:
        raise ValueError(
            f"mask must be bool of shape {tuple(dense_logits.shape[-2:])}, got "
            f"{mask.dtype} {tuple(mask.shape)}"
        )
    if not mask.any():
        raise ValueError("mask admits no edge; a softmax over an empty set is undefined")
    if isinstance(temperature, bool) or not (
            isinstance(temperature, (int, float)) and 0 < temperature < float("inf")):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    flat = dense_logits.masked_fill(~mask, float("-inf")).flatten(-2) / temperature
    return torch.softmax(flat, dim=-1).view_as(dense_logits)
