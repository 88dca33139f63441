"""tiny_training's one-layer language model on the Dyck task (tests/train), with grading
options and on a chosen device, for the GPU suite's trainer tests."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_training import LM_TASKS, OPTIONS

from graded import TransformerConfig
from graded.kinds import get_kind
from graded.tasks import get_task
from graded.train.options import TrainOptions
from graded.train.trainer import Trainer

#: The config options of the ungraded, LGT and EGT models (learnable grades, small enough that
#: every scale stays inside float16's range).
GRADINGS = {
    "ungraded": {},
    "LGT": dict(grading="linear", learnable_grades=True, grade_init="warm_start",
                grade_init_value=0.1),
    "EGT": dict(grading="exponential", learnable_grades=True, grade_init="warm_start",
                grade_init_value=0.1),
}


def lm_trainer(run_dir: Path, device: torch.device, grading: dict, *,
               recipe: str | None = None, **options) -> Trainer:
    """tiny_training.make_lm_trainer's model and data with the ``grading`` config options,
    trained on ``device`` for 6 steps unless ``options`` say otherwise (with ``recipe``)."""
    task = get_task("dyck", **LM_TASKS["dyck"])
    train, test = task.split("random", 96, 32, seed=1)
    info = task.info()
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=info["vocab_size"], d_model=16, n_heads=2, n_layers=1,
                               d_ff=32, max_len=task.max_len, positional="learned",
                               pad_id=info["pad_id"], **grading)
    kind = get_kind(task.kind)
    opts = TrainOptions(**{**OPTIONS, "device": str(device), "steps": 6, **options})
    return Trainer(kind.build_model(config, task), train.tensors, test.tensors, kind=kind,
                   options=opts, run_dir=run_dir, seed=0, recipe=recipe)
