import math

import pytest
import torch

from graded.morphic import EdgeSet, GradedStateSpace, Router


def setup(**kw):
    sp = GradedStateSpace({"a": 3, "b": 4})
    es = EdgeSet.explicit(sp, [("a", "b", "e1"), ("b", "b", "e2"), ("a", "a", "e3")])
    torch.manual_seed(0)
    r = Router(sp, es, rank=5, init_std=0.5, **kw)
    return sp, es, r


def test_context_logits_equal_the_bilinear_formula_with_causal_mean_pooling():
    sp, es, r = setup()
    z = torch.randn(2, 5, sp.total_dim)
    got = r.context_logits(z)
    for b in range(2):
        for t in range(5):
            c = z[b, :t].mean(0) if t > 0 else torch.zeros(sp.total_dim)
            u = r.proj_u(c)
            for i, e in enumerate(es):
                v = r.proj_v[e.source](sp.project(z[b, t], e.source))
                torch.testing.assert_close(got[b, t, i], u @ r.bilinear[i] @ v, atol=1e-5,
                                           rtol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "last", "attention"])
def test_context_logits_never_read_later_positions(pooling):
    sp, _, r = setup(pooling=pooling)
    z = torch.randn(2, 6, sp.total_dim)
    z2 = z.clone()
    z2[:, 4:] += 3.0
    torch.testing.assert_close(r.context_logits(z)[:, :4], r.context_logits(z2)[:, :4])


def test_per_token_routing_differs_across_tokens_of_one_batch():
    sp, _, r = setup()
    z = torch.randn(3, 6, sp.total_dim)
    alpha = r.route(r.context_logits(z)).weights  # (3, 6, E)
    flat = alpha.reshape(-1, alpha.shape[-1])
    assert (flat - flat[0]).abs().max() > 1e-3
    # and the routing of one sequence does not depend on the rest of the batch
    alone = r.route(r.context_logits(z[:1])).weights
    torch.testing.assert_close(alone, alpha[:1])


def test_normalisations_sum_to_one_globally_per_destination_or_not_at_all():
    for norm in ("global", "dest", "logistic"):
        _, es, r = setup(normalization=norm, stay=False)
        p = r.probabilities(torch.randn(2, 3, len(es)))
        if norm == "global":
            torch.testing.assert_close(p.sum(-1), torch.ones(2, 3))
        elif norm == "dest":
            for h in es.dests:
                torch.testing.assert_close(p[..., es.incoming(h)].sum(-1), torch.ones(2, 3))
        else:
            assert torch.all((p > 0) & (p < 1))


def test_temperature_divides_the_logits():
    _, es, r = setup(normalization="global", temperature=0.5, stay=False)
    logits = torch.randn(4, len(es))
    torch.testing.assert_close(r.probabilities(logits), torch.softmax(logits / 0.5, -1))


def test_hard_routing_is_one_hot_forward_with_a_straight_through_gradient():
    _, es, r = setup(normalization="global", mode="hard", stay=False)
    logits = torch.randn(4, len(es), requires_grad=True)
    w = r.route(logits).weights
    want = torch.nn.functional.one_hot(logits.argmax(-1), 3).float()
    torch.testing.assert_close(w.detach(), want)
    (w * torch.randn(4, 3)).sum().backward()
    assert logits.grad.abs().sum() > 0


def test_gumbel_routing_is_one_hot_per_group_with_gradient():
    _, es, r = setup(mode="gumbel", stay=False)
    logits = torch.randn(50, len(es), requires_grad=True)
    w = r.route(logits, stochastic=True, generator=torch.Generator().manual_seed(0)).weights
    for h in es.dests:
        torch.testing.assert_close(w[:, es.incoming(h)].sum(-1).detach(), torch.ones(50))
    w.sum(0)[0].backward()
    assert logits.grad.abs().sum() > 0


def test_reinforce_samples_follow_the_kernel_and_report_log_probabilities():
    _, _, r = setup(normalization="global", mode="reinforce", stay=False)
    logits = torch.tensor([[2.0, 0.0, -1.0]]).expand(20000, 3)
    route = r.route(logits, stochastic=True, generator=torch.Generator().manual_seed(0))
    freq = route.weights.mean(0)
    torch.testing.assert_close(freq, torch.softmax(logits[0], -1), atol=0.02, rtol=0)
    chosen = route.weights.argmax(-1)
    torch.testing.assert_close(route.log_prob, torch.log_softmax(logits, -1).gather(
        -1, chosen[:, None]).squeeze(-1))
    # at evaluation the stochastic modes route by argmax
    torch.testing.assert_close(r.route(logits[:1]).weights, torch.tensor([[1.0, 0.0, 0.0]]))


