"""The scales of several gradings at once: computed together for alike gradings
(:func:`batched_scales`, :func:`stacked_scales`: a model's attention layers each hold one) and
held for the length of a block (:func:`shared_scales`: one grading used at several stages of a
forward pass). See :mod:`graded.grading`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from graded.folding import _autocast_on

if TYPE_CHECKING:
    from graded.grading.base import GradingMap

__all__ = ["batched_scales", "shared_scales", "stacked_scales"]


def batched_scales(gradings: Sequence[GradingMap]) -> list[Tensor] | None:
    """``[g.scales() for g in gradings]`` computed together: the grades stacked, one chain of
    operators for all (the same values and gradients), views of the result returned; None
    when the gradings are not alike (kind, learnability, settings, the grades' shape, dtype
    and device; EGT's bases may differ). A model's attention layers each hold a grading of
    their own: an eager forward pass computes all their scales this way, a few kernels
    instead of a few per layer (:mod:`graded.transformer.graded`)."""
    stacked = stacked_scales(gradings)
    return None if stacked is None else list(stacked.unbind(0))


def stacked_scales(gradings: Sequence[GradingMap]) -> Tensor | None:
    """:func:`batched_scales` as one tensor, the gradings' scales on its first axis (None
    when they are not alike)."""
    if not gradings:
        return None
    signature = gradings[0]._batch_signature()
    if any(g._batch_signature() != signature for g in gradings):
        return None
    return gradings[0]._batched_scales(gradings)


def _stack_grades(gradings: Sequence[GradingMap]) -> Tensor:
    """The grades of ``gradings`` (one dtype and device) stacked on a new first axis, outside
    autocast: its promotion of ``torch.stack`` fails on a float16 tensor under a bfloat16
    autocast and the reverse ("Unexpected floating ScalarType"), and has nothing to promote
    among tensors of one dtype."""
    grades = [g.grades for g in gradings]
    device = grades[0].device.type
    if _autocast_on(device) is None:
        return torch.stack(grades)
    with torch.autocast(device, enabled=False):
        return torch.stack(grades)


@contextlib.contextmanager
def shared_scales(grading: GradingMap) -> Iterator[GradingMap]:
    """Inside the block, ``grading.scales()`` is computed once per grad mode and autocast dtype
    and the same tensor is returned to every later call: for a grading used at several stages
    of one forward pass (the feature grading of the input, every feed-forward and the output
    stage, 000 Defs 5.19, 5.23), one computation instead of one per stage, with the gradients
    of all uses summed into it as before. The models hold it for the length of their
    ``forward``. Grades must not change inside the block. Nested blocks use the outer one's
    values; under ``torch.compile`` nothing is kept (the compiler shares the computation)."""
    held = grading._hold_scales()
    try:
        yield grading
    finally:
        if held:
            grading._drop_scales()
