"""Mixed precision on the accelerator: bf16 and fp16 training steps of ungraded, LGT and EGT
language models through the Trainer (``precision``) stay finite and start from the float32 loss;
an EGT whose grades give scales far past float16's range trains with finite losses and keeps
finite logits and gradients under autocast (its scales are clamped to the autocast dtype's
range)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from lm_trainers import GRADINGS, lm_trainer

from graded import TransformerConfig, TransformerLM
from graded.grading import ExponentialGrading

#: λ = 4 and grades up to 30: scales up to 4^30 ≈ 1e18, far past float16's 65504.
LARGE_GRADES = dict(grading="exponential", grading_base=4.0, learnable_grades=True,
                    grade_init="warm_start", grade_init_value=2.0)
LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def skip_without_bf16(device: torch.device, dtype: torch.dtype) -> None:
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip(f"{torch.cuda.get_device_name(device)} has no bf16")


@pytest.mark.parametrize("grading", list(GRADINGS))
@pytest.mark.parametrize("precision", list(LOW))
def test_low_precision_training_steps_stay_finite_on_the_accelerator(
        tmp_path, device, precision, grading):
    skip_without_bf16(device, LOW[precision])
    full = lm_trainer(tmp_path / "fp32", device, GRADINGS[grading]).fit()
    trainer = lm_trainer(tmp_path / precision, device, GRADINGS[grading], precision=precision)
    low = trainer.fit()
    assert all(math.isfinite(x) for x in low.losses), low.losses
    assert low.losses[0] == pytest.approx(full.losses[0], rel=2e-2)  # same model, same batch
    assert low.losses[-1] < low.losses[0] + 0.05
    for name, p in trainer.model.named_parameters():
        assert p.device.type == device.type and bool(p.isfinite().all()), name
    if precision == "fp16":  # the gradient scaler ran on this device and kept a usable scale
        assert trainer.scaler is not None and 0 < trainer.scaler.get_scale() < math.inf


@pytest.mark.filterwarnings("ignore:exponential grading:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`:UserWarning")
def test_an_egt_with_large_grades_trains_in_fp16_with_finite_losses(tmp_path, device):
    """The clamped scales keep the fp16 forward finite; the gradient scaler skips the steps
    whose scaled gradients overflow and lowers its scale."""
    trainer = lm_trainer(tmp_path / "fp16", device, LARGE_GRADES, precision="fp16")
    result = trainer.fit()
    assert all(math.isfinite(x) for x in result.losses), result.losses
    assert all(bool(p.isfinite().all()) for p in trainer.model.parameters())


@pytest.mark.parametrize("precision", list(LOW))
def test_large_exponential_grades_keep_logits_and_gradients_finite_under_autocast(
        device, precision):
    """Under fp16 exp(q·ln λ) is clamped to float16's range, on the accelerator as on the
    CPU (with a warning on the CPU, where the check needs no device sync); bf16 has float32's
    range and needs no clamp."""
    dtype = LOW[precision]
    skip_without_bf16(device, dtype)
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=16, d_model=16, n_heads=2, n_layers=1, max_len=8,
                            **LARGE_GRADES)
    model = TransformerLM(cfg).to(device)
    ids = torch.randint(0, 16, (2, 8)).to(device)
    with warnings.catch_warnings(record=True) as caught, \
            torch.autocast(device.type, dtype=dtype):
        warnings.simplefilter("always")
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())
        top = max(float(m.scales().max()) for m in model.modules()
                  if isinstance(m, ExponentialGrading))
    # fp16: every scale within √(max) of float16 (the clamp keeps squared scales finite);
    # bf16: the scales keep their float32 values, far past float16's range
    limit = math.sqrt(torch.finfo(torch.float16).max)
    assert (top <= limit) == (dtype == torch.float16), top
    if device.type == "cpu":  # the host-side check warns on the CPU only (no device sync)
        clamped = any("clamped" in str(w.message) for w in caught)
        assert clamped == (dtype == torch.float16)
    assert logits.dtype == dtype and logits.device.type == device.type
    assert bool(logits.isfinite().all())
    loss.backward()  # unscaled: the scaler's first scale, 2^16, may overflow (and is skipped)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(g.isfinite().all()) for g in grads)


@pytest.mark.parametrize("precision", list(LOW))
@pytest.mark.parametrize("learnable", [True, False])
def test_folds_in_the_autocast_dtype_equal_the_cast_of_the_float32_fold(
        device, precision, learnable, monkeypatch):
    """Under autocast on the accelerator the folds are made in its dtype in one kernel
    (``graded.folding.fold_rows``): the logits equal those of the float32 folds that
    ``F.linear`` casts (``FoldedLinears.previous_form = True``) bit for bit, the
    gradients up to the order of a sum; the folded weights themselves equal the CPU's."""
    from graded.folding import FoldedLinears, fold_rows

    dtype = LOW[precision]
    skip_without_bf16(device, dtype)
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(
        vocab_size=17, d_model=32, n_heads=4, n_layers=2, max_len=32, d_ff=64,
        positional="learned", grading="linear", learnable_grades=learnable,
        grade_init="warm_start", grade_init_value=0.05)).to(device)
    ids = torch.randint(0, 17, (2, 24), generator=torch.Generator().manual_seed(1)).to(device)

    def step():
        model.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            logits = model(ids)
        logits.float().square().mean().backward()
        return logits, {n: p.grad.clone() for n, p in model.named_parameters()
                        if p.grad is not None}

    logits, grads = step()
    monkeypatch.setattr(FoldedLinears, "previous_form", True)
    logits_c, grads_c = step()
    assert logits.dtype == dtype and torch.equal(logits, logits_c)
    for name in grads:
        torch.testing.assert_close(grads[name], grads_c[name], rtol=1e-5, atol=1e-6, msg=name)
    w = torch.randn(48, 32, generator=torch.Generator().manual_seed(2))
    s = torch.rand(48, generator=torch.Generator().manual_seed(3)).add(0.5)
    with torch.autocast(device.type, dtype=dtype):
        (on_device, _), = fold_rows([(w.to(device), None)], [s.to(device)])
    with torch.autocast("cpu", dtype=dtype):
        (on_cpu, _), = fold_rows([(w, None)], [s])
    assert on_device.dtype == dtype and torch.equal(on_device.cpu(), on_cpu)
