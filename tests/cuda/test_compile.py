"""``torch.compile`` on the accelerator computes what eager execution computes: the Trainer with
``compile=True`` gives the eager losses step by step, and a compiled model's logits and gradients
equal the eager model's (float32, TF32 off; in norm within device_checks' float32 tolerance:
the compiler fuses and reorders floating-point operations)."""

from __future__ import annotations

import copy

import pytest
import torch
from device_checks import assert_same, forward_backward
from lm_trainers import GRADINGS, lm_trainer

from graded import TransformerConfig, TransformerLM
from graded.morphic import build_morphic_model

V, T = 13, 12
MODELS = {
    "ungraded": lambda: TransformerLM(config()),
    "LGT, learnable per head": lambda: TransformerLM(config(
        grading="linear", learnable_grades=True, grades_per_head=True, grade_init="warm_start",
        grade_init_value=0.3)),
    "EGT, RoPE, SwiGLU": lambda: TransformerLM(config(
        grading="exponential", learnable_grades=True, grade_init="warm_start",
        grade_init_value=0.3, positional="rope", activation="swiglu")),
    "sliding_window backend": lambda: TransformerLM(config(  # FlexAttention on CUDA
        d_model=32, n_heads=2, attn_backend="sliding_window", attn_backend_options={"window": 4})),
    "morphic": lambda: build_morphic_model({
        "vocab_size": V, "max_len": 16,
        "grades": [{"label": "g0", "dim": 8, "index": 0}, {"label": "g1", "dim": 8, "index": 1}],
        "layers": [{"banded": [0, 1], "block": "ffn", "block_options": {"hidden": 16},
                    "router": {"rank": 4}}]}),
}


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Each test compiles from scratch: earlier graphs (other tests' models) neither count
    against the recompilation limit, past which the compiler would fall back to eager, nor get
    reused."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def config(**overrides) -> TransformerConfig:
    base = dict(vocab_size=V, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_len=16)
    return TransformerConfig(**{**base, **overrides})


@pytest.mark.parametrize("grading", list(GRADINGS))
def test_compiled_training_on_the_accelerator_equals_eager(tmp_path, device, grading):
    eager = lm_trainer(tmp_path / "eager", device, GRADINGS[grading], steps=3).fit()
    compiled = lm_trainer(tmp_path / "compiled", device, GRADINGS[grading], steps=3,
                          compile=True).fit()
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_model_on_the_accelerator_equals_eager(name, device):
    torch.manual_seed(0)
    model = MODELS[name]().to(device)
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin)  # shares twin's parameters: its gradients land there
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1)).to(device)
    expected = forward_backward(model, [ids], lambda m, x: m(x))
    got = forward_backward(twin, [ids], lambda m, x: compiled(x))
    assert_same(got, expected, torch.float32)
