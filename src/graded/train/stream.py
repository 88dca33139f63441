"""Training on a stream of batches: the loop of the discovery and tool experiments.

:class:`graded.train.Trainer` walks a fixed data set with run folders, checkpoints and resume.
Two experiments need less and something else: PatternBoost's global step (003 §3.3) retrains a
model for a few hundred steps in every round on batches drawn afresh, and the morphic
experiments of 004 §5.3 draw each batch from a generator. Both run :func:`train_on_stream`:
draw a batch, compute the loss, step the optimizer with the gradient norm clipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["train_on_stream"]


def train_on_stream(
    model: nn.Module,
    next_batch: Callable[[], Any],
    loss: Callable[[Any], tuple[Tensor, dict[str, float]]],
    *,
    steps: int,
    optimizer: torch.optim.Optimizer,
    clip_norm: float | None = 1.0,
    after_step: Callable[[int, Tensor, dict[str, float]], bool] | None = None,
) -> int:
    """Run ``steps`` optimizer steps on batches from ``next_batch()``; return the steps run.

    ``loss(batch)`` returns the loss to minimise and float metrics. After step ``s`` (1-based),
    ``after_step(s, loss, metrics)`` may return True to stop early. The model is left in
    evaluation mode.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    model.train()
    step = 0
    try:
        for step in range(1, steps + 1):
            value, metrics = loss(next_batch())
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            if clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, clip_norm)
            optimizer.step()
            if after_step is not None and after_step(step, value.detach(), metrics):
                break
    finally:
        model.eval()
    return step
