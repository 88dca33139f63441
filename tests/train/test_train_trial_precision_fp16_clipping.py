"""Under fp16 the gradients are unscaled before clipping, with gradient accumulation too: the
logged gradient norm is the unscaled one (fp32's to fp16 rounding, not 2^16 times it), and the
gradients AdamW steps with are clipped to ``clip_norm`` itself (clipping the scaled gradients
would leave them at clip_norm / 2^16 once unscaled)."""

from __future__ import annotations

import pytest
import torch
from tiny_training import make_trainer

from graded.train.logging import read_metrics


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_fp16_clips_the_unscaled_gradients(tmp_path, grad_accum):
    common = {"steps": 1, "warmup_steps": 0, "clip_norm": 0.01, "grad_accum": grad_accum,
              "dropout": 0.0, "eval_every": 100}
    full = make_trainer(tmp_path / "fp32", **common)
    full.fit()
    half = make_trainer(tmp_path / "fp16", precision="fp16", **common)
    half.fit()
    assert half.scaler.get_scale() == 2.0**16  # the step was taken, scaled by 2^16
    logged = {name: read_metrics(tmp_path / name)["train"]["grad_norm"][0][1]
              for name in ("fp32", "fp16")}
    assert logged["fp32"] > 0.1  # well above clip_norm: the step was clipped
    assert logged["fp16"] == pytest.approx(logged["fp32"], rel=1e-2)
    stepped = torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(p.grad) for p in half.model.parameters()]))
    assert float(stepped) == pytest.approx(0.01, rel=1e-3)
