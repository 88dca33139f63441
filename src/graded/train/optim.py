"""Optimiser parameter groups and gradient clipping (002 §6.2)."""

from __future__ import annotations

import torch
from torch import nn

from graded.checks import check_float

__all__ = ["clip_gradients", "is_grade_parameter", "param_groups"]


def is_grade_parameter(name: str) -> bool:
    """Learnable grades are named ``...grades`` by the grading modules."""
    return name == "grades" or name.endswith(".grades")


def param_groups(
    model: nn.Module, weight_decay: float, *, include_grades: bool = True
) -> list[dict]:
    """AdamW groups: weight decay on matrices of linear/attention layers only; none on biases,
    norms, embeddings, position tables or grades. Grades are left out when ``include_grades``
    is False (the graded training recipes put them in a group of their own). A bias is a
    parameter of less than two dimensions or one whose name starts with ``bias``: the
    (1, 1, E) ``bias_k`` and ``bias_v`` of attention with ``add_bias_kv`` are biases too."""
    no_decay_types = (nn.LayerNorm, nn.RMSNorm, nn.Embedding)
    no_decay_ids = {
        id(p) for m in model.modules() if isinstance(m, no_decay_types)
        for p in m.parameters(recurse=False)
    }
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if is_grade_parameter(name):
            if include_grades:
                no_decay.append(p)
            continue
        if p.dim() < 2 or id(p) in no_decay_ids or name.rsplit(".", 1)[-1].startswith("bias"):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    return [g for g in groups if g["params"]]


def clip_gradients(model: nn.Module, max_norm: float | None) -> float:
    """Clip the global gradient norm to ``max_norm`` (no-op if None); returns the norm.
    ``max_norm`` must be a positive finite number: torch's clipping multiplies the gradients
    by max_norm/‖g‖ when that is below 1, which a negative value turns into an ascent step."""
    if max_norm is not None:
        check_float("max_norm (None for no clipping)", max_norm, minimum=0, strict_min=True)
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    if max_norm is None:
        return float(torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
