"""An fp16 run whose gradients are never finite (a NaN gradient of the model itself, which no
scale cures) stops with a FloatingPointError once the gradient scaler's scale has fallen to 0:
halved at each skipped step from 2^16, it reaches 0 at the 166th skip in a row (2^-149, the
smallest float32, halved, rounds to 0), and from then on every step would be skipped. Such a
run used to end "finished" after all its steps with the weights it started from, its
checkpoint holding a scale of 0."""

from __future__ import annotations

import pytest
import torch
from tiny_training import make_trainer

from graded.train.checkpoint import CheckpointManager


def test_an_fp16_run_whose_scale_falls_to_zero_stops_naming_the_step(tmp_path):
    """The scaler starts at 2^-145 instead of 2^16 (the 161 skips before it are the same
    halvings): the 5th skipped step sets the scale to 0, and its read raises, before the
    checkpoint of step 6 (every 3 steps) is written."""
    assert 2.0**16 * 0.5**165 == 2.0**-149 and float(torch.tensor(2.0**-149) / 2) == 0.0
    run = tmp_path / "run"
    trainer = make_trainer(run, steps=12, warmup_steps=0, precision="fp16", log_every=1,
                           eval_every=100, checkpoint_every=3)
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**-145)
    before = trainer.model.out.weight.detach().clone()
    trainer.model.out.weight.register_hook(lambda grad: torch.full_like(grad, float("nan")))
    with pytest.raises(FloatingPointError, match=r"fp16 gradient scaler's scale fell to 0 by "
                                                 r"step 5: .*lower lr \(now 0\.003\)"):
        trainer.fit()
    assert torch.equal(trainer.model.out.weight, before)  # every step was skipped
    assert CheckpointManager(run / "checkpoints").steps() == [3]
