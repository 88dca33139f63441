"""No host–device synchronisation in a training step whose inputs were checked: with
``torch.cuda.set_sync_debug_mode("error")`` any operation that waits for the GPU raises, so
a bf16 LM step (forward, loss, backward, AdamW) of every grading under
``graded.checks.checked_inputs`` must complete without one, and outside the block the model
synchronises only to read its token ids."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from graded import TransformerConfig, TransformerLM
from graded.checks import checked_inputs

GRADINGS = {"ungraded": {}, "LGT": dict(grading="linear", learnable_grades=True),
            "EGT": dict(grading="exponential", learnable_grades=True),
            "LGT fixed": dict(grading="linear", learnable_grades=False)}


@contextlib.contextmanager
def sync_mode(device: torch.device, mode: str):
    if device.type != "cuda":  # GRADED_TEST_DEVICE=cpu: nothing to detect
        yield
        return
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("positional", ["learned", "rope"])
@pytest.mark.parametrize("grading", list(GRADINGS))
def test_a_checked_training_step_never_waits_for_the_gpu(device, grading, positional):
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(
        vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_len=16, positional=positional,
        **GRADINGS[grading])).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (2, 17), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                 x[:, 1:].flatten())
        loss.backward()
        opt.step()

    step()  # the optimizer's state is created on the first step
    with sync_mode(device, "error"), checked_inputs():
        step()
        step()
    with sync_mode(device, "warn"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(x[:, :-1])
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == (1 if device.type == "cuda" else 0), [str(w.message) for w in syncs]
