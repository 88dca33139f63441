"""Disabled edges (``MorphicLayer.disabled``, the edge ablation of 004 §5.4) in the terms of the
training objective: an edge the router cannot choose has probability 0 in the teacher and the
student of the distillation KL, is not an option of the utility penalty and is not a choice of the
context agreement. Each term is compared with a hand-written computation over the edges left."""

import math

import pytest
import torch
from torch.nn import functional as F

from graded.morphic import EdgeSet, GradedStateSpace, LinearBlock, MorphicLayer, Router
from graded.morphic.model import MorphicObjective, MorphicTransformer, routing_agreement

# destinations a: {aa}, b: {ab, bb}
PAIRS = [("a", "a", "aa"), ("a", "b", "ab"), ("b", "b", "bb")]
DISABLED = [set(), {1}, {0}, {0, 2}, {0, 1, 2}]


def space_and_edges() -> tuple[GradedStateSpace, EdgeSet]:
    space = GradedStateSpace({"a": 4, "b": 4})
    return space, EdgeSet.explicit(space, PAIRS)


def groups_of(normalization: str) -> list[list[int]]:
    return [[0, 1, 2]] if normalization == "global" else [[0], [1, 2]]


def model_with(normalization: str = "dest", stay: bool = True, disabled: set[int] = frozenset(),
               **objective) -> MorphicTransformer:
    torch.manual_seed(0)
    space, edges = space_and_edges()
    layer = MorphicLayer(space, edges, [LinearBlock(4, 4) for _ in edges],
                         router={"rank": 4, "normalization": normalization, "stay": stay,
                                 "init_std": 0.5},
                         thresholds=[0.1, 0.2, 0.05], train_routing="utility")
    layer.disabled = set(disabled)
    defaults = {"utility_weight": 1.0, "omega": "none", "distill_weight": 1.0}
    return MorphicTransformer(space, [layer], 7, max_len=8,
                              objective=MorphicObjective(**{**defaults, **objective}))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(4))
    targets = ids.roll(-1, 1)
    targets[1, 4:] = -100
    return ids, targets


def naive_kl(teacher: torch.Tensor, student: torch.Tensor, groups: list[list[int]],
             disabled: set[int], stay: bool) -> torch.Tensor:
    """Σ over groups of KL(softmax(teacher) ‖ softmax(student)) over the options left (the
    enabled edges, and the stay option with logit 0); a group with no option left adds 0."""
    total = teacher.new_zeros(teacher.shape[:-1])
    for group in groups:
        live = [e for e in group if e not in disabled]
        if not live and not stay:
            continue
        pad = [teacher.new_zeros(*teacher.shape[:-1], 1)] if stay else []
        lt = torch.log_softmax(torch.cat([teacher[..., live], *pad], -1), -1)
        ls = torch.log_softmax(torch.cat([student[..., live], *pad], -1), -1)
        total = total + (lt.exp() * (lt - ls)).sum(-1)
    return total


@pytest.mark.parametrize("disabled", DISABLED)
@pytest.mark.parametrize("stay", [True, False])
@pytest.mark.parametrize("normalization", ["dest", "global"])
def test_the_distillation_kl_is_the_kl_over_the_options_left_with_its_gradient(
        normalization, stay, disabled):
    """Before, ``Router.kl`` took no ``disabled``: the distillation compared teacher and student
    probabilities of edges neither could choose."""
    space, edges = space_and_edges()
    router = Router(space, edges, rank=2, normalization=normalization, stay=stay)
    gen = torch.Generator().manual_seed(7)
    t = (2 * torch.randn(2, 5, 3, generator=gen, dtype=torch.float64)).requires_grad_(True)
    s = (2 * torch.randn(2, 5, 3, generator=gen, dtype=torch.float64)).requires_grad_(True)
    got = router.kl(t, s, disabled) if disabled else router.kl(t, s)
    got.sum().backward()
    t2, s2 = t.detach().clone().requires_grad_(True), s.detach().clone().requires_grad_(True)
    want = naive_kl(t2, s2, groups_of(normalization), disabled, stay)
    if want.requires_grad:
        want.sum().backward()
    torch.testing.assert_close(got, want)
    for x, y in ((t, t2), (s, s2)):  # finite, 0 at the disabled edges (no 0 · log 0 = NaN)
        assert bool(torch.isfinite(x.grad).all())
        torch.testing.assert_close(x.grad, torch.zeros_like(x) if y.grad is None else y.grad)
        assert float(x.grad[..., sorted(disabled)].abs().sum()) == 0.0


