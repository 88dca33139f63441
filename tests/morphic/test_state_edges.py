import pytest
import torch

from graded.morphic import EdgeSet, Grade, GradedStateSpace, Router, masked_pair_softmax


def space3():
    return GradedStateSpace([Grade("a", 2, 0), Grade("b", 3, 1), Grade("c", 4, 2)])


def test_projections_and_inclusions_satisfy_the_direct_sum_identities():
    sp = space3()
    x = {g: torch.randn(5, sp.dim(g)) for g in sp.labels}
    for g in sp.labels:
        for h in sp.labels:
            got = sp.project(sp.include(x[g], g), h)
            want = x[g] if g == h else torch.zeros(5, sp.dim(h))
            torch.testing.assert_close(got, want)
    z = torch.randn(5, sp.total_dim)
    torch.testing.assert_close(sum(sp.include(sp.project(z, g), g) for g in sp.labels), z)
    torch.testing.assert_close(sp.join(sp.split(z)), z)


def test_replace_swaps_exactly_one_slot():
    sp = space3()
    z = torch.randn(2, sp.total_dim)
    x = torch.randn(2, 3)
    out = sp.replace(z, "b", x)
    torch.testing.assert_close(out, z - sp.include(sp.project(z, "b"), "b") + sp.include(x, "b"))


def test_replace_refuses_a_component_of_the_wrong_width_or_an_unknown_grade():
    """A component narrower than d_h used to broadcast into the slot (a (2, 1) x filled all
    three columns of grade b); an unknown label raised a bare KeyError."""
    sp = space3()
    z = torch.randn(2, sp.total_dim)
    with pytest.raises(ValueError, match=r"'b' has shape \(2, 1\), expected \(\.\.\., 3\)"):
        sp.replace(z, "b", torch.zeros(2, 1))
    with pytest.raises(ValueError, match="unknown grade 'zz'"):
        sp.replace(z, "zz", torch.zeros(2, 3))
    # a component without batch dimensions still broadcasts over the batch, as slicing does
    out = sp.replace(z, "c", torch.arange(4.0))
    torch.testing.assert_close(out[:, 5:], torch.arange(4.0).expand(2, 4))
    torch.testing.assert_close(out[:, :5], z[:, :5])


def test_bad_grades_raise_with_the_bad_value():
    with pytest.raises(ValueError, match="unique"):
        GradedStateSpace([Grade("a", 2), Grade("a", 3)])
    with pytest.raises(ValueError, match="positive"):
        Grade("a", 0)
    with pytest.raises(ValueError, match="'zz'"):
        space3().project(torch.zeros(1, 9), "zz")
    with pytest.raises(ValueError, match="expected Σ d_g = 9"):
        space3().check_state(torch.zeros(1, 8))


def test_banded_edges_match_the_definition_h_minus_g_in_delta():
    sp = space3()
    es = EdgeSet.banded(sp, [0, 1])
    got = {(e.source, e.dest) for e in es}
    want = {(g, h) for g in sp.labels for h in sp.labels if sp.index(h) - sp.index(g) in (0, 1)}
    assert got == want


def test_dag_rejects_cycles_and_unknown_grades():
    sp = space3()
    EdgeSet.dag(sp, [("a", "b"), ("b", "c"), ("c", "c")])
    with pytest.raises(ValueError, match="cycle"):
        EdgeSet.dag(sp, [("a", "b"), ("b", "c"), ("c", "a")])
    with pytest.raises(ValueError, match="unknown grade 'x'"):
        EdgeSet.explicit(sp, [("a", "x")])


def test_masking_puts_zero_mass_outside_the_edge_set():
    sp = space3()
    es = EdgeSet.explicit(sp, [("a", "b"), ("b", "b"), ("c", "a")])
    mask = es.pair_mask()
    logits = torch.randn(7, 3, 3) * 10
    alpha = masked_pair_softmax(logits, mask)
    assert torch.all(alpha[:, ~mask] == 0)
    torch.testing.assert_close(alpha.sum((-1, -2)), torch.ones(7))
    # the edge-list router with global normalisation and no stay option gives the same
    # distribution on 𝓔
    router = Router(sp, es, normalization="global", stay=False)
    edge_logits = torch.stack(
        [logits[:, sp.position(e.dest), sp.position(e.source)] for e in es], -1)
    probs = router.probabilities(edge_logits)
    torch.testing.assert_close(probs, torch.stack(
        [alpha[:, sp.position(e.dest), sp.position(e.source)] for e in es], -1))


def test_disabled_edges_get_zero_mass_and_the_rest_renormalise():
    sp = space3()
    es = EdgeSet.explicit(sp, [("a", "b"), ("b", "b"), ("c", "b")])
    router = Router(sp, es, stay=False)
    logits = torch.randn(4, 5, 3)
    p = router.probabilities(logits, disabled={1})
    assert torch.all(p[..., 1] == 0)
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 5))
