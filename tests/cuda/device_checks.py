"""Running one module on the CPU and on the accelerator and comparing the two (tests/cuda).

The comparison covers the forward outputs and the backward pass: the gradients, with respect
to every parameter and every floating input, of a fixed random projection Σ w·y of the outputs
(a plain sum would give attention-weight rows a zero gradient). The weights w are drawn on the
CPU, so both runs use the same ones.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

#: CPU against accelerator, per tensor. float64, element by element: the two differ by the order
#: of floating-point sums only (about 1e-15 relative, grown through a few layers).
ELEMENTWISE = {torch.float64: {"rtol": 1e-7, "atol": 1e-9}}
#: float32 (TF32 off, tests/cuda/conftest.py), in norm: ‖got − expected‖ <= r·‖expected‖ + 1e-6.
#: Different kernels (cuBLAS, fused attention, FlexAttention) round differently; measured
#: against float64, the float32 results of these tests are off by up to 1e-5 in norm (graded
#: models, whose scales amplify rounding), and element by element by far more where gradients
#: cancel, so the comparison is in norm, with a margin of 10.
NORMWISE = {torch.float32: 1e-4}


def tensors_in(obj: Any) -> list[Tensor]:
    """The tensors of a (nested) module output, in a fixed order: tuples, lists, dict values,
    dataclass fields."""
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in tensors_in(item)]
    if isinstance(obj, dict):
        return [t for key in obj for t in tensors_in(obj[key])]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensors_in(getattr(obj, f.name))]
    return []


def moved(inputs: Sequence[Any], device: torch.device | str, dtype: torch.dtype | None = None
          ) -> list[Any]:
    """``inputs`` on ``device``; floating tensors also cast to ``dtype``."""
    out = []
    for x in inputs:
        if isinstance(x, Tensor):
            x = x.to(device, dtype) if dtype is not None and x.is_floating_point() else \
                x.to(device)
        out.append(x)
    return out


def forward_backward(module: nn.Module, inputs: Sequence[Any],
                     call: Callable[..., Any], seed: int = 0) -> dict[str, Tensor]:
    """Outputs, and gradients of a random projection of them, all on the CPU, by name."""
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point())
              if isinstance(x, Tensor) else x for x in inputs]
    outputs = tensors_in(call(module, *inputs))
    result = {f"output {i}": y.detach().cpu() for i, y in enumerate(outputs)}
    gen = torch.Generator().manual_seed(seed)
    loss = None
    for y in outputs:
        if y.is_floating_point():  # draw for every floating output, so the draws line up
            w = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.device, y.dtype)
            if y.requires_grad:
                term = (torch.where(y.isfinite(), y, 0) * w).sum()
                loss = term if loss is None else loss + term
    if loss is not None:
        loss.backward()
        for name, p in module.named_parameters():
            if p.grad is not None:
                result[f"grad of {name}"] = p.grad.cpu()
        for i, x in enumerate(inputs):
            if isinstance(x, Tensor) and x.grad is not None:
                result[f"grad of input {i}"] = x.grad.cpu()
    return result


def assert_close_across_devices(got: Tensor, expected: Tensor, dtype: torch.dtype,
                                what: str) -> None:
    """One accelerator tensor equals the CPU's (:data:`ELEMENTWISE`, :data:`NORMWISE`);
    non-finite values must sit in the same places, integer tensors must be equal."""
    got = got.cpu()
    if not expected.is_floating_point():
        assert torch.equal(got, expected), what
        return
    if dtype in ELEMENTWISE:
        torch.testing.assert_close(got, expected, **ELEMENTWISE[dtype], equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")
        return
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    finite = expected.isfinite()
    same_specials = torch.equal(got[~finite].nan_to_num(), expected[~finite].nan_to_num())
    assert torch.equal(got.isfinite(), finite) and same_specials, \
        f"{what}: the non-finite values differ"
    err = (got[finite].double() - expected[finite].double()).norm()
    scale = expected[finite].double().norm()
    assert err <= NORMWISE[dtype] * scale + 1e-6, \
        f"{what}: relative difference {float(err / scale):.3g} in norm > {NORMWISE[dtype]}"


def assert_same(got: dict[str, Tensor], expected: dict[str, Tensor], dtype: torch.dtype) -> None:
    """The accelerator's results equal the CPU's, output by output, gradient by gradient."""
    assert list(got) == list(expected), "the accelerator run has other outputs or gradients"
    for key, want in expected.items():
        assert_close_across_devices(got[key], want, dtype, key)


def compare_on(device: torch.device, module: nn.Module, inputs: Sequence[Any],
               call: Callable[..., Any], dtype: torch.dtype) -> None:
    """Run ``call(module, *inputs)`` forward and backward on the CPU and on ``device``, and
    compare. The accelerator runs twice: on a copy of the module taken before the CPU run (so
    stateful modules start equal), and on the module itself moved to ``device`` after its CPU
    run, so that whatever it cached on the CPU (masks, index tables) must follow it."""
    module = module.to(dtype)
    twin = copy.deepcopy(module).to(device)
    cpu_inputs = moved(inputs, "cpu", dtype)
    expected = forward_backward(module, cpu_inputs, call)
    assert_same(forward_backward(twin, moved(cpu_inputs, device), call), expected, dtype)
    module.zero_grad(set_to_none=True)
    module.to(device)
    assert_same(forward_backward(module, moved(cpu_inputs, device), call), expected, dtype)
