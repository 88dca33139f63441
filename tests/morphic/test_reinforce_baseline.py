"""What ``reinforce_surrogate``'s baseline is, checked by enumerating every sample."""

import itertools

import torch

from graded.morphic import EdgeSet, GradedStateSpace, Router
from graded.morphic.objective import reinforce_surrogate
from graded.morphic.router import gate_weights


def logistic_router() -> Router:
    space = GradedStateSpace({"a": 2, "b": 2})
    edges = EdgeSet.explicit(space, [("a", "b", "e1"), ("b", "b", "e2"), ("a", "a", "e3")])
    return Router(space, edges, normalization="logistic", mode="reinforce")


def test_logistic_baseline_is_the_expected_open_gate_sum_not_the_expected_reward():
    router = logistic_router()
    logits = torch.tensor([[[0.7, -0.4, 1.3]]], dtype=torch.float64, requires_grad=True)
    advantage = torch.tensor([[[0.9, -0.5, 0.3]]], dtype=torch.float64)  # ΔL − τ per edge
    gates = torch.sigmoid(logits)
    valid = torch.ones(1, 1, dtype=torch.bool)
    expected_reward = expected_open_sum = 0.0
    surrogate_mean = torch.zeros((), dtype=torch.float64)
    for config in itertools.product([0.0, 1.0], repeat=3):  # every open/closed gate pattern
        opened = torch.tensor([[config]], dtype=torch.float64)
        log_p = (opened * gates.log() + (1 - opened) * (1 - gates).log()).sum(-1)
        chosen = gate_weights(opened, router.groups)  # open gates into b share its mass
        reward = float((chosen * advantage).sum())
        p = float(log_p.detach().exp())
        expected_reward += p * reward
        expected_open_sum += p * float((opened * advantage).sum())
        surrogate_mean = surrogate_mean + p * reinforce_surrogate(
            log_p, advantage, chosen, torch.zeros(3, dtype=torch.float64), gates, valid)
    baseline = float((gates.detach() * advantage).sum())
    assert abs(baseline - expected_open_sum) < 1e-12
    assert abs(baseline - expected_reward) > 1e-3  # two gates into b: b is not E[r]
    # unbiased all the same: E[∇ surrogate] = −∇ E[r], with E[r] written out by hand
    (grad,) = torch.autograd.grad(surrogate_mean, logits)
    g = torch.sigmoid(logits)
    a1, a2, a3 = advantage[0, 0]
    # destination b: e1, e2 open → mean of their advantages; one open → its own; none → 0
    e_b = g[..., 0] * g[..., 1] * (a1 + a2) / 2 + g[..., 0] * (1 - g[..., 1]) * a1 \
        + (1 - g[..., 0]) * g[..., 1] * a2
    e_r = (e_b + g[..., 2] * a3).sum()
    assert abs(float(e_r.detach()) - expected_reward) < 1e-12
    (want,) = torch.autograd.grad(e_r, logits)
    torch.testing.assert_close(grad, -want)


def test_softmax_baseline_is_the_expected_reward():
    space = GradedStateSpace({"a": 2, "b": 2})
    edges = EdgeSet.explicit(space, [("a", "b", "e1"), ("b", "b", "e2"), ("a", "a", "e3")])
    router = Router(space, edges, normalization="global", mode="reinforce")
    logits = torch.tensor([[[0.2, 1.1, -0.6]]], dtype=torch.float64)
    advantage = torch.tensor([[[0.4, -0.2, 0.8]]], dtype=torch.float64)
    probs = router.probabilities(logits)  # over edges; the stay option has the rest
    # the options: each edge (reward its advantage) or stay (reward 0)
    expected = sum(float(probs[0, 0, e] * advantage[0, 0, e]) for e in range(3))
    valid = torch.ones(1, 1, dtype=torch.bool)
    for e in range(3):  # r − b for a sampled edge e, read back from the surrogate
        chosen = torch.nn.functional.one_hot(torch.tensor([[e]]), 3).double()
        out = reinforce_surrogate(torch.ones(1, 1, dtype=torch.float64), advantage, chosen,
                                  torch.zeros(3, dtype=torch.float64), probs, valid)
        assert abs(-float(out) - (float(advantage[0, 0, e]) - expected)) < 1e-12
