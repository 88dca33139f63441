"""The tiny run config the command-line tests train: Dyck-2 with a one-layer model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TINY_MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "positional": "learned"}


def tiny_config(tmp_path: Path, name: str = "tiny", *, model: dict[str, Any] | None = None,
                **train: Any) -> Path:
    """Write ``tmp_path/<name>.yaml`` (runs under ``tmp_path/runs``); ``train`` overrides the
    few-step training options."""
    cfg = {
        "name": name,
        "task": {"name": "dyck", "options": {"max_length": 8, "max_depth": 3},
                 "n_train": 64, "n_eval": 32},
        "model": model or dict(TINY_MODEL),
        "train": {"steps": 2, "batch_size": 16, "warmup_steps": 1, "eval_every": 2,
                  "log_every": 1, "progress": False, "tensorboard": False, **train},
        "output": {"dir": str(tmp_path / "runs"), "plots": False},  # plots: their own test
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
