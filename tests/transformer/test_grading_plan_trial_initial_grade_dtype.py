"""A model's initial grades are the config's values rounded once to the dtype the model is
built in (torch's default dtype, in which ``torch.nn`` layers draw their weights too): exact in
a float64 model, the nearest float32 in a float32 one. ``.double()`` of a float32 model casts
what it holds, as it casts an ``nn.Linear``'s float32 weights: the float32 values, widened."""

from __future__ import annotations

import pytest
import torch

from graded import TransformerConfig, TransformerLM
from graded.interop.grafting import _default_dtype as default_dtype
from graded.transformer.graded import gradings

D = 64
C = 0.1


def config(init: str) -> TransformerConfig:
    return TransformerConfig(vocab_size=11, d_model=D, n_heads=2, n_layers=1, max_len=8,
                             grading="exponential", grade_init=init, grade_init_value=C,
                             grades_per_head=True)


def expected(init: str) -> torch.Tensor:
    """The config's grades in float64 (q_k = c·k along each grading's dimension for the warm
    start, c everywhere for the constant), one tuple over d_model."""
    if init == "warm_start":
        return C * torch.arange(D, dtype=torch.float64)
    return torch.full((D,), C, dtype=torch.float64)


def feature_and_head_grades(model: torch.nn.Module) -> list[torch.Tensor]:
    return [g.grades.detach() for g in gradings(model).values()]


@pytest.mark.parametrize("init", ["warm_start", "constant"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_model_built_in_a_dtype_holds_the_configs_grades_rounded_once_to_it(init, dtype):
    with default_dtype(dtype):
        model = TransformerLM(config(init))
    grades = feature_and_head_grades(model)
    assert len(grades) == 2  # the feature grading over d_model, one head grading per head
    for g in grades:
        assert g.dtype == dtype
        want = expected(init)[: g.shape[-1]].to(dtype)  # c·k in float64, rounded once
        assert torch.equal(g, want.expand_as(g)), (g - want).abs().max()


def test_double_of_a_float32_model_widens_its_float32_grades_as_torch_nn_widens_weights():
    torch.manual_seed(0)
    model = TransformerLM(config("warm_start"))
    held = feature_and_head_grades(model)
    model.double()
    for before, after in zip(held, feature_and_head_grades(model), strict=True):
        assert after.dtype == torch.float64 and torch.equal(after, before.double())
    linear = torch.nn.Linear(2, 2)  # the reference: a cast keeps the float32 values
    weight = linear.weight.detach().clone()
    assert torch.equal(linear.double().weight.detach(), weight.double())
