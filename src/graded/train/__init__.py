"""Training: losses, optimiser groups, schedules, recipes and the trainer.

The trainer and checkpoint names are imported lazily (they pull in the data and logging
machinery): ``from graded.train import Trainer`` works as usual.
"""

from graded.train.losses import sequence_cross_entropy
from graded.train.optim import clip_gradients, param_groups
from graded.train.recipes import Recipe, get_recipe
from graded.train.schedules import constant, inverse_sqrt, make_scheduler, warmup_cosine

_LAZY = {
    "Trainer": "graded.train.trainer",
    "TrainResult": "graded.train.outcome",
    "TrainOptions": "graded.train.options",
    "EarlyStopping": "graded.train.options",
    "CheckpointManager": "graded.train.checkpoint",
    "save_checkpoint": "graded.train.checkpoint_folder",
    "load_checkpoint": "graded.train.checkpoint_folder",
    "evaluate": "graded.train.objectives",
    "predict": "graded.train.objectives",
    "read_metrics": "graded.train.logging",
    "read_grades": "graded.train.logging",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graded.train' has no attribute {name!r}")


__all__ = [
    "CheckpointManager",
    "EarlyStopping",
    "Recipe",
    "TrainOptions",
    "TrainResult",
    "Trainer",
    "clip_gradients",
    "constant",
    "evaluate",
    "get_recipe",
    "inverse_sqrt",
    "load_checkpoint",
    "make_scheduler",
    "param_groups",
    "predict",
    "read_grades",
    "read_metrics",
    "save_checkpoint",
    "sequence_cross_entropy",
    "warmup_cosine",
]
