"""Multi-process training through ``torchrun`` (PyTorch DDP; gloo on CPU, NCCL on GPU).

The trainer calls :func:`setup` once. Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set in the
environment) it joins the process group and returns the rank's view; otherwise it returns a
single-process context, so the same training code runs in both settings. Every rank computes
the same global batch order (:mod:`graded.train.data`) and takes its own slice of each batch, the
role ``DistributedSampler`` plays for map-style datasets. Logging and checkpoints happen on rank 0.

DDP averages gradients over ranks, which equals the one-process gradient only when every rank's
loss weighs the same. Ranks of a language-model batch hold different numbers of scored tokens,
so the trainer counts the items of the whole global batch first (every rank knows its indices,
so this needs no collective) and each rank minimises ``world_size × (its loss sum) / (global
count)``: DDP's mean of these is the gradient of the global token mean, the one-process
objective. The losses and metrics are summed over the ranks when the trainer reads them
(:func:`sum_tensor_across`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    """Rank, world size and device of this process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    initialised_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str) -> torch.device:
    """``"auto"`` picks CUDA when available, else CPU; other names are checked."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {name!r} is not a device: expected 'auto', 'cpu', 'cuda' or "
                         "'cuda:N'") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r} is not supported: expected 'auto', 'cpu', 'cuda' or "
                         "'cuda:N'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available; use 'cpu'")
    if device.type == "cuda" and device.index is not None \
            and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA "
                         "device(s)")
    return device


def setup(device: str = "auto") -> DistContext:
    """Join the ``torchrun`` process group when launched by it; otherwise a 1-process context."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistContext(device=resolve_device(device))
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    created = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        created = True
    return DistContext(rank, world_size, local_rank, dev, created)


def teardown(ctx: DistContext) -> None:
    """Leave the process group if :func:`setup` created it."""
    if ctx.initialised_here and dist.is_initialized():
        dist.destroy_process_group()


def sum_tensor_across(ctx: DistContext, t: torch.Tensor) -> torch.Tensor:
    """``t`` summed elementwise over ranks (``t`` itself in one process), without reading it
    on the host."""
    if not ctx.distributed:
        return t
    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def any_across(ctx: DistContext, flag: bool) -> bool:
    """True when ``flag`` is true on any rank (used so that every rank stops at the same step)."""
    if not ctx.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def wrap_model(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """Wrap in ``DistributedDataParallel`` when running on several ranks."""
    if not ctx.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper (the module itself otherwise)."""
    return getattr(model, "module", model)