def test_kl_and_entropy_match_the_textbook_formulas():
    _, _, r = setup(normalization="global", stay=False)
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    pa, pb = torch.softmax(a, -1), torch.softmax(b, -1)
    torch.testing.assert_close(r.kl(a, b), (pa * (pa.log() - pb.log())).sum(-1))
    torch.testing.assert_close(r.entropy(a), -(pa * pa.log()).sum(-1))


def test_router_rejects_bad_options():
    sp = GradedStateSpace({"a": 2})
    es = EdgeSet.explicit(sp, [("a", "a")])
    with pytest.raises(ValueError, match="'sideways'"):
        Router(sp, es, normalization="sideways")
    with pytest.raises(ValueError, match="temperature"):
        Router(sp, es, temperature=0.0)
    with pytest.raises(ValueError, match="stay must be True or False, got 'yes'"):
        Router(sp, es, stay="yes")


def test_routing_limits_one_hot_as_temperature_vanishes_and_indicator_for_sharp_gates():
    """004 Prop 4.9 (τ → 0⁺: one-hot at the argmax) and Prop 3.8 (logistic → indicator)."""
    sp = GradedStateSpace({"a": 2})
    es = EdgeSet.explicit(sp, [("a", "a", "x"), ("a", "a", "y"), ("a", "a", "z")])
    logits = torch.tensor([[0.3, 0.5, -0.2]])
    cold = Router(sp, es, normalization="global", temperature=1e-3, stay=False).probabilities(
        logits)
    torch.testing.assert_close(cold, torch.tensor([[0.0, 1.0, 0.0]]))
    gates = Router(sp, es, normalization="logistic", temperature=1e-3, stay=False)
    torch.testing.assert_close(gates.probabilities(torch.tensor([[0.3, -0.5, 0.0]])),
                               torch.tensor([[1.0, 0.0, 0.5]]))


# ------------------------------------------------- the identity ("stay") option, the default
# setup(): e1 = b <- a, e2 = b <- b (destination b has two edges), e3 = a <- a (a has one).


def hand_weights(norm, logits, temperature=1.0):
    """α per edge and identity mass s per destination (b, a), written out token by token."""
    alpha = torch.zeros_like(logits)
    stay = torch.zeros(*logits.shape[:-1], 2)
    for n in range(logits.shape[0]):
        x = [float(v) / temperature for v in logits[n]]
        if norm == "dest":
            zb = 1 + math.exp(x[0]) + math.exp(x[1])
            za = 1 + math.exp(x[2])
            alpha[n] = torch.tensor([math.exp(x[0]) / zb, math.exp(x[1]) / zb, math.exp(x[2]) / za])
            stay[n] = torch.tensor([1 / zb, 1 / za])
        elif norm == "global":
            zz = 1 + sum(math.exp(v) for v in x)
            alpha[n] = torch.tensor([math.exp(v) / zz for v in x])
            stay[n] = torch.tensor([1 - alpha[n, 0] - alpha[n, 1], 1 - alpha[n, 2]])
        else:
            g = [1 / (1 + math.exp(-v)) for v in x]
            db = g[0] + g[1] + (1 - g[0]) * (1 - g[1])
            alpha[n] = torch.tensor([g[0] / db, g[1] / db, g[2]])
            stay[n] = torch.tensor([(1 - g[0]) * (1 - g[1]) / db, 1 - g[2]])
    return alpha, stay


@pytest.mark.parametrize("norm", ["dest", "global", "logistic"])
def test_default_soft_weights_hold_the_identity_as_an_option_with_positive_mass(norm):
    _, es, r = setup(normalization=norm, temperature=0.7)
    assert r.stay  # the default
    logits = torch.randn(6, len(es)) * 3
    alpha = r.route(logits).weights
    want, stay = hand_weights(norm, logits, 0.7)
    torch.testing.assert_close(alpha, want)
    torch.testing.assert_close(r.identity_mass(alpha), stay)
    assert torch.all(stay > 0)
    # the single edge into a still routes: its weight is neither 0 nor 1 and varies by token
    assert torch.all((alpha[:, 2] > 0) & (alpha[:, 2] < 1)) and alpha[:, 2].std() > 1e-3
    # no destination is always-on; both are routed groups
    assert r.always_on == [] and len(r.routed_groups) == (1 if norm == "global" else 2)


