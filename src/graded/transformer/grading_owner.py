"""What the module that owns a :class:`~graded.transformer.grading_plan.GradingPlan` holds
(the models, a standalone encoder or decoder): its shared gradings, registered as its own
(:func:`hold_plan`), and, for one forward pass at a time, the scales and folded weights of all
its layers computed together (a pair of forward hooks; :class:`graded.folding.FoldedLinears`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from graded.attention.graded import packed_rows_together, rows_together
from graded.folding import FoldedLinears
from graded.grading import GradingMap, stacked_scales
from graded.transformer.grading_plan import GradingPlan

__all__ = ["hold_plan"]


def hold_plan(module: nn.Module, plan: GradingPlan | None, *, register: bool) -> None:
    """Keep ``plan`` as ``module.grading_plan``; the module that owns it (``register``) also
    holds its shared gradings, as ``feature_grading``, for feature inputs ``input_grading``,
    and with per-token grading ``token_profile`` (state-dict keys ``feature_grading.*``,
    ``input_grading.*``, ``token_profile.*``)."""
    module.grading_plan = plan
    if plan is None or not register:
        return
    module.feature_grading = plan.feature
    # the shared feature scales once per forward pass (shared_scales), the learnable head
    # scales together
    module.register_forward_pre_hook(_hold_plan_scales)
    module.register_forward_hook(_release_plan_scales, always_call=True)
    if plan.inputs is not plan.feature:
        module.input_grading = plan.inputs
    if plan.token is not None:
        module.token_profile = plan.token


def _hold_plan_scales(module: nn.Module, args: Any) -> None:
    """Forward pre-hook of a plan's owner: its feature grading's scales are computed once for
    the whole pass (:func:`graded.grading.shared_scales`, here as a pair of hooks), and, in
    an eager pass, the learnable scales of all its attention layers together
    (:func:`graded.grading.stacked_scales`), each layer then reading its own row (a view
    made when it asks), the folds using the stacked tensor, and the folded
    weights of all its layers together (:func:`_hold_folds`): the same values and gradients
    in fewer kernels. ``module.batch_grading = False`` computes them layer by layer."""
    if module.feature_grading._hold_scales():
        module.__dict__["_holds_scales_memo"] = True
    if not module.__dict__.get("batch_grading", True) or torch.compiler.is_compiling():
        return
    heads = module.grading_plan.heads
    stacked = None
    if len(heads) > 1 and all(g._scales_memo is None and g.grades.requires_grad
                              for g in heads):
        stacked = stacked_scales(heads)
        if stacked is not None:
            key = heads[0]._memo_key(heads[0].grades)  # alike gradings: one key for all
            for i, g in enumerate(heads):
                g._hold_given_scales(stacked, i, key=key)
            module.__dict__["_holds_head_scales"] = True
    module.__dict__["_held_folds"] = _hold_folds(
        module.grading_plan, None if stacked is None else (heads, stacked))


def _hold_folds(plan: GradingPlan,
                heads: tuple[list[GradingMap], Tensor] | None = None) -> list[nn.Module]:
    """Give each layer that folds a grading into a linear map a ``_held_fold``: its folded
    weight and bias, computed for all such layers together (:class:`graded.folding.FoldedLinears`:
    the first asked for alone, the others at the next ask): the packed projections of the
    self-attention layers (:meth:`~graded.attention.GradedMultiheadAttention.packs_folded_rows`,
    their row scales built together, :func:`~graded.attention.graded.packed_rows_together`)
    and the output layers of the feed-forward sublayers (``folded_output``). ``heads``: the
    plan's head gradings and their scales stacked (:func:`graded.grading.stacked_scales`),
    when the pass computed them so. Returns the layers given one."""
    attention = [m for m in plan.self_attention if m.packs_folded_rows()]
    outputs = [(m, fold) for m in plan.ffn_sublayers if (fold := m.folded_output()) is not None]
    layers = attention + [m for m, _ in outputs]
    if len(layers) < 2:
        return []
    maps = ([(m.in_proj_weight, m.in_proj_bias) for m in attention]
            + [(lin.weight, lin.bias) for _, (lin, _) in outputs])
    scales = _FoldScales(attention, [g for _, (_, g) in outputs], heads)
    n = len(attention)
    # the previous form (side-by-side timing) folded each kind in a batch of its own
    batches = ([list(range(n)), list(range(n, len(maps)))] if FoldedLinears.previous_form
               else [list(range(len(maps)))])
    held: list[nn.Module] = []
    for group in batches:
        if len(group) < 2:
            continue
        batch = FoldedLinears([maps[i] for i in group],
                              lambda which, group=group: scales([group[j] for j in which]))
        for k, i in enumerate(group):
            layers[i].__dict__["_held_fold"] = functools.partial(batch.fold, k)
            held.append(layers[i])
    return held


class _FoldScales:
    """The row scales of the maps :func:`_hold_folds` folds, asked for by index (the
    attention layers' packed projections, then the feed-forward output layers): the
    attention rows of learnable scales of alike layers in one chain for all layers at the
    first ask (one concatenation; the rest are views), fixed ones (kept by each layer)
    layer by layer, as they are asked for; the output layers' the scales of their grading
    (the shared feature grading's, computed once per pass)."""

    def __init__(self, attention: list[nn.Module], outputs: list[GradingMap],
                 heads: tuple[list[GradingMap], Tensor] | None) -> None:
        self.attention = attention
        self.outputs = outputs
        self.together: list[Tensor] | None = [] if rows_together(attention) else None
        # the attention layers' scales: a slice of the heads' stacked ones when their
        # gradings are consecutive heads (all of an LM's; not a seq2seq decoder's, whose
        # cross-attention heads lie between)
        self.stacked = None
        if heads is not None and self.together is not None:
            where = {id(g): i for i, g in enumerate(heads[0])}
            first = where.get(id(attention[0].grading))
            if first is not None and all(where.get(id(m.grading)) == first + k
                                         for k, m in enumerate(attention)):
                stacked = heads[1]
                self.stacked = (stacked if len(attention) == stacked.shape[0]
                                else stacked[first:first + len(attention)])

    def __call__(self, which: list[int]) -> list[Tensor]:
        n = len(self.attention)
        scales: dict[int, Tensor] = {}  # the output layers share a grading: asked once

        def output(g: GradingMap) -> Tensor:
            if id(g) not in scales:
                scales[id(g)] = g.scales()
            return scales[id(g)]

        return [self._rows(j) if j < n else output(self.outputs[j - n]) for j in which]

    def _rows(self, j: int) -> Tensor:
        if self.together is None:
            return self.attention[j].packed_projection_rows()
        if not self.together:
            self.together = packed_rows_together(self.attention, self.stacked)
        return self.together[j]


def _release_plan_scales(module: nn.Module, args: Any, output: Any) -> None:
    """Forward hook (also on an exception): drop what :func:`_hold_plan_scales` kept."""
    if module.__dict__.pop("_holds_scales_memo", False):
        module.feature_grading._drop_scales()
    if module.__dict__.pop("_holds_head_scales", False):
        for g in module.grading_plan.heads:
            g._drop_scales()
    for m in module.__dict__.pop("_held_folds", ()):
        m.__dict__.pop("_held_fold", None)
