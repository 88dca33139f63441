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

Values the host holds (the stop vote, :class:`StopVote`; each rank's RNG state for a checkpoint,
:func:`gather_bytes`) travel over the context's ``host_group``, a gloo group of CPU tensors (the
default group when that is gloo already): never through the device, so under NCCL they wait for
no GPU work.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

if dist.is_available():  # torch.distributed.nn before any group is made: see setup
    import torch.distributed.nn


@dataclass(frozen=True)
class DistContext:
    """Rank, world size and device of this process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    initialised_here: bool = False
    host_group: Any = None  # the gloo group of host values; None: the default group (gloo)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def check_device_name(name: Any) -> str:
    """``name`` if it is one of the device names training takes (``auto``, ``cpu``, ``cuda``,
    ``cuda:N``); a ValueError naming it otherwise. ``cpu:N`` (an index torch ignores on the CPU)
    and other device types are refused."""
    if isinstance(name, str) and (name in ("auto", "cpu", "cuda")
                                  or re.fullmatch(r"cuda:[0-9]+", name)):
        return name
    raise ValueError(f"device {name!r} is not supported: expected 'auto', 'cpu', 'cuda' or "
                     "'cuda:N'")


def resolve_device(name: str) -> torch.device:
    """``"auto"`` picks CUDA when available, else CPU; other names are checked
    (:func:`check_device_name`, then that a CUDA device exists)."""
    if check_device_name(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available; use 'cpu'")
    if device.type == "cuda" and device.index is not None \
            and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA "
                         "device(s)")
    return device


def setup(device: str = "auto") -> DistContext:
    """Join the ``torchrun`` process group when launched by it; otherwise a 1-process context.

    ``torch.distributed.nn`` is imported with this module, before the group is made: its
    functions take ``group=group.WORLD`` as a default argument, evaluated when the module is
    first imported. Imported after (``DistributedDataParallel`` imports it through
    ``torch._dynamo``), they would hold the default group for good, so that :func:`teardown`
    could not free it: its gloo threads would outlive ``destroy_process_group`` into the
    interpreter's finalisation. There a worker thread that frees a finished collective's
    tensors (Python-owned) asks for the GIL, the interpreter ends that thread (``pthread_exit``)
    and the unwinding through the work's destructor calls ``std::terminate``: the rank aborts,
    "terminate called without an active exception" (3 in 135 two-process launches)."""
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
    # every rank makes this call, in the same order: a group's creation is collective
    host = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return DistContext(rank, world_size, local_rank, dev, created, host)


def teardown(ctx: DistContext) -> None:
    """Leave the process group if :func:`setup` created it. The group (and its gloo threads)
    is freed here unless something else still holds it (see :func:`setup`)."""
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


class StopVote:
    """Whether any rank raised its stop flag, agreed by every rank one call late, so that no
    call waits for the others.

    Each call starts an all-reduce (max) of this rank's flag, a CPU tensor on the host group,
    without waiting for it, and returns the answer of the call before, long finished by then
    (the step between holds the ranks' gradient all-reduces). Every rank makes the same calls
    and gets the same answers, so every rank stops at the same call: a flag raised during step
    s stops every rank after step s + 1. In one process a call returns the flag itself and
    runs no collective. :meth:`close` waits for the call still unanswered, once the loop is
    over, so that no collective outlives it.
    """

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self._pending: tuple[Any, torch.Tensor] | None = None

    def __call__(self, flag: bool) -> bool:
        if not self.ctx.distributed:
            return flag
        agreed = False
        if self._pending is not None:
            work, votes = self._pending
            work.wait()
            agreed = bool(votes[0])
            self._pending = None
        if not agreed:  # every rank stops at an agreed call: none asks again after it
            votes = torch.tensor([1 if flag else 0], dtype=torch.int32)
            work = dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.ctx.host_group,
                                   async_op=True)
            self._pending = (work, votes)
        return agreed

    def close(self) -> None:
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None


def gather_bytes(ctx: DistContext, data: bytes) -> list[bytes] | None:
    """Every rank's ``data`` on rank 0, by rank (None on the other ranks; ``[data]`` in one
    process), over the host group. Every rank calls it."""
    if not ctx.distributed:
        return [data]
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, torch.tensor([len(data)]), group=ctx.host_group)
    longest = max(int(n) for n in sizes)
    buffer = torch.zeros(longest, dtype=torch.uint8)
    if data:
        buffer[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    received = ([torch.empty(longest, dtype=torch.uint8) for _ in range(ctx.world_size)]
                if ctx.is_main else None)
    dist.gather(buffer, received, dst=0, group=ctx.host_group)
    if received is None:
        return None
    return [bytes(b[:int(n)].numpy()) for b, n in zip(received, sizes, strict=True)]


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
