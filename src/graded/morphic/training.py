"""A small seeded training loop for morphic models (004 App. B.2 settings: AdamW, clipping).

``train_morphic`` calls ``model.training_loss(input_ids, targets)``, the same protocol the general
trainer uses, so a morphic model trained here or there sees the same objective. It exists beside
:class:`graded.train.Trainer` for one reason: the 004 §5.3 experiments draw a fresh batch from a
generator at every step (an unbounded stream), where the trainer walks a fixed data set with run
folders, checkpoints and resume. Runs from config files use the trainer (task kind ``MorphicLM``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


@dataclass
class MorphicTrainResult:
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    initial_model: nn.Module | None = None


def train_morphic(
    model: nn.Module, batches: Callable[[torch.Generator], tuple[Tensor, Tensor]], *,
    steps: int, lr: float = 3e-3, weight_decay: float = 0.01, clip: float = 1.0, seed: int = 0,
    log_every: int = 50, keep_initial: bool = False,
    stop: Callable[[nn.Module, int], bool] | None = None,
) -> MorphicTrainResult:
    """Train with AdamW and gradient clipping; ``batches(generator)`` returns (input_ids, targets).

    ``stop(model, step)`` (checked every ``log_every`` steps) ends training early when it is True.
    """
    if steps <= 0:
        raise ValueError(f"steps must be > 0, got {steps}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    result = MorphicTrainResult(initial_model=copy.deepcopy(model) if keep_initial else None)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    start = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        ids, targets = batches(gen)
        loss, metrics = model.training_loss(ids, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        if step % log_every == 0 or step == steps:
            result.history.append({"step": float(step), **metrics})
            if stop is not None and stop(model, step):
                break
    model.eval()
    result.seconds = time.perf_counter() - start
    return result
