"""The thresholds τ of utility routing (004 §4.2.3) keep their float64 values through casts of the
model and through state dicts saved from a narrower model, while every use of τ computes in the
dtype of the logits."""

import pytest
import torch

from graded.morphic import EdgeSet, GradedStateSpace, LinearBlock, MorphicLayer
from graded.morphic.model import MorphicObjective, MorphicTransformer

TAU = [0.1, 0.3, 0.7]  # none of them exact in bfloat16 or float16


def tiny_model() -> MorphicTransformer:
    torch.manual_seed(0)
    space = GradedStateSpace({"a": 4, "b": 4})
    edges = EdgeSet.explicit(space, [("a", "a", "aa"), ("a", "b", "ab"), ("b", "b", "bb")])
    layer = MorphicLayer(space, edges, [LinearBlock(4, 4) for _ in edges],
                         router={"rank": 4}, thresholds=TAU, train_routing="utility")
    return MorphicTransformer(space, [layer], 7, max_len=8,
                              objective=MorphicObjective(utility_weight=1.0))


def float64_tau() -> torch.Tensor:
    return torch.tensor(TAU, dtype=torch.float64)


CASTS = {
    "to(bfloat16)": lambda m: m.to(torch.bfloat16),
    "half()": lambda m: m.half(),
    "bfloat16().float()": lambda m: m.bfloat16().float(),
    "half().double()": lambda m: m.half().double(),
    "to(dtype=float16, device=cpu)": lambda m: m.to(device="cpu", dtype=torch.float16),
    "float()": lambda m: m.float(),
}


@pytest.mark.parametrize("cast", list(CASTS))
def test_a_cast_model_keeps_its_thresholds_at_their_float64_values(cast):
    """Before, ``.to(torch.bfloat16)`` rounded τ = 0.1 to 0.10009765625 and a cast back to
    float32 kept the rounded value."""
    model = CASTS[cast](tiny_model())
    tau = model.layers[0].thresholds
    assert tau.dtype == torch.float64
    torch.testing.assert_close(tau, float64_tau(), rtol=0, atol=0)
    # the parameters and the other buffers follow the cast
    dtype = model.readout.weight.dtype
    assert {b.dtype for n, b in model.named_buffers()
            if b.is_floating_point() and not n.endswith("thresholds")} == {dtype}


def test_a_bfloat16_model_routes_by_utility_in_bfloat16_with_its_thresholds_cast_at_use():
    """ℓ̃ = ℓ + β(ΔL − τ) is in the logits' dtype, with τ the float64 buffer cast to it at its
    use (ΔL comes in float32: ℓ̃ is rounded once). Before, the float32 ℓ̃ of a bfloat16 model
    made the routing weights and the state float32, and the bfloat16 readout refused it
    ("mat1 and mat2 must have the same dtype")."""
    model = tiny_model().to(torch.bfloat16)
    layer = model.layers[0]
    ids = torch.randint(0, 7, (2, 6), generator=torch.Generator().manual_seed(2))
    targets = ids.roll(-1, 1)
    logits, traces = model.utility_routing(ids, targets)
    tr = traces[0]
    tau = float64_tau().to(torch.bfloat16)
    assert logits.dtype == tr.alpha.dtype == tr.utility_logits.dtype == torch.bfloat16
    assert tr.utilities.dtype == torch.float32
    want = (tr.context_logits.float() + layer.beta * (tr.utilities - tau.float())).bfloat16()
    torch.testing.assert_close(tr.utility_logits, want, rtol=0, atol=0)
    loss, metrics = model.training_loss(ids, targets)
    per_token = torch.nn.functional.softplus(layer.beta * (tau.float() - tr.utilities)).sum(-1)
    assert metrics["utility_penalty"] == pytest.approx(float(per_token.detach().mean()),
                                                     rel=1e-5)
    loss.backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()
               if p.grad is not None)


def old_bfloat16_state_dict(model: MorphicTransformer) -> dict[str, torch.Tensor]:
    """What ``model.to(torch.bfloat16).state_dict()`` held before τ kept its precision: every
    floating tensor, the thresholds included, in bfloat16."""
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v
            for k, v in model.state_dict().items()}


@pytest.mark.parametrize("assign", [False, True])
@pytest.mark.parametrize("into", ["float32", "bfloat16"])
def test_a_bfloat16_state_dict_of_the_old_form_loads_with_float64_thresholds(assign, into):
    """The bfloat16 τ of an old state dict loads as saved (its lost digits cannot come back),
    into a float64 buffer: before, ``load_state_dict(..., assign=True)`` made the buffer
    bfloat16 again."""
    saved = old_bfloat16_state_dict(tiny_model())
    torch.manual_seed(1)
    fresh = tiny_model() if into == "float32" else tiny_model().to(torch.bfloat16)
    fresh.load_state_dict(saved, assign=assign)
    tau = fresh.layers[0].thresholds
    assert tau.dtype == torch.float64
    want = float64_tau().to(torch.bfloat16).double()  # 0.10009765625, ...
    torch.testing.assert_close(tau, want, rtol=0, atol=0)
    ids = torch.randint(0, 7, (2, 6), generator=torch.Generator().manual_seed(3))
    loss, _ = fresh.training_loss(ids, ids.roll(-1, 1))
    assert bool(torch.isfinite(loss))


def test_a_state_dict_saved_from_a_bfloat16_model_restores_the_exact_thresholds():
    saved = tiny_model().to(torch.bfloat16).state_dict()
    assert saved["layers.0.thresholds"].dtype == torch.float64
    fresh = tiny_model()
    fresh.layers[0].thresholds.zero_()
    fresh.load_state_dict(saved)
    torch.testing.assert_close(fresh.layers[0].thresholds, float64_tau(), rtol=0, atol=0)
