"""Sequence losses: token cross-entropy with label smoothing (002 §6.4, Szegedy et al. 2016)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sequence_cross_entropy"]


def sequence_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> Tensor:
    """Cross-entropy of (…, V) logits against (…) integer targets.

    With label smoothing ε the target distribution is (1 − ε)·one_hot + ε/V (002 §6.4).
    Positions whose target is ``ignore_index`` do not count; ``"mean"`` averages over the
    counted positions. Targets are class indices of any integer dtype (int32 ones, say from
    NumPy, are read as int64, which ``F.cross_entropy`` needs); other dtypes are refused.
    """
    if targets.dtype == torch.bool or targets.is_floating_point() or targets.is_complex():
        raise TypeError(f"targets must hold class indices (an integer tensor), got "
                        f"{targets.dtype}")
    if targets.dtype != torch.int64:
        targets = targets.long()
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree: logits "
            "must be targets.shape + (vocab_size,)"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index,
        label_smoothing=label_smoothing, reduction=reduction,
    )
    return loss.view(targets.shape) if reduction == "none" else loss