def test_stay_option_enters_entropy_kl_and_hard_routing_as_a_logit_zero_option():
    _, _, r = setup(normalization="dest", mode="hard")
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    groups = [[0, 1], [2]]

    def ext(x, idx):
        return torch.cat([x[:, idx], torch.zeros(x.shape[0], 1)], -1)

    want_h = sum(-(torch.softmax(ext(a, g), -1) * torch.log_softmax(ext(a, g), -1)).sum(-1)
                 for g in groups)
    want_kl = sum((torch.softmax(ext(a, g), -1) * (torch.log_softmax(ext(a, g), -1)
                   - torch.log_softmax(ext(b, g), -1))).sum(-1) for g in groups)
    torch.testing.assert_close(r.entropy(a), want_h)
    torch.testing.assert_close(r.kl(a, b), want_kl)
    logits = torch.tensor([[-1.0, -2.0, 0.5], [1.0, 2.0, -0.5]])
    # row 0: stay wins in b (0 > -1, -2), e3 wins in a; row 1: e2 wins in b, stay wins in a
    torch.testing.assert_close(r.route(logits).weights.detach(),
                               torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))


def test_reinforce_with_stay_samples_the_kernel_over_edges_and_identity():
    _, _, r = setup(normalization="global", mode="reinforce")
    logits = torch.tensor([[1.0, 0.0, -1.0]]).expand(20000, 3)
    route = r.route(logits, stochastic=True, generator=torch.Generator().manual_seed(0))
    kernel = torch.softmax(torch.tensor([1.0, 0.0, -1.0, 0.0]), -1)
    torch.testing.assert_close(route.weights.mean(0), kernel[:3], atol=0.02, rtol=0)
    stayed = route.weights.sum(-1) == 0
    assert abs(float(stayed.float().mean()) - float(kernel[3])) < 0.02
    choice = torch.where(stayed, 3, route.weights.argmax(-1))
    torch.testing.assert_close(route.log_prob, kernel.log()[choice])


def test_a_single_edge_destination_without_stay_is_an_always_on_block():
    sp, _, r = setup(normalization="dest", stay=False, mode="reinforce")
    assert r.always_on == [2]  # e3 is the only edge into a
    assert r.routed_groups == [[0, 1]]
    logits = torch.randn(400, 3)
    torch.testing.assert_close(r.probabilities(logits)[:, 2], torch.ones(400))
    # the entropy is the two-edge group's alone
    pb = torch.softmax(logits[:, :2], -1)
    torch.testing.assert_close(r.entropy(logits), -(pb * pb.log()).sum(-1))
    # REINFORCE: the always-on edge is always taken and adds log 1 = 0 to log K(sample)
    route = r.route(logits, stochastic=True, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(route.weights[:, 2], torch.ones(400))
    chosen = route.weights[:, :2].argmax(-1)
    torch.testing.assert_close(route.log_prob, pb.log().gather(-1, chosen[:, None]).squeeze(-1))
    # with the stay option the same destination is routed (edge or stay)
    _, _, routed = setup(normalization="dest")
    assert routed.always_on == [] and routed.routed_groups == [[0, 1], [2]]
    # a global softmax over a single edge without stay has no choice either
    one = EdgeSet.explicit(sp, [("a", "a", "only")])
    assert Router(sp, one, normalization="global", stay=False).always_on == [0]
    assert Router(sp, one, normalization="logistic", stay=False).always_on == []


def test_logistic_hard_gates_share_a_destination_and_a_closed_gate_keeps_the_identity():
    _, _, r = setup(normalization="logistic", mode="hard")
    logits = torch.tensor([[1.0, 2.0, -1.0], [1.0, -2.0, 3.0], [-1.0, -2.0, 3.0]])
    # open gates into b share it equally; one open gate takes it; closed gates leave α = 0
    torch.testing.assert_close(r.route(logits).weights.detach(), torch.tensor(
        [[0.5, 0.5, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]))


@pytest.mark.parametrize("normalization", ["global", "dest", "logistic"])
def test_a_nan_logit_gives_its_edge_a_nan_probability_not_zero(normalization):
    """NaN logits were turned into probability 0 (``nan_to_num``), which reads as a token that
    routes nowhere: a measurement (004 Thm 5.5's α*) took it for a real value and training
    went on with a finite loss. The NaN now reaches the edge's probability; a group whose
    every option is disabled still gets 0."""
    _, _, r = setup(normalization=normalization)
    logits = torch.tensor([[0.5, float("nan"), -1.0], [0.3, 0.2, 0.1]])
    p = r.probabilities(logits)
    assert torch.isnan(p[0, 1]) and torch.isfinite(p[1]).all()
    torch.testing.assert_close(p[1], r.probabilities(logits[1:])[0])
    every = r.probabilities(torch.zeros(1, 3), disabled={0, 1, 2})
    assert torch.isfinite(every).all()
