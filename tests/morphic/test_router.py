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
        _, es, r = setup(normalization=norm)
        p = r.probabilities(torch.randn(2, 3, len(es)))
        if norm == "global":
            torch.testing.assert_close(p.sum(-1), torch.ones(2, 3))
        elif norm == "dest":
            for h in es.dests:
                torch.testing.assert_close(p[..., es.incoming(h)].sum(-1), torch.ones(2, 3))
        else:
            assert torch.all((p > 0) & (p < 1))


def test_temperature_divides_the_logits():
    _, es, r = setup(normalization="global", temperature=0.5)
    logits = torch.randn(4, len(es))
    torch.testing.assert_close(r.probabilities(logits), torch.softmax(logits / 0.5, -1))


def test_hard_routing_is_one_hot_forward_with_a_straight_through_gradient():
    _, es, r = setup(normalization="global", mode="hard")
    logits = torch.randn(4, len(es), requires_grad=True)
    w = r.route(logits).weights
    want = torch.nn.functional.one_hot(logits.argmax(-1), 3).float()
    torch.testing.assert_close(w.detach(), want)
    (w * torch.randn(4, 3)).sum().backward()
    assert logits.grad.abs().sum() > 0


def test_gumbel_routing_is_one_hot_per_group_with_gradient():
    _, es, r = setup(mode="gumbel")
    logits = torch.randn(50, len(es), requires_grad=True)
    w = r.route(logits, stochastic=True, generator=torch.Generator().manual_seed(0)).weights
    for h in es.dests:
        torch.testing.assert_close(w[:, es.incoming(h)].sum(-1).detach(), torch.ones(50))
    w.sum(0)[0].backward()
    assert logits.grad.abs().sum() > 0


def test_reinforce_samples_follow_the_kernel_and_report_log_probabilities():
    _, _, r = setup(normalization="global", mode="reinforce")
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
    _, _, r = setup(normalization="global")
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


def test_routing_limits_one_hot_as_temperature_vanishes_and_indicator_for_sharp_gates():
    """004 Prop 4.9 (τ → 0⁺: one-hot at the argmax) and Prop 3.8 (logistic → indicator)."""
    sp = GradedStateSpace({"a": 2})
    es = EdgeSet.explicit(sp, [("a", "a", "x"), ("a", "a", "y"), ("a", "a", "z")])
    logits = torch.tensor([[0.3, 0.5, -0.2]])
    cold = Router(sp, es, normalization="global", temperature=1e-3).probabilities(logits)
    torch.testing.assert_close(cold, torch.tensor([[0.0, 1.0, 0.0]]))
    gates = Router(sp, es, normalization="logistic", temperature=1e-3)
    torch.testing.assert_close(gates.probabilities(torch.tensor([[0.3, -0.5, 0.0]])),
                               torch.tensor([[1.0, 0.0, 0.5]]))
