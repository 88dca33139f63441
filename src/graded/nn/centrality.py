"""Node centralities of undirected graphs in torch (networkx's definitions): the grades of
:class:`graded.nn.graph.GradedGraphAttention` (000 §8.9 (i), "grading nodes by centrality")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch
from torch import Tensor

__all__ = ["CENTRALITIES", "CentralityKind", "centrality"]

CentralityKind = Literal["degree", "closeness", "eigenvector", "pagerank"]
CENTRALITIES: tuple[str, ...] = get_args(CentralityKind)


def _check_undirected(adj: Tensor, edges: Tensor) -> None:
    """Refuse an adjacency whose edges (adj != 0 off the diagonal) are not symmetric, naming
    the first one-way entry in row-major order and its mirror (a host read: not under the
    compiler, as the losses' checks)."""
    one_way = edges & ~edges.mT
    if not torch.compiler.is_compiling() and bool(one_way.any()):
        *b, i, j = one_way.nonzero()[0].tolist()
        at, mirror = (*b, i, j), (*b, j, i)
        raise ValueError(
            f"centrality needs an undirected graph (a symmetric adjacency), but "
            f"adj{list(at)} = {adj[at].item()!r} is an edge and adj{list(mirror)} = "
            f"{adj[mirror].item()!r} is not (one-way entries: {int(one_way.sum())}); "
            f"symmetrise it ((adj != 0) | (adj != 0).mT) or pass grades of your own")


def centrality(
    adj: Tensor,
    kind: CentralityKind = "degree",
    *,
    damping: float = 0.85,
    max_iter: int = 200,
    tol: float = 1e-8,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Node centrality of an undirected graph, (N, N) -> (N,) or (B, N, N) -> (B, N), in torch.

    Definitions follow networkx (which the tests compare against); the diagonal is ignored, and
    so are the weights: only which entries are non-zero counts. The graph must be undirected:
    an adjacency whose non-zero entries are not symmetric (adj[i, j] != 0 but adj[j, i] == 0)
    is refused with a ValueError naming the first such entry; the four definitions below differ
    for directed graphs (in- or out-edges) and are not implemented for them. Symmetrise a
    directed graph first (``(adj != 0) | (adj != 0).mT``: its undirected version, as networkx's
    ``Graph`` of the same array) or pass grades of your own to :class:`GradedGraphAttention`.

    - ``degree``: deg(v) / (N - 1) (1 when N = 1).
    - ``closeness``: (r - 1)/Σ_u d(v, u) · (r - 1)/(N - 1) over the r nodes reachable from v
      (Wasserman-Faust scaling for disconnected graphs), 0 for an isolated node. Distances by
      breadth-first search as boolean matrix products, O(N^4) worst case.
    - ``eigenvector``: power iteration x <- (A + I) x / ‖·‖₂ from the all-ones vector (the
      shift by I makes it converge on bipartite graphs); the Perron vector of A, unit norm.
    - ``pagerank``: x <- d Aᵀ D⁻¹ x + (d · dangling mass + 1 - d)/N with damping d, summing to 1.

    ``dtype`` is that of the computation and the result (default: adj's if it is floating,
    else torch's default dtype). A graph's centralities in a batch (B, N, N) equal those of the
    graph alone, bit for bit: each graph's iteration stops at its own tolerance.
    """
    if adj.dim() not in (2, 3) or adj.shape[-1] != adj.shape[-2]:
        raise ValueError(f"adjacency must be (N, N) or (B, N, N), got shape {tuple(adj.shape)}")
    if kind not in CENTRALITIES:
        raise ValueError(f"unknown centrality {kind!r}, expected one of {CENTRALITIES}")
    if kind == "pagerank" and not 0.0 <= damping <= 1.0:
        raise ValueError(f"pagerank needs a damping factor in [0, 1], got {damping!r}")
    if dtype is None:
        dtype = adj.dtype if adj.is_floating_point() else torch.get_default_dtype()
    elif not dtype.is_floating_point:
        raise TypeError(f"centrality needs a floating-point dtype, got dtype={dtype}")
    n = adj.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=adj.device)
    edges = (adj != 0) & ~eye
    _check_undirected(adj, edges)
    a = edges.to(dtype)
    if n == 0:  # no nodes: no centralities (PageRank's uniform start 1/N is undefined)
        return a.sum(-1)
    if kind == "degree":
        if n == 1:  # networkx's convention: the one node of a one-node graph has centrality 1
            return torch.ones(a.shape[:-1], dtype=dtype, device=adj.device)
        return a.sum(-1) / (n - 1)
    if kind == "closeness":
        reached = eye.expand_as(a).clone()
        frontier = reached.clone()
        total = torch.zeros(a.shape[:-1], dtype=dtype, device=adj.device)
        for d in range(1, n):
            frontier = ((frontier.to(dtype) @ a) > 0) & ~reached
            if not frontier.any():
                break
            total = total + d * frontier.sum(-1)
            reached |= frontier
        r = reached.sum(-1).to(dtype)
        safe = torch.where(total > 0, total, torch.ones_like(total))
        return torch.where(total > 0, (r - 1) / safe * (r - 1) / max(n - 1, 1), 0.0)
    if kind == "eigenvector":
        x = torch.ones(a.shape[:-1], dtype=dtype, device=adj.device)
        x = x / x.norm(dim=-1, keepdim=True)

        def power_step(x: Tensor) -> Tensor:
            new = _matvec(a, x) + x
            return new / new.norm(dim=-1, keepdim=True)

        return _iterate(power_step, x, n * tol, max_iter)
    # pagerank
    deg = a.sum(-1)  # (B?, N)
    dangling = deg == 0
    trans = (a / torch.where(dangling, torch.ones_like(deg), deg).unsqueeze(-1)).mT

    def pagerank_step(x: Tensor) -> Tensor:
        lost = (x * dangling).sum(-1, keepdim=True)
        return damping * (_matvec(trans, x) + lost / n) + (1.0 - damping) / n

    x = torch.full(a.shape[:-1], 1.0 / n, dtype=dtype, device=adj.device)
    return _iterate(pagerank_step, x, n * tol, max_iter)


def _matvec(m: Tensor, x: Tensor) -> Tensor:
    """m x for each graph, (B?, N, N) and (B?, N) -> (B?, N), as a product and a sum over the
    last axis: each row's sum in the same order whatever the batch (a batched matrix product
    may split a graph's sums differently from the product of that graph alone)."""
    return (m * x.unsqueeze(-2)).sum(-1)


def _iterate(step: Callable[[Tensor], Tensor], x: Tensor, tol: float, max_iter: int) -> Tensor:
    """x <- step(x) for each graph (the last axis of ``x`` is its nodes) until
    ‖step(x) − x‖₁ < ``tol`` for that graph, or ``max_iter`` steps: a graph that has converged
    keeps its value while the others go on, so each graph's result is the one it has alone,
    bit for bit, whatever the other graphs of its batch (one stopping test over the whole
    batch stopped every graph at the step where the sum of all their changes was small)."""
    going = torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device)
    for _ in range(max_iter):
        new = step(x)
        done = (new - x).abs().sum(-1) < tol
        x = torch.where(going.unsqueeze(-1), new, x)
        going = going & ~done
        if not going.any():
            break
    return x
