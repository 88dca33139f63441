"""Typed router input: routing from the operator token (its type or its state), not the operand."""

import pytest
import torch

from graded.morphic import EdgeSet, GradedStateSpace, MorphicConfig, Router
from graded.morphic.tasks import VariableAdditionTask, build_adder_model, evaluate_adder
from graded.morphic.training import train_morphic

OPS = [7, 9]  # the operator token ids of the tests below


def make_router(input_type: str, **kw) -> tuple[GradedStateSpace, EdgeSet, Router]:
    space = GradedStateSpace({"a": 3, "b": 4})
    edges = EdgeSet.explicit(space, [("a", "b", "e1"), ("b", "b", "e2"), ("a", "a", "e3")])
    torch.manual_seed(0)
    router = Router(space, edges, rank=5, init_std=0.5, input_type=input_type,
                    operator_tokens=OPS, **kw)
    return space, edges, router


def naive_operator(ids: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
    """Position and type (index in OPS + 1) of the latest operator at or before each t."""
    positions, kinds = [], []
    for row in ids.tolist():
        pos, kind, last_pos, last_kind = [], [], -1, 0
        for t, token in enumerate(row):
            if token in OPS:
                last_pos, last_kind = t, OPS.index(token) + 1
            pos.append(last_pos)
            kind.append(last_kind)
        positions.append(pos)
        kinds.append(kind)
    return positions, kinds


def test_operator_index_is_the_latest_operator_at_or_before_each_position():
    _, _, router = make_router("operator")
    ids = torch.tensor([[1, 7, 2, 9, 3, 3], [9, 1, 1, 7, 7, 2], [1, 2, 3, 4, 5, 6]])
    pos, op = router.operator_index(ids)
    want_pos, want_op = naive_operator(ids)
    assert pos.tolist() == want_pos and op.tolist() == want_op


def test_operator_input_logits_are_a_lookup_of_the_operator_type_alone():
    space, _edges, router = make_router("operator")
    ids = torch.tensor([[1, 7, 2, 3], [4, 9, 2, 9]])
    z = torch.randn(2, 4, space.total_dim)
    got = router.context_logits(z, input_ids=ids)
    _, kinds = naive_operator(ids)
    for b in range(2):
        for t in range(4):
            u = router.operator_embedding.weight[kinds[b][t]]
            want = router.operator_head.weight @ u + router.operator_head.bias
            torch.testing.assert_close(got[b, t], want)
    # neither the state nor the non-operator tokens change the logits
    other = torch.tensor([[5, 7, 6, 0], [3, 9, 1, 9]])
    torch.testing.assert_close(router.context_logits(torch.randn_like(z), input_ids=other), got)


def test_operator_state_input_reads_the_state_at_the_operator_position():
    space, _edges, router = make_router("operator_state")
    ids = torch.tensor([[1, 7, 2, 3, 9], [4, 2, 2, 9, 1]])
    z = torch.randn(2, 5, space.total_dim)
    got = router.context_logits(z, input_ids=ids)
    positions, _ = naive_operator(ids)
    for b in range(2):
        for t in range(5):
            s = positions[b][t]
            state = z[b, s] if s >= 0 else torch.zeros(space.total_dim)
            u = router.proj_u(state)
            want = router.operator_head.weight @ u + router.operator_head.bias
            torch.testing.assert_close(got[b, t], want)
    # the state elsewhere (here: everything but the operator positions) is not read
    z2 = z.clone()
    keep = torch.zeros(2, 5, dtype=torch.bool)
    keep[0, 1] = keep[0, 4] = keep[1, 3] = True
    z2[~keep] += 5.0
    torch.testing.assert_close(router.context_logits(z2, input_ids=ids), got)


def test_operator_inputs_need_token_ids_and_valid_operator_tokens():
    space, edges, router = make_router("operator")
    z = torch.randn(1, 3, space.total_dim)
    with pytest.raises(ValueError, match="reads the token ids: pass input_ids"):
        router.context_logits(z)
    with pytest.raises(ValueError, match=r"input_ids has shape \(1, 4\)"):
        router.context_logits(z, input_ids=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"needs operator_tokens.*got \[\]"):
        Router(space, edges, input_type="operator")
    with pytest.raises(ValueError, match=r"distinct token ids >= 0, got \[3, 3\]"):
        Router(space, edges, input_type="operator_state", operator_tokens=[3, 3])
    with pytest.raises(ValueError, match=r"operator_tokens are read only by"):
        Router(space, edges, operator_tokens=[3])
    with pytest.raises(ValueError, match=r"input_type must be one of .*'operand'"):
        Router(space, edges, input_type="operand")


def test_config_refuses_inconsistent_router_inputs_before_building():
    base = {"vocab_size": 6, "grades": [{"label": "g0", "dim": 4}]}
    ok = {**base, "layers": [{"edges": [["g0", "g0", "a"], ["g0", "g0", "b"]],
                              "router": {"input_type": "operator", "operator_tokens": [4, 5]}}]}
    assert MorphicConfig.from_dict(ok).layers[0].router.operator_tokens == (4, 5)
    too_big = {**base, "layers": [{**ok["layers"][0], "router": {
        "input_type": "operator", "operator_tokens": [4, 6]}}]}
    with pytest.raises(ValueError, match=r"layers\.0\.router\.operator_tokens=\(4, 6\) is invalid"
                                         r": expected token ids below vocab_size = 6"):
        MorphicConfig.from_dict(too_big)
    missing = {**base, "layers": [{**ok["layers"][0], "router": {"input_type": "operator"}}]}
    with pytest.raises(ValueError, match=r"operator_tokens.*non-empty list of distinct"):
        MorphicConfig.from_dict(missing)
    with pytest.raises(ValueError, match=r"router: unknown key 'input'.*did you mean"):
        MorphicConfig.from_dict({**base, "layers": [{**ok["layers"][0],
                                                     "router": {"input": "operator"}}]})


def test_the_model_passes_token_ids_so_operator_routing_ignores_the_operand():
    task = VariableAdditionTask(5, (1, 2))
    torch.manual_seed(0)
    model = build_adder_model(task, router_input="operator").eval()
    ids, _, adder = task.all_examples()
    alpha = model.routing(ids)[-1].alpha[:, 2]  # (10, |E|) at "="
    for k in range(2):  # every digit x with the same ADD_k routes identically
        rows = alpha[adder == k]
        torch.testing.assert_close(rows, rows[:1].expand_as(rows))


@pytest.mark.parametrize("router_input", ["operator", "operator_state"])
def test_operator_routing_routes_every_held_out_pair_after_short_training(router_input):
    task = VariableAdditionTask(7, (1, 2, 3))
    train_pairs, held_pairs = task.split(5, seed=0)
    torch.manual_seed(0)
    model = build_adder_model(task, router_input=router_input)

    def batches(g: torch.Generator):
        ids, targets, _ = task.sample(64, g, pairs=train_pairs)
        return ids, targets

    train_morphic(model, batches, steps=150, lr=0.01, seed=0, log_every=150)
    held = evaluate_adder(model, task, task.examples(held_pairs))
    assert held["routing_accuracy"] == 1.0 and held["answer_accuracy"] == 1.0
