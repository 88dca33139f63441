"""Mixed precision and compilation in the trainer: bf16 and fp16 autocast (fp16 with a gradient
scaler whose state is checkpointed), grading scales that keep a low-precision forward pass
finite, and ``compile`` (slow: it runs the inductor compiler)."""

import json
import math
import warnings

import pytest
import torch
from tiny_training import make_lm_trainer, make_trainer

from graded import TransformerConfig, TransformerLM
from graded.train.logging import read_metrics
from graded.train.options import TrainOptions


def test_precision_choices_are_checked():
    assert TrainOptions(precision="bf16").precision == "bf16"
    with pytest.raises(ValueError, match="precision"):
        TrainOptions(precision="fp8")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_training_stays_finite_and_close_to_fp32(tmp_path, precision):
    full = make_lm_trainer(tmp_path / "fp32", "dyck", steps=4).fit()
    low = make_lm_trainer(tmp_path / precision, "dyck", steps=4, precision=precision).fit()
    assert all(torch.isfinite(torch.tensor(low.losses)))
    assert low.losses[0] == pytest.approx(full.losses[0], rel=2e-2)  # same model, same batch
    assert low.losses[-1] < low.losses[0] + 0.05


def test_fp16_gradient_scaler_state_is_checkpointed_and_resumed(tmp_path):
    run = tmp_path / "run"
    trainer = make_lm_trainer(run, "dyck", steps=4, eval_every=2, precision="fp16")
    first = trainer.fit(pause_after=2)
    state = json.loads(next(run.glob("checkpoints/*/state.json")).read_text())
    assert state["grad_scaler"]["scale"] > 0
    resumed = make_lm_trainer(run, "dyck", steps=4, eval_every=2, precision="fp16")
    rest = resumed.fit(resume_from=run)
    whole = make_lm_trainer(tmp_path / "whole", "dyck", steps=4, eval_every=2,
                            precision="fp16").fit()
    assert first.losses + rest.losses == pytest.approx(whole.losses, rel=1e-6)


def test_fp16_steps_the_scaler_skips_count_in_the_schedule_without_torchs_order_warning(
        tmp_path):
    """Non-finite gradients in the first two steps: the scaler skips their optimizer steps,
    the schedule still advances by the trainer's steps (steps 3 to 6 run at the cosine's rates
    for 3 to 6, worked by hand), and torch's "lr_scheduler.step() before optimizer.step()"
    warning, which the skipped first step used to set off, is not shown."""
    trainer = make_trainer(tmp_path / "run", steps=6, lr=0.01, schedule="cosine",
                           warmup_steps=2, log_every=1, precision="fp16")
    backward = []  # one backward pass per step (no accumulation)

    def poison_first_two(grad):
        backward.append(None)
        return torch.full_like(grad, math.inf) if len(backward) <= 2 else grad

    trainer.model.out.weight.register_hook(poison_first_two)
    used = []  # the rate of each optimizer step the scaler let through
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = trainer.fit()
    assert [str(w.message) for w in caught if "lr_scheduler.step()" in str(w.message)] == []
    # warmup 0.005, 0.01; then 0.01 · (1 + cos(π k / 4)) / 2 for k = 0..3
    by_hand = [0.005, 0.01, 0.01, 0.005 * (1 + math.sqrt(0.5)), 0.005,
               0.005 * (1 - math.sqrt(0.5))]
    assert len(backward) == 6 and result.step == 6
    assert used == pytest.approx(by_hand[2:], rel=1e-12)  # steps 1 and 2 skipped
    logged = read_metrics(tmp_path / "run")["train"]["lr"]
    assert logged == [(s, pytest.approx(v, rel=1e-12)) for s, v in enumerate(by_hand, 1)]
    assert trainer.scheduler.last_epoch == 6
    assert trainer.scaler.get_scale() == 2.0**16 / 4  # halved by each skipped step


def test_large_exponential_grades_keep_an_fp16_forward_finite():
    """exp(q·ln λ) is clamped to the autocast dtype's range: λ = 4, grades up to 30 would give
    scales of 4^30 ≈ 1e18, far past fp16's 65504."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=16, d_model=16, n_heads=2, n_layers=1, max_len=8,
                            grading="exponential", grading_base=4.0, grade_init="warm_start",
                            grade_init_value=2.0)
    model = TransformerLM(cfg)
    ids = torch.randint(0, 16, (2, 8))
    with pytest.warns(RuntimeWarning, match="clamped"), \
            torch.autocast("cpu", dtype=torch.float16):
        out = model(ids)
    assert out.dtype == torch.float16 and bool(torch.isfinite(out).all())
    grading = model.feature_grading
    with warnings.catch_warnings():  # fixed grades: the scales the forward pass computed
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.float16):
            assert float(grading.scales().max()) <= torch.finfo(torch.float16).max ** 0.5
    assert float(grading.scales().max()) > 1e10  # outside autocast: the fp32 range


@pytest.mark.slow
def test_compiled_training_equals_eager(tmp_path):
    eager = make_lm_trainer(tmp_path / "eager", "dyck", steps=3).fit()
    compiled = make_lm_trainer(tmp_path / "compiled", "dyck", steps=3, compile=True).fit()
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-4)
