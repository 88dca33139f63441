"""``train.precision`` bf16 and fp16 keep float32 master weights: autocast computes in the low
dtype from float32 parameters, which AdamW updates. A model given in another floating dtype is
refused when the trainer is built, naming the parameter and its dtype, before anything is
written. It used to fail only at the first fp16 step, after the run folder was written, with
torch's "Attempting to unscale FP16 gradients"; a bfloat16 model trained with no master
weights; a float64 model under bf16 trained in float64 (autocast leaves float64 operations as
they are: its losses equal those of precision fp32 exactly)."""

from __future__ import annotations

import pytest
import torch
from tiny_training import OPTIONS, TinyClassifier, make_data

from graded.train.options import TrainOptions
from graded.train.trainer import Trainer


def _trainer(run_dir, model, precision):
    return Trainer(model, make_data(96, 1), make_data(48, 2), kind="classification",
                   options=TrainOptions(**{**OPTIONS, "steps": 2, "warmup_steps": 0,
                                            "precision": precision}),
                   run_dir=run_dir)


@pytest.mark.parametrize(("dtype", "precision", "shown"), [
    (torch.float16, "fp16", "float16"), (torch.bfloat16, "bf16", "bfloat16"),
    (torch.float64, "bf16", "float64"), (torch.bfloat16, "fp16", "bfloat16")])
def test_a_model_not_in_float32_is_refused_under_autocast_before_anything_is_written(
        tmp_path, dtype, precision, shown):
    torch.manual_seed(0)
    model = TinyClassifier().to(dtype)
    with pytest.raises(ValueError, match=rf"train\.precision='{precision}' runs autocast over "
                       rf"float32 parameters .* parameter 'embed\.weight' of the model is "
                       rf"{shown}; expected a float32 model"):
        _trainer(tmp_path / "run", model, precision)
    assert not (tmp_path / "run").exists()


def test_a_float32_model_under_fp16_keeps_float32_weights_and_optimizer_state(tmp_path):
    """The refusal leaves float32 models alone: after two fp16 steps every parameter, gradient
    and AdamW moment is float32, and the parameters moved."""
    torch.manual_seed(0)
    model = TinyClassifier()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _trainer(tmp_path / "run", model, "fp16")
    trainer.fit()
    for p, p0 in zip(model.parameters(), before, strict=True):
        state = trainer.optimizer.state[p]
        assert p.dtype == p.grad.dtype == torch.float32
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
        assert not torch.equal(p.detach(), p0)


def test_precision_fp32_trains_a_float64_model_as_given(tmp_path):
    """fp32 runs no autocast, so a model of another dtype trains in it: not refused."""
    torch.manual_seed(0)
    model = TinyClassifier().double()
    result = _trainer(tmp_path / "run", model, "fp32").fit()
    assert result.step == 2 and all(p.dtype == torch.float64 for p in model.parameters())
