"""The trainer's steps are those of a training loop written out by hand: after N steps its
parameters and every step's loss equal the loop's exactly, on the same initial model, batches
(epoch e visits ``epoch_permutation(n, seed, e)``, step s takes slice s mod steps_per_epoch),
AdamW groups, schedule, clipping and loss (the item mean of the global batch, each micro-batch
contributing sum / count; under a graded recipe each item weighted by the recipe's
``loss_weights``, plus ``recipe.regularization`` once a step and ``recipe.on_step`` after it).
Logging, evaluations and checkpoints in between change nothing."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_training import LM_TASKS, TinyClassifier, make_data

from graded import TransformerConfig
from graded.kinds import get_kind
from graded.tasks import get_task
from graded.tasks.base import IGNORE_INDEX
from graded.train.data import epoch_permutation
from graded.train.optim import param_groups
from graded.train.options import TrainOptions
from graded.train.recipes import get_recipe
from graded.train.schedules import make_scheduler
from graded.train.trainer import Trainer


def hand_loop(model, data, opts: TrainOptions, *, seed: int, lm: bool, recipe=None,
              graded: bool = False, output_grades=None) -> list[float]:
    """``opts.steps`` steps written out; the loss of each step."""
    groups = (recipe.param_groups(model, lr=opts.lr, weight_decay=opts.weight_decay,
                                  grade_lr=opts.grade_lr) if recipe is not None
              else param_groups(model, opts.weight_decay))
    opt = torch.optim.AdamW(groups, lr=opts.lr, betas=opts.betas, eps=opts.eps)
    sched = make_scheduler(opt, opts.schedule, warmup_steps=opts.warmup_steps,
                           total_steps=opts.steps, min_ratio=opts.min_lr_ratio)
    params = [p for g in opt.param_groups for p in g["params"]]
    n, b = len(data["targets"]), opts.batch_size
    torch.manual_seed(seed)  # dropout
    model.train()
    if recipe is not None:
        recipe.on_step(model, opt, 0, opts.steps)
    losses = []
    for step in range(opts.steps):
        epoch, pos = divmod(step, n // b)
        idx = epoch_permutation(n, seed, epoch)[pos * b:(pos + 1) * b]
        targets = data["targets"][idx]
        count = int((targets != IGNORE_INDEX).sum()) if lm else len(targets)
        opt.zero_grad()
        total = None
        micro = idx.chunk(opts.grad_accum)
        for i, part in enumerate(micro):
            x, y = data["inputs"][part], data["targets"][part]
            mask = data["key_padding_mask"][part] if "key_padding_mask" in data else None
            out = model(x) if mask is None else model(x, mask)
            if lm:
                per_item = F.cross_entropy(out.float().reshape(-1, out.shape[-1]),
                                           y.reshape(-1), ignore_index=IGNORE_INDEX,
                                           reduction="none").view(y.shape)
            else:
                per_item = F.cross_entropy(out.float(), y, reduction="none")
            if graded:  # the grade of the token each target reads, or of the true class
                grades = (F.pad(data["token_grades"][part][:, 1:], (0, 1)) if lm
                          else torch.as_tensor(output_grades)[y])
                per_item = per_item * recipe.loss_weights(model, grades)
            loss_sum = per_item.sum()
            objective = loss_sum * (1 / count)
            if recipe is not None and i == len(micro) - 1:
                objective = objective + recipe.regularization(model)
            objective.backward()
            total = loss_sum.detach() if total is None else total + loss_sum.detach()
        torch.nn.utils.clip_grad_norm_(params, opts.clip_norm)
        opt.step()
        sched.step()
        if recipe is not None:
            recipe.on_step(model, opt, step + 1, opts.steps)
        losses.append(float(total) / count)
    return losses


def assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


OPTIONS = {"lr": 3e-3, "progress": False, "tensorboard": False, "device": "cpu",
           "warmup_steps": 2}


@pytest.mark.parametrize("every", [{"log_every": 1, "eval_every": 100},
                                   {"log_every": 5, "eval_every": 4, "checkpoint_every": 3}])
def test_classifier_with_dropout_trains_as_the_hand_loop_across_epochs(tmp_path, every):
    torch.manual_seed(0)
    model = TinyClassifier(dropout=0.1)
    twin = copy.deepcopy(model)
    train = make_data(96, 1)  # 6 steps an epoch: 14 steps start a third epoch
    opts = TrainOptions(steps=14, batch_size=16, **OPTIONS, **every)
    result = Trainer(model, train, make_data(48, 2), kind="classification", options=opts,
                     run_dir=tmp_path / "run", seed=0).fit()
    losses = hand_loop(twin, train, opts, seed=0, lm=False)
    assert result.losses == losses
    assert_same_parameters(model, twin)


@pytest.mark.parametrize(("task_name", "grading", "recipe"),
                         [("dyck", "exponential", "egt-alg7.1"),
                          ("polynomials", "linear", "lgt-alg5.1")])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_graded_lm_under_its_recipe_trains_as_the_hand_loop(tmp_path, task_name, grading,
                                                            recipe, grad_accum):
    """Padded rows with different scored-token counts, the graded loss of the recipe (target
    tokens weighted by their grades), λ annealing or the grade learning-rate bound, and
    micro-batches whose sums are divided by the global batch's count."""
    task = get_task(task_name, **LM_TASKS[task_name])
    train, test = task.split("random", 96, 32, seed=1)
    info = task.info()
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=info["vocab_size"], d_model=16, n_heads=2,
                               n_layers=1, d_ff=32, max_len=task.max_len, positional="learned",
                               pad_id=info["pad_id"], grading=grading, learnable_grades=True,
                               grade_init="warm_start", grade_init_value=0.1)
    kind = get_kind(task.kind)
    model = kind.build_model(config, task)
    twin = copy.deepcopy(model)
    opts = TrainOptions(steps=10, batch_size=16, grad_accum=grad_accum, log_every=3,
                        eval_every=5, **OPTIONS)
    trainer = Trainer(model, train.tensors, test.tensors, kind=kind, options=opts,
                      run_dir=tmp_path / "run", seed=0, recipe=get_recipe(recipe))
    assert trainer.graded_loss
    result = trainer.fit()
    losses = hand_loop(twin, train.tensors, opts, seed=0, lm=True, recipe=get_recipe(recipe),
                       graded=True)
    assert result.losses == losses
    assert_same_parameters(model, twin)
