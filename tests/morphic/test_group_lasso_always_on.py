"""The group-lasso Ω (004 §3.3, notes B8) sums over the edges the router chooses: an always-on
block (the only option of its group, K ≡ 1) cannot be switched off and is left out, as the
routing entropy leaves it out. It used to add a constant 1 per such block to Ω."""

import math

import pytest
import torch

from graded.morphic import EdgeSet, GradedStateSpace, Router, routing_regularizer


def _router():
    sp = GradedStateSpace({"a": 2, "b": 3, "c": 2})
    # into b: two edges (a choice); into a and into c: one edge each (no choice, stay=False)
    es = EdgeSet.explicit(sp, [("a", "b"), ("b", "b"), ("b", "a"), ("a", "c")])
    return Router(sp, es, stay=False)


def test_group_lasso_leaves_out_the_always_on_blocks_and_sums_the_routed_edges_by_hand():
    router = _router()
    assert sorted(router.always_on) == [2, 3]
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 4, dtype=torch.float64)
    probs = router.probabilities(logits)
    assert torch.equal(probs[..., 2:], torch.ones(2, 5, 2, dtype=torch.float64))  # K ≡ 1
    valid = torch.tensor([[True] * 5, [True, True, False, False, False]])
    # by hand: the two edges into b, √(Σ_t K_t(e)² / N) over the N = 7 valid tokens
    tokens = [(b, t) for b in range(2) for t in range(5) if valid[b, t]]
    want = sum(math.sqrt(sum(float(probs[b, t, e]) ** 2 for b, t in tokens) / len(tokens))
               for e in (0, 1))
    got = routing_regularizer("group_lasso", entropy=torch.zeros(2, 5), alpha=probs,
                              valid=valid, always_on=router.always_on)
    assert float(got) == pytest.approx(want, rel=1e-9, abs=1e-9)
    from graded.morphic.objective import group_lasso

    assert float(group_lasso(probs, valid, always_on=router.always_on)) == pytest.approx(want)
    # without always_on every edge counts: the two always-on blocks add 1 each
    every = routing_regularizer("group_lasso", entropy=torch.zeros(2, 5), alpha=probs,
                                valid=valid)
    assert float(every) == pytest.approx(want + 2.0, abs=1e-5)


def test_a_layer_of_always_on_blocks_only_has_a_group_lasso_of_zero():
    from graded.morphic.objective import group_lasso

    sp = GradedStateSpace({"a": 2, "b": 2})
    router = Router(sp, EdgeSet.explicit(sp, [("a", "b"), ("b", "a")]), stay=False)
    probs = router.probabilities(torch.randn(1, 3, 2))
    got = group_lasso(probs, torch.ones(1, 3, dtype=torch.bool), always_on=router.always_on)
    assert float(got) == 0.0


@pytest.mark.parametrize("bad", [[4], [-1], [True]])
def test_always_on_must_be_edge_positions(bad):
    from graded.morphic.objective import group_lasso

    with pytest.raises(ValueError, match=r"edge positions in \[0, 4\)"):
        group_lasso(torch.ones(1, 2, 4), torch.ones(1, 2, dtype=torch.bool), always_on=bad)


def test_lgt_objective_passes_the_always_on_blocks_to_its_group_lasso():
    from graded.morphic import lgt_objective

    router = _router()
    probs = router.probabilities(torch.randn(1, 4, 4))
    valid = torch.ones(1, 4, dtype=torch.bool)
    zeros = torch.zeros(1, 4, 4)
    got = lgt_objective(torch.tensor(0.0), zeros, torch.zeros(4), beta=1.0, lam=0.0, mu=1.0,
                        omega="group_lasso", entropy=torch.zeros(1, 4), alpha=probs,
                        valid=valid, always_on=router.always_on)
    want = sum(float(probs[0, :, e].pow(2).mean().sqrt()) for e in (0, 1))
    assert float(got) == pytest.approx(want, rel=1e-5)


def test_the_models_training_terms_leave_the_always_on_blocks_out_of_omega():
    """MorphicTransformer.training_terms passes each layer's always-on blocks to Ω: its
    ``omega`` is the hand sum over every layer's routed edges of √(Σ_t K_t(e)² / N)."""
    from graded.morphic import (
        BandedBlocks,
        FFNBlock,
        Grade,
        GradeTypedAttention,
        MorphicLayer,
        MorphicObjective,
        MorphicTransformer,
    )

    from .test_model import batch

    torch.manual_seed(0)
    sp = GradedStateSpace([Grade("g0", 4, 0), Grade("g1", 4, 1), Grade("g2", 4, 2)])
    router = {"rank": 4, "stay": False}  # a grade with one edge into it: an always-on block
    bb = BandedBlocks(sp, [0, 1])
    es = EdgeSet.explicit(sp, [("g0", "g2", "att"), ("g1", "g2", "ffn"), ("g1", "g1", "keep")])
    blocks = [GradeTypedAttention(4, 4, num_heads=2, head_dim=2, value_source="source"),
              FFNBlock(4, 4, 8), FFNBlock(4, 4, 8)]
    model = MorphicTransformer(
        sp, [MorphicLayer(sp, bb.edge_set, bb, router=router),
             MorphicLayer(sp, es, blocks, router=router)],
        vocab_size=9, max_len=16, objective=MorphicObjective(omega="group_lasso")).eval()
    assert any(layer.router.always_on for layer in model.layers)  # the test needs one
    ids, targets = batch()
    _, metrics = model.training_terms(ids, targets)
    with torch.no_grad():
        _, traces = model._run(ids, targets, stochastic=False)
    valid = targets != model.ignore_index
    tokens = valid.nonzero().tolist()
    want = 0.0
    for layer, tr in zip(model.layers, traces, strict=True):
        for e in range(tr.probs.shape[-1]):
            if e in layer.router.always_on:
                continue
            want += math.sqrt(sum(float(tr.probs[b, t, e]) ** 2 for b, t in tokens)
                              / len(tokens))
    assert float(metrics["omega"]) == pytest.approx(want, rel=1e-5, abs=1e-6)
