"""Hard top-k routing breaks ties as the argmax of top-1 routing does: the first option of the
group first (the edges in order, then the stay option), checked against a naive per-group loop
in float64. ``topk`` left the order of ties unspecified, so the edges a tie selected depended on
the kernel (on CPU it kept a later edge over the group's first)."""

from __future__ import annotations

import pytest
import torch

from graded.morphic import EdgeSet, GradedStateSpace, Router


def _router(normalization: str, top_k: int) -> Router:
    space = GradedStateSpace({"a": 3, "b": 2})
    edges = EdgeSet(space, [("a", "b", "t1"), ("b", "b", "t2"), ("b", "a", "back")])
    return Router(space, edges, normalization=normalization, mode="hard", top_k=top_k).double()


def _naive_top_k(router: Router, logits: torch.Tensor) -> torch.Tensor:
    """Per token and group: softmax over [edges | stay (logit 0)], options ranked by
    (−probability, column), the first k kept with their renormalised shares."""
    n = len(router.edges)
    out = torch.zeros(*logits.shape[:-1], n, dtype=torch.float64)
    groups = ([list(range(n))] if router.normalization == "global"
              else [router.edges.incoming(h) for h in router.edges.dests])
    for pos in torch.cartesian_prod(*[torch.arange(s) for s in logits.shape[:-1]]).tolist():
        for g in groups:
            x = torch.tensor([float(logits[(*pos, i)]) for i in g] + [0.0], dtype=torch.float64)
            p = torch.softmax(x, 0).tolist()
            ranked = sorted(range(len(p)), key=lambda j: (-p[j], j))[:router.top_k]
            total = sum(p[j] for j in ranked)
            for j in ranked:
                if j < len(g):  # a kept stay option adds no edge weight
                    out[(*pos, g[j])] = p[j] / total
    return out


@pytest.mark.parametrize(("normalization", "top_k", "want"), [
    ("global", 2, [0.5, 0.5, 0.0]), ("global", 3, [1 / 3, 1 / 3, 1 / 3]),
    ("dest", 2, [0.5, 0.5, 0.5]),
])
def test_top_k_of_tied_options_keeps_the_first_edges_like_argmax(normalization, top_k, want):
    """All logits 0, every option of a group tied: the first k columns are kept. Under
    "global" with k = 2, ``topk`` kept "back" and the stay option, dropping t1, the option
    top-1 routing (argmax) takes."""
    router = _router(normalization, top_k)
    weights = router.route(torch.zeros(1, 1, 3, dtype=torch.float64)).weights
    assert weights[0, 0].tolist() == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize("normalization", ["global", "dest"])
@pytest.mark.parametrize("top_k", [2, 3])
def test_top_k_weights_equal_a_naive_ranking_with_ties(normalization, top_k):
    """Logits drawn from {−1, 0, 1} (many ties, with each other and with the stay's 0)."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-1, 2, (4, 6, 3), generator=gen).double()
    router = _router(normalization, top_k)
    got = router.route(logits).weights
    torch.testing.assert_close(got, _naive_top_k(router, logits), rtol=0, atol=1e-15)
