"""Edge sets and the paper-reference layer: the checks no other test reaches, and the paper
layer's hard routing, thresholds and untouched grades against direct computations."""

import pytest
import torch
from torch.nn import functional as F

from graded.morphic import EdgeSet, GradedStateSpace
from graded.morphic.edges import Edge, masked_pair_softmax
from graded.morphic.reference import PaperGradedLayer, paper_lm_loss

SPACE = GradedStateSpace({"a": 2, "b": 3})


def test_edges_know_whether_they_preserve_the_grade():
    assert Edge("a", "a", "x").is_preserving and not Edge("a", "b", "y").is_preserving


def test_edge_set_checks_its_edges():
    with pytest.raises(TypeError, match=r"an edge is Edge or \(source, dest\[, name\]\), got "
                                        r"\('a',\)"):
        EdgeSet(SPACE, [("a",)])
    with pytest.raises(ValueError, match=r"an edge set needs at least one edge, got none"):
        EdgeSet(SPACE, [])
    with pytest.raises(ValueError, match=r"edge names must be unique, got \['e', 'e'\]"):
        EdgeSet(SPACE, [("a", "b", "e"), ("b", "a", "e")])


def test_edge_set_repr_and_positions():
    es = EdgeSet(SPACE, [("a", "b"), ("b", "b", "self")])
    assert repr(es) == "EdgeSet(['b<-a', 'self'])"
    assert es.position("self") == 1
    with pytest.raises(ValueError, match=r"unknown edge 'x'; expected one of \['b<-a', 'self'\]"):
        es.position("x")


def test_masked_pair_softmax_checks_the_mask():
    logits = torch.zeros(2, 2)
    with pytest.raises(ValueError, match=r"mask must be bool of shape \(2, 2\), got torch.int64 "
                                         r"\(2, 2\)"):
        masked_pair_softmax(logits, torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask admits no edge"):
        masked_pair_softmax(logits, torch.zeros(2, 2, dtype=torch.bool))


def test_paper_layer_hard_routing_takes_the_argmax_edge_and_leaves_unfed_grades():
    torch.manual_seed(0)
    grades, dims = ["a", "b", "c"], {"a": 3, "b": 4, "c": 2}
    pairs = [("a", "b"), ("b", "b")]  # c has no incoming edge
    tau = {"b|a": 0.3}
    layer = PaperGradedLayer(grades, pairs, dims, r=4, beta=2.0, tau_map=tau)
    assert layer.tau["b|a"] == 0.3 and layer.tau["b|b"] == 0.0
    head = torch.nn.Linear(9, 5)
    zd = {g: torch.randn(6, dims[g]) for g in grades}
    y = torch.randint(0, 5, (6,))
    new, aux = layer(zd, y, paper_lm_loss(head, grades), soften=False)
    logits = torch.stack([aux["logits"][e] for e in pairs])
    best = int(logits.argmax())
    assert [float(aux["alpha"][e]) for e in pairs] == [1.0 if i == best else 0.0
                                                       for i in range(2)]
    # the threshold enters the logit as −β·τ: logit = bilinear + β(ΔL − τ)
    u = layer.proj_u(torch.cat([zd[g] for g in grades], -1)).mean(0, keepdim=True)
    v = layer.proj_v["a"](zd["a"]).mean(0, keepdim=True)
    bilinear = (u @ layer.W["b|a"] @ v.t()).squeeze()
    torch.testing.assert_close(aux["logits"][("a", "b")],
                               bilinear + 2.0 * (aux["utilities"][("a", "b")] - 0.3))
    g, h = pairs[best]
    expected_b = F.layer_norm(layer.phi[f"{h}|{g}"](zd[g]), (4,),
                              layer.norm["b"].weight, layer.norm["b"].bias)
    torch.testing.assert_close(new["b"], expected_b)
    assert new["c"] is zd["c"] and new["a"] is zd["a"]