def test_a_disabled_gate_adds_no_bernoulli_kl():
    space, edges = space_and_edges()
    router = Router(space, edges, rank=2, normalization="logistic")
    gen = torch.Generator().manual_seed(8)
    t = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    s = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64)
    pt, ps = torch.sigmoid(t.detach()), torch.sigmoid(s)
    per_gate = pt * (pt / ps).log() + (1 - pt) * ((1 - pt) / (1 - ps)).log()
    got = router.kl(t, s, {1})
    torch.testing.assert_close(got, per_gate[..., [0, 2]].sum(-1))
    got.sum().backward()
    assert float(t.grad[..., 1].abs().max()) == 0.0 and bool(torch.isfinite(t.grad).all())


@pytest.mark.parametrize("disabled", DISABLED)
@pytest.mark.parametrize("stay", [True, False])
@pytest.mark.parametrize("normalization", ["dest", "global"])
def test_distillation_and_utility_penalty_of_the_model_count_only_the_edges_left(
        normalization, stay, disabled):
    """``distill`` is the mean over scored tokens of the KL over the options left from
    β(ΔL − τ) to ℓ, ``utility_penalty`` the mean of Σ over enabled edges of
    softplus(β(τ_e − ΔL_e)), both recomputed from the layer's traces by hand."""
    model = model_with(normalization, stay, disabled)
    layer = model.layers[0]
    ids, targets = batch()
    _, metrics = model.training_loss(ids, targets)
    with torch.no_grad():
        _, traces = model.utility_routing(ids, targets)
    tr, valid = traces[0], targets != -100
    tau = layer.thresholds.float()
    teacher = layer.beta * (tr.utilities - tau)
    kl = naive_kl(teacher.double(), tr.context_logits.double(), groups_of(normalization),
                  disabled, stay)
    assert metrics["distill"] == pytest.approx(float(kl[valid].mean()), rel=1e-5, abs=1e-7)
    left = [e for e in range(3) if e not in disabled]
    psi = F.softplus(layer.beta * (tau[left] - tr.utilities[..., left])).sum(-1)
    assert metrics["utility_penalty"] == pytest.approx(float(psi[valid].mean()), rel=1e-5,
                                                       abs=1e-7)


@pytest.mark.parametrize("disabled", [{1}, {0, 2}, {0, 1, 2}])
@pytest.mark.parametrize("stay", [True, False])
def test_the_block_of_a_disabled_edge_gets_no_gradient_from_the_objective(stay, disabled):
    """Every term on: the LM loss (α_e = 0), Ω, the distillation and the utility penalty. Before,
    the penalty still pushed a disabled edge's block to raise its utility."""
    model = model_with("dest", stay, disabled, omega="entropy_penalty", omega_weight=1.0)
    loss, _ = model.training_loss(*batch())
    loss.backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()
               if p.grad is not None)
    blocks = model.layers[0].blocks
    for e in range(3):
        grads = [p.grad for p in blocks[e].parameters()]
        off = all(g is None or float(g.abs().max()) == 0.0 for g in grads)
        assert off == (e in disabled), (e, disabled)


