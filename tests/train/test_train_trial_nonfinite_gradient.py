"""A step whose loss is finite but whose gradient is not (sqrt at 0, say) makes the parameters
non-finite: clipping scales every gradient by a non-finite factor and AdamW writes it in. Its
read stops the run naming that step, before its checkpoint is written; it used to be taken,
the checkpoint of the step saved non-finite weights (a resume then failed at once), and the
error named the next step, whose loss was the first non-finite one."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_training import make_trainer

from graded.train.checkpoint import CheckpointManager


def _poisoned_at(trainer, step: int) -> None:
    """The model's training forward of ``step`` (from 1) adds sqrt(0 · Σ w): its value is 0,
    its gradient 0 · ∞ = NaN."""
    model, forward, calls = trainer.model, trainer.model.forward, {"n": 0}

    def poisoned(x):
        out = forward(x)
        if model.training:
            calls["n"] += 1
            if calls["n"] == step:
                out = out + (model.hidden.weight.sum() * 0).sqrt()
        return out

    model.forward = poisoned


def test_the_forward_at_zero_has_a_finite_value_and_no_finite_gradient():
    w = torch.ones(3, requires_grad=True)
    value = (w.sum() * 0).sqrt()
    value.backward()
    assert value.item() == 0.0 and all(math.isnan(g) for g in w.grad.tolist())


@pytest.mark.parametrize("clip_norm", [1.0, None])
def test_a_non_finite_gradient_names_its_step_and_its_checkpoint_is_not_written(tmp_path,
                                                                               clip_norm):
    run = tmp_path / "run"
    trainer = make_trainer(run, steps=12, checkpoint_every=4, eval_every=100, log_every=100,
                           clip_norm=clip_norm)
    _poisoned_at(trainer, 4)
    with pytest.raises(FloatingPointError, match=r"gradient norm became nan at step 4 \(its "
                                                 r"loss [0-9.]+ is finite\)"):
        trainer.fit()
    assert CheckpointManager(run / "checkpoints").steps() == []


def test_the_steps_before_it_keep_their_checkpoints_and_resume(tmp_path):
    run = tmp_path / "run"
    trainer = make_trainer(run, steps=12, checkpoint_every=2, eval_every=100, log_every=100)
    _poisoned_at(trainer, 3)
    with pytest.raises(FloatingPointError, match="at step 3"):
        trainer.fit()
    assert CheckpointManager(run / "checkpoints").steps() == [2]
    full = make_trainer(tmp_path / "full", steps=12, checkpoint_every=2, eval_every=100,
                        log_every=100).fit()
    rest = make_trainer(run, steps=12, checkpoint_every=2, eval_every=100,
                        log_every=100).fit(resume_from=run)
    assert rest.losses == full.losses[2:]
