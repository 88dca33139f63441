"""Graded layers and activations built inside ``with torch.device("meta")`` (the usual start of
loading a large model) and materialised with ``to_empty`` and ``load_state_dict`` compute what
the module they were loaded from computes; their grades are still checked at construction."""

import pytest
import torch

from graded.nn import (
    GradedExp,
    GradedLinear,
    GradedMLP,
    GradedReLU,
    MultiplicativeGradedLinear,
)

BUILDERS = {
    "GradedReLU": lambda: GradedReLU([0.5, 2.0], mode="threshold"),
    "GradedExp": lambda: GradedExp([1.0, 3.0], learnable=True),
    "GradedLinear": lambda: GradedLinear(2, 3, [0.5, 2.0], learnable_grades=True),
    "MultiplicativeGradedLinear": lambda: MultiplicativeGradedLinear(2, 3, [1.0, 2.0],
                                                                     sign_mode="power"),
    "GradedMLP": lambda: GradedMLP(2, [3], 1, [1.0, 2.0], learnable_grades=True),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_module_built_on_meta_loads_and_equals_its_source(name):
    # validating the grades read their values: "Tensor.item() cannot be called on meta tensors"
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = BUILDERS[name]()
    assert {t.device.type for t in [*meta.parameters(), *meta.buffers()]} == {"meta"}
    source = BUILDERS[name]()
    loaded = meta.to_empty(device="cpu")
    loaded.load_state_dict(source.state_dict())
    x = torch.randn(4, 2)
    assert torch.equal(loaded(x), source(x))


def test_grades_are_still_checked_when_built_on_meta():
    with torch.device("meta"), pytest.raises(ValueError, match=r"GradedLinear needs grades "
                                                               r"q > 0, got -2.0 at index 1"):
        GradedLinear(2, 3, [1.0, -2.0])
    with torch.device("meta"), pytest.raises(ValueError, match=r"sign_mode='power' needs "
                                                               r"integer grades, got 2.5"):
        MultiplicativeGradedLinear(2, 3, [1.0, 2.5], sign_mode="power")