def test_context_agreement_with_disabled_edges_counts_the_options_left_by_hand():
    """The worked example of ``test_context_agreement_counts_stay_choices_per_routed_group_by_hand``
    (test_model.py) with edges disabled; before, a disabled edge could be the argmax and a group
    left without a choice was counted."""
    sp = GradedStateSpace({"a": 2, "b": 2})
    es = EdgeSet.explicit(sp, [("a", "b", "e1"), ("b", "b", "e2"), ("a", "a", "e3")])
    u = torch.tensor([[[1.0, -1.0, 2.0], [-1.0, -2.0, -1.0]]])  # (1, 2, 3)
    c = torch.tensor([[[0.5, 0.2, -1.0], [-3.0, -1.0, -2.0]]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    router = Router(sp, es)
    assert float(routing_agreement(router, u, c, valid)) == pytest.approx(0.75)
    # e1 off: b is {e2, stay}: token 0 stay vs e2 (miss), token 1 stay = stay;
    # a is {e3, stay}: token 0 e3 vs stay (miss), token 1 stay = stay → 2 / 4
    assert float(routing_agreement(router, u, c, valid, {0})) == pytest.approx(0.5)
    # e3 off: a is left with stay alone (not counted); b: e1 = e1, stay = stay → 2 / 2
    assert float(routing_agreement(router, u, c, valid, {2})) == pytest.approx(1.0)
    # without stay a is always-on; with e2 off, b has e1 alone: no group has a choice
    assert math.isnan(float(routing_agreement(Router(sp, es, stay=False), u, c, valid, {1})))
    # logistic gates: token 0's gates (1, 0, 1) vs (1, 1, 0) differ, token 1's are all shut;
    # with e2, e3 off only e1's gate is compared: open in both at token 0
    gates = Router(sp, es, normalization="logistic")
    assert float(routing_agreement(gates, u, c, valid)) == pytest.approx(0.5)
    assert float(routing_agreement(gates, u, c, valid, {1, 2})) == pytest.approx(1.0)
    assert math.isnan(float(routing_agreement(gates, u, c, valid, {0, 1, 2})))


@pytest.mark.parametrize("disabled", DISABLED)
@pytest.mark.parametrize("normalization", ["dest", "global"])
def test_the_context_agreement_of_a_model_is_over_the_options_left(normalization, disabled):
    """Recounted from the traces: per scored token and group with two options or more left,
    argmax ℓ̃ = argmax ℓ over the enabled edges and the stay option."""
    model = model_with(normalization, True, disabled)
    ids, targets = batch()
    _, metrics = model.training_loss(ids, targets)
    with torch.no_grad():
        _, traces = model.utility_routing(ids, targets)
    tr = traces[0]
    hits = total = 0
    for b, t in (targets != -100).nonzero().tolist():
        for group in groups_of(normalization):
            live = [e for e in group if e not in disabled]
            if len(live) + 1 < 2:  # the stay option alone: no choice
                continue
            pick = [float(tr.utility_logits[b, t, e]) for e in live] + [0.0]
            ctx = [float(tr.context_logits[b, t, e]) for e in live] + [0.0]
            hits += max(range(len(pick)), key=pick.__getitem__) == max(
                range(len(ctx)), key=ctx.__getitem__)
            total += 1
    if total == 0:
        assert math.isnan(metrics["context_agreement"])
    else:
        assert metrics["context_agreement"] == pytest.approx(hits / total)


def test_the_utility_penalty_refuses_a_disabled_position_that_is_not_an_edge():
    from graded.morphic.objective import utility_penalty

    u, tau, valid = torch.zeros(1, 2, 3), torch.zeros(3), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"disabled edges must be edge positions in \[0, 3\), "
                                         r"got \[-1\]"):
        utility_penalty(u, tau, 1.0, valid, disabled={-1})


def test_the_diagnostics_of_a_layer_with_a_disabled_edge_give_it_no_mass_and_no_entropy():
    """``diagnostics.collect`` with edge 1 off: α(ℓ) and α(ℓ̃) are hand-written softmaxes over the
    options left (0 at edge 1), the entropy that of ``naive_entropy`` over the same options."""
    from graded.morphic import diagnostics

    model = model_with("dest", True, {1})
    ids, targets = batch()
    got = diagnostics.collect(model, [(ids, targets)])[0]
    for logits, probs in ((got["context_logits"], got["context_probs"]),
                          (got["utility_logits"], got["utility_probs"])):
        assert float(probs[:, 1].abs().max()) == 0.0
        for group in ([0], [2]):  # a: {aa, stay}; b: {bb, stay} once ab is off
            x = torch.cat([logits[:, group], logits.new_zeros(len(logits), 1)], -1)
            torch.testing.assert_close(probs[:, group], torch.softmax(x, -1)[:, :-1])
    entropy = torch.zeros(len(got["context_logits"]))
    for e in (0, 2):
        x = torch.stack([got["context_logits"][:, e], torch.zeros(len(entropy))], -1)
        p = torch.softmax(x, -1)
        entropy = entropy - (p * p.log()).sum(-1)
    torch.testing.assert_close(got["entropy"], entropy)
