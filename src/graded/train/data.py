"""Batches whose order is a pure function of (seed, step), so training can resume mid-epoch.

A dataset here is a dict of tensors sharing their first dimension (what the task generators
return). Epoch ``e`` visits the examples in the order ``randperm(n)`` drawn from a generator
seeded with ``(seed, e)``; global step ``s`` takes the slice of epoch ``s // steps_per_epoch`` at
position ``s % steps_per_epoch``. Nothing depends on how many batches were drawn before, so a run
resumed at step ``s`` sees exactly the batches it would have seen, without replaying the loader.
With ``world_size`` ranks each rank takes a contiguous share of the global batch, which with DDP's
gradient averaging reproduces the single-process step on the same global batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

Batch = dict[str, torch.Tensor]


def dataset_size(data: Mapping[str, torch.Tensor]) -> int:
    """The common first dimension of the tensors in ``data`` (ValueError if they disagree)."""
    sizes = {name: int(t.shape[0]) for name, t in data.items()}
    if not sizes:
        raise ValueError("dataset is empty: expected a dict of tensors")
    if len(set(sizes.values())) != 1:
        raise ValueError(f"dataset tensors disagree on their first dimension: {sizes}")
    return next(iter(sizes.values()))


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The visiting order of epoch ``epoch``: a fixed function of ``(seed, epoch)``."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63 - 1))
    return torch.randperm(n, generator=gen)


class StepSampler:
    """Indices of the global batch of any step, and each rank's micro-batches within it."""

    def __init__(
        self,
        n: int,
        global_batch: int,
        *,
        seed: int,
        grad_accum: int = 1,
        world_size: int = 1,
        rank: int = 0,
        shuffle: bool = True,
    ) -> None:
        if global_batch < 1 or global_batch > n:
            raise ValueError(f"batch size (train.batch_size) must be in [1, {n}] (the training "
                             f"set's size), got {global_batch}")
        per_step = grad_accum * world_size
        if global_batch % per_step:
            raise ValueError(
                f"batch size {global_batch} must be divisible by grad_accum × world_size = "
                f"{grad_accum} × {world_size}"
            )
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self.grad_accum, self.world_size, self.rank = grad_accum, world_size, rank
        self.shuffle = shuffle
        self.steps_per_epoch = n // global_batch  # the incomplete last batch is dropped
        self._cache: tuple[int, torch.Tensor] | None = None

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n)
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, epoch_permutation(self.n, self.seed, epoch))
        return self._cache[1]

    def global_indices(self, step: int) -> torch.Tensor:
        """All indices of step ``step``'s global batch (identical on every rank)."""
        epoch, pos = divmod(step, self.steps_per_epoch)
        return self._order(epoch)[pos * self.global_batch : (pos + 1) * self.global_batch]

    def micro_batches(self, step: int) -> list[torch.Tensor]:
        """This rank's ``grad_accum`` micro-batches of step ``step``."""
        idx = self.global_indices(step)
        local = self.global_batch // self.world_size
        idx = idx[self.rank * local : (self.rank + 1) * local]
        return list(idx.chunk(self.grad_accum))

    def epoch_of(self, step: int) -> float:
        return step / self.steps_per_epoch


def to_device(batch: Mapping[str, torch.Tensor], device: torch.device | str) -> Batch:
    """Every tensor of ``batch`` on ``device`` (copies queued without waiting)."""
    return {name: t.to(device, non_blocking=True) for name, t in batch.items()}

