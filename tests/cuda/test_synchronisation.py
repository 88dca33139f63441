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


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("grading", ["ungraded", "LGT", "EGT"])
def test_a_trainer_step_never_waits_for_the_gpu(tmp_path, device, precision, grading):
    """The trainer's steps (plain AdamW: a graded recipe reads the grades every step to bound
    their learning rate) read nothing from the device; the values are read at log steps."""
    from lm_trainers import GRADINGS as TRAINER_GRADINGS
    from lm_trainers import lm_trainer

    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    trainer = lm_trainer(tmp_path, device, TRAINER_GRADINGS[grading], precision=precision,
                         steps=5, log_every=5, eval_every=5)
    assert trainer.inputs_checked
    step = trainer._train_step
    calls = []

    def strict(i: int):
        calls.append(i)
        if i == 0:  # the first step creates the optimizer's state
            return step(i)
        with sync_mode(device, "error"):
            return step(i)

    trainer._train_step = strict
    result = trainer.fit()
    assert calls == [0, 1, 2, 3, 4] and len(result.losses) == 5


@pytest.mark.parametrize("grading, recipe", [("LGT", "lgt-alg5.1"), ("EGT", "egt-alg7.1")])
def test_a_graded_recipe_step_reads_its_bound_without_draining_the_gpu(tmp_path, device,
                                                                        grading, recipe):
    """A graded recipe bounds the grades' learning rate by q_max after every step: the value
    is copied to the host without waiting and read before the next optimizer step (an event
    wait, for work the device has long finished): at most one wait per step, and no copy that
    synchronises."""
    from lm_trainers import GRADINGS as TRAINER_GRADINGS
    from lm_trainers import lm_trainer

    trainer = lm_trainer(tmp_path, device, TRAINER_GRADINGS[grading], recipe=recipe, steps=5,
                         log_every=5, eval_every=5)
    assert any(g.get("name") == "grades" for g in trainer.optimizer.param_groups)
    step = trainer._train_step
    waits = []

    def counted(i: int):
        if i == 0:
            return step(i)
        with sync_mode(device, "warn"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = step(i)
        waits.append(sum("synchroniz" in str(w.message) for w in caught))
        return out

    trainer._train_step = counted
    result = trainer.fit()
    assert len(result.losses) == 5 and all(n <= 1 for n in waits), waits
