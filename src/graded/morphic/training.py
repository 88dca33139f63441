"""A small seeded training loop for morphic models (004 App. B.2 settings: AdamW, clipping).

``train_morphic`` calls ``model.training_loss(input_ids, targets)``, the same protocol the general
trainer uses, so a morphic model trained here or there sees the same objective. The 004 §5.3
experiments draw a fresh batch from a generator at every step, so this runs the stream loop of
:mod:`graded.train.stream` (shared with PatternBoost); runs from config files use
:class:`graded.train.Trainer` (task kind ``MorphicLM``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from graded.checks import check_float, check_int
from graded.train.stream import train_on_stream


@dataclass
class MorphicTrainResult:
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    initial_model: nn.Module | None = None


def train_morphic(
    model: nn.Module, batches: Callable[[torch.Generator], tuple[Tensor, Tensor]], *,
    steps: int, lr: float = 3e-3, weight_decay: float = 0.01, clip: float | None = 1.0,
    seed: int = 0, log_every: int = 50, keep_initial: bool = False,
    stop: Callable[[nn.Module, int], bool] | None = None,
) -> MorphicTrainResult:
    """Train with AdamW and gradient clipping (:func:`graded.train.stream.train_on_stream`);
    ``batches(generator)`` returns (input_ids, targets).

    ``stop(model, step)`` (checked every ``log_every`` steps) ends training early when it is True.
    ``clip`` is the gradient-norm bound (None: no clipping).
    """
    steps = check_int("steps", steps, minimum=1)  # 2.5 failed inside range() unnamed
    log_every = check_int("log_every", log_every, minimum=1)
    if clip is not None:  # NaN would make every parameter NaN, 0 every step a no-op
        clip = check_float("clip", clip, minimum=0, strict_min=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    result = MorphicTrainResult(initial_model=copy.deepcopy(model) if keep_initial else None)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    def after_step(step: int, loss: Tensor, metrics: dict[str, float]) -> bool:
        if step % log_every and step != steps:
            return False
        result.history.append({"step": float(step), **metrics})
        return stop is not None and stop(model, step)

    start = time.perf_counter()
    train_on_stream(model, lambda: batches(gen), lambda b: model.training_loss(*b), steps=steps,
                    optimizer=opt, clip_norm=clip, after_step=after_step)
    result.seconds = time.perf_counter() - start
    return result
