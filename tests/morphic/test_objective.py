import torch
from torch.nn import functional as F

from graded.morphic import (
    EdgeSet,
    GradedStateSpace,
    LinearBlock,
    MorphicLayer,
    UtilityProbe,
    lgt_objective,
    routing_regularizer,
    threshold_gradient,
    utility_penalty,
)


def tiny_layer(train_routing="utility"):
    torch.manual_seed(0)
    sp = GradedStateSpace({"a": 2, "b": 3})
    es = EdgeSet.explicit(sp, [("a", "b"), ("b", "b"), ("b", "a")])
    blocks = [LinearBlock(sp.dim(e.source), sp.dim(e.dest)) for e in es]
    layer = MorphicLayer(sp, es, blocks, router={"rank": 3, "init_std": 0.3}, beta=2.0,
                         thresholds=[0.1, 0.0, 0.2], train_routing=train_routing).double()
    return sp, es, layer


def l_gt(layer, z, w, b, targets, tau, *, attach="all"):
    probe = UtilityProbe(w, b, targets, attach=attach)
    z_new, tr = layer(z, probe)
    lm = F.cross_entropy((z_new @ w.T + b).flatten(0, 1), targets.flatten())
    ent = layer.router.entropy(tr.routing_logits)
    valid = targets != -100
    return lgt_objective(lm, tr.utilities, tau, beta=layer.beta, lam=0.5, mu=0.1,
                         omega="entropy_penalty", entropy=ent, alpha=tr.probs, valid=valid)


def test_gradcheck_of_l_gt_in_float64():
    """With context routing L_GT is an ordinary function of (z, readout, τ) and autograd must
    equal finite differences. (Under utility routing ℓ̃ detaches ΔL on purpose, 004 Lemma 4.4,
    so autograd is then not the total derivative; see the next tests.)"""
    sp, _, layer = tiny_layer("context")
    z = torch.randn(1, 3, sp.total_dim, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, sp.total_dim, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 4, (1, 3))
    tau = layer.thresholds.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z_, w_, b_, t_: l_gt(layer, z_, w_, b_, targets, t_),
                                    (z, w, b, tau))


def test_threshold_gradient_is_nonnegative_and_equals_lambda_beta_mean_sigmoid():
    """∂L_GT/∂τ_e = +λβ mean_t σ(β(τ_e − ΔL_t(e))) ≥ 0; 004 Prop 4.8 prints the opposite sign."""
    sp, _, layer = tiny_layer()
    z = torch.randn(2, 4, sp.total_dim, dtype=torch.float64)
    w, b = torch.randn(4, sp.total_dim, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    targets = torch.randint(0, 4, (2, 4))
    tau = layer.thresholds.clone().requires_grad_(True)
    l_gt(layer, z, w, b, targets, tau).backward()
    assert torch.all(tau.grad >= 0)
    probe = UtilityProbe(w, b, targets)
    _, tr = layer(z, probe)
    closed = threshold_gradient(tr.utilities, tau.detach(), beta=layer.beta, lam=0.5,
                                valid=targets != -100)
    torch.testing.assert_close(tau.grad, closed)
    # finite difference on one threshold
    eps = 1e-6
    bump = torch.zeros(3, dtype=torch.float64)
    bump[1] = eps
    with torch.no_grad():
        up = l_gt(layer, z, w, b, targets, tau.detach() + bump)
        down = l_gt(layer, z, w, b, targets, tau.detach() - bump)
    torch.testing.assert_close((up - down) / (2 * eps), tau.grad[1], atol=1e-6, rtol=1e-5)


def test_utility_penalty_is_the_mean_over_valid_tokens_of_summed_softplus():
    util = torch.randn(2, 3, 4)
    tau = torch.rand(4)
    valid = torch.tensor([[True, False, True], [True, True, True]])
    got = utility_penalty(util, tau, 3.0, valid)
    rows = [torch.log1p(torch.exp(3.0 * (tau - util[b, t]))).sum()
            for b in range(2) for t in range(3) if valid[b, t]]
    torch.testing.assert_close(got, torch.stack(rows).mean())


def test_regularisers_match_their_definitions():
    alpha = torch.softmax(torch.randn(2, 3, 4), -1)
    ent = -(alpha * alpha.log()).sum(-1)
    valid = torch.ones(2, 3, dtype=torch.bool)
    torch.testing.assert_close(routing_regularizer("entropy_penalty", entropy=ent, alpha=alpha,
                                                   valid=valid), ent.mean())
    torch.testing.assert_close(routing_regularizer("entropy_bonus", entropy=ent, alpha=alpha,
                                                   valid=valid), -ent.mean())
    flat = alpha.reshape(-1, 4)
    want = sum(torch.sqrt((flat[:, e] ** 2).sum() / 6) for e in range(4))
    torch.testing.assert_close(routing_regularizer("group_lasso", entropy=ent, alpha=alpha,
                                                   valid=valid), want, atol=1e-5, rtol=1e-5)


def test_utility_logits_detach_the_utilities():
    sp, _, layer = tiny_layer()
    z = torch.randn(1, 3, sp.total_dim, dtype=torch.float64)
    w, b = torch.randn(4, sp.total_dim, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    _, tr = layer(z, UtilityProbe(w, b, torch.randint(0, 4, (1, 3))))
    want = tr.context_logits + layer.beta * (tr.utilities - layer.thresholds)
    torch.testing.assert_close(tr.utility_logits, want)
    grads = torch.autograd.grad(tr.utility_logits.sum(), list(layer.blocks.parameters()),
                                allow_unused=True)
    assert all(g is None or g.abs().sum() == 0 for g in grads)
