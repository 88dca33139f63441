"""The values a training step is logged with are those the step ran with: its learning rate
(not the next step's, which the scheduler has set by the time the step is logged), and a graded
recipe's λ and grade learning rate."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_training import make_data, make_trainer

from graded.train.logging import read_metrics
from graded.train.options import TrainOptions
from graded.train.trainer import Trainer


def _cosine(step: int, *, peak: float, warmup: int, total: int) -> float:
    """The learning rate of optimizer step ``step`` (counted from 1) by hand: linear warmup
    to ``peak`` over ``warmup`` steps, then a half cosine from ``peak`` down to 0 at ``total``."""
    if step <= warmup:
        return peak * step / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - 1 - warmup) / (total - warmup)))


def test_the_logged_learning_rate_of_each_step_is_the_one_its_optimizer_step_used(tmp_path):
    trainer = make_trainer(tmp_path / "run", steps=6, lr=0.01, schedule="cosine",
                           warmup_steps=2, log_every=1)
    used = []  # the rate of each optimizer step, read as it starts
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    trainer.fit()
    logged = read_metrics(tmp_path / "run")["train"]["lr"]
    # by hand: 0.005, 0.01 (warmup), then 0.01 · (1 + cos(π k/4))/2 for k = 0..3
    expected = [_cosine(s, peak=0.01, warmup=2, total=6) for s in range(1, 7)]
    assert expected[:4] == pytest.approx([0.005, 0.01, 0.01, 0.005 * (1 + math.sqrt(0.5))])
    assert [s for s, _ in logged] == [1, 2, 3, 4, 5, 6]
    assert [v for _, v in logged] == pytest.approx(expected, rel=1e-12)
    assert used == pytest.approx(expected, rel=1e-12)


def test_a_resumed_run_logs_the_learning_rate_its_steps_used(tmp_path):
    make_trainer(tmp_path / "run", steps=6, lr=0.01, schedule="cosine", warmup_steps=2,
                 log_every=1).fit(pause_after=3)
    make_trainer(tmp_path / "run", steps=6, lr=0.01, schedule="cosine", warmup_steps=2,
                 log_every=1).fit(resume_from=tmp_path / "run")
    logged = read_metrics(tmp_path / "run")["train"]["lr"]
    assert [s for s, _ in logged] == [1, 2, 3, 4, 5, 6]
    assert [v for _, v in logged] == pytest.approx(
        [_cosine(s, peak=0.01, warmup=2, total=6) for s in range(1, 7)], rel=1e-12)


def test_a_graded_recipe_logs_the_lambda_and_grade_learning_rate_its_steps_used(tmp_path):
    """EGT (000 Alg 7.1): step t runs with λ_t = 1 + (λ_max − 1)·t/T, and with the grade
    learning rate the bound capped before its optimizer step; both are logged with step t."""
    from graded import TransformerClassifier, TransformerConfig
    from graded.grading.exponential import ExponentialGrading
    from graded.train.recipes import get_recipe

    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=12, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                            max_len=8, positional="learned", grading="exponential",
                            learnable_grades=True, grading_base=2.0)
    model = TransformerClassifier(cfg, 3)
    total = 5
    opts = TrainOptions(steps=total, batch_size=16, lr=0.05, grade_lr=0.5, eval_every=5,
                        log_every=1, progress=False, tensorboard=False, device="cpu",
                        warmup_steps=1)
    trainer = Trainer(model, make_data(64, 1), make_data(32, 2), kind="classification",
                      options=opts, run_dir=tmp_path / "run", seed=0,
                      recipe=get_recipe("egt-alg7.1"), output_grades=[0.0, 1.0, 2.0])
    names = [g.get("name") for g in trainer.optimizer.param_groups]
    gradings = [m for m in model.modules() if isinstance(m, ExponentialGrading)]
    assert "grades" in names and gradings
    used = []  # each optimizer step's rates and λ, read as it starts

    def recorded(opt, args, kwargs):
        groups = opt.param_groups
        used.append((groups[0]["lr"], groups[names.index("grades")]["lr"],
                     float(gradings[0].base)))

    trainer.optimizer.register_step_pre_hook(recorded)
    trainer.fit()
    logged = read_metrics(tmp_path / "run")["train"]
    lam = [v for _, v in logged["lambda"]]
    assert lam == pytest.approx([1 + (2.0 - 1) * t / total for t in range(1, total + 1)])
    assert [u[2] for u in used] == pytest.approx(lam)
    assert [v for _, v in logged["grade_lr"]] == pytest.approx([u[1] for u in used])
    assert [v for _, v in logged["lr"]] == pytest.approx([u[0] for u in used])
