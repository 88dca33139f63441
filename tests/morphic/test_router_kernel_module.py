"""The router's kernel (:mod:`graded.morphic.kernel`) is a mixin of
:class:`graded.morphic.router.Router`: the router keeps its import path (a pickled router names
it), its parameter and buffer names (a checkpoint's state dict) and the names it exported."""

import pickle

import torch

import graded.morphic.kernel as kernel
import graded.morphic.router as router
from graded.morphic import EdgeSet, GradedStateSpace, Router


def make(**kw):
    sp = GradedStateSpace({"a": 3, "b": 4})
    es = EdgeSet.explicit(sp, [("a", "b", "e1"), ("b", "b", "e2"), ("a", "a", "e3")])
    torch.manual_seed(0)
    return Router(sp, es, rank=4, **kw)


def test_router_reexports_the_kernel_names_it_exported_before():
    for name in ("NORMALIZATIONS", "MODES", "Route", "gate_weights"):
        assert getattr(router, name) is getattr(kernel, name)
    assert router.POOLINGS == ("mean", "last", "attention")
    assert router.INPUT_TYPES == ("context", "operator", "operator_state")


def test_a_pickled_router_names_only_the_router_module_and_loads_equal():
    r = make(normalization="global", mode="hard")
    data = pickle.dumps(r)
    assert b"graded.morphic.router" in data and b"graded.morphic.kernel" not in data
    back = pickle.loads(data)
    assert type(back) is Router and isinstance(back, kernel.RoutingKernel)
    logits = torch.randn(2, 5, 3)
    torch.testing.assert_close(back.route(logits).weights, r.route(logits).weights,
                               rtol=0, atol=0)


def test_state_dict_and_buffer_names_are_those_a_saved_checkpoint_holds():
    assert list(make(pooling="attention").state_dict()) == [
        "bilinear", "pool_query", "proj_u.weight", "proj_u.bias", "proj_v.a.weight",
        "proj_v.a.bias", "proj_v.b.weight", "proj_v.b.bias", "pool_key.weight"]
    assert list(make(input_type="operator", operator_tokens=[1]).state_dict()) == [
        "operator_head.weight", "operator_head.bias", "operator_embedding.weight"]
    # the kernel's groups are a non-persistent buffer: not in the state dict
    assert [n for n, _ in make().named_buffers()] == [
        "operator_tokens", "edge_position", "group_of_column"]
