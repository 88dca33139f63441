"""The Linearly and Exponentially Graded Transformers (LGT, EGT): 000 §5-6, 001 §4.

A graded model is an ordinary model of :mod:`graded.transformer.models` whose stages carry a
grading (``config.grading = "linear"`` or ``"exponential"``):

=================  ========================================================  ================
stage              formula                                                   config switch
=================  ========================================================  ================
input              x' = M x, optionally x'' = x'/max(‖x'‖, ε)  (Def 5.19)     grade_input
positions          Pe' = (1 − α t)·Pe (LGT, Def 5.21), λ^{−α t}·Pe (EGT)      grade_positions
attention          graded scores/queries-keys/values/multi-head (Def 5.22)   grade_attention
feed-forward       M·Fnn(x), optionally normalised  (Def 5.23, 6.15)          grade_ffn
output             z = W_out (M h) + b  (Def 5.23, 6.15)                      grade_output
per-token          M_{q_i}, q_i = s_i·p: input, ffn, output (§6.2)            token_grading
=================  ========================================================  ================

Two more switches act on the input representation: ``grade_input_activation="relu"`` applies
000 Def 5.19's h_i = ReLU(W x''_i + b) (W the input projection of feature models, a map of its
own for token models), and ``grade_position_normalize`` Eq. 48's z'_i = z_i/‖z_i‖ after the
graded positions are added (z_i = h_i + Pe'(t_i)).

One feature grading M = diag(m(q)) over d_model, with grades q, is shared by the input,
feed-forward and output stages (000 uses the same M_q in each definition); every attention
layer has its own grades q_i over head_dim, shared by its heads or one tuple per head
(``grades_per_head``). With neutral grades (q = 0 for EGT and "shift"; f(q) = 1 in general),
α = 0 and no normalisation, each stage multiplies by exactly 1 and the graded model equals its
ungraded twin bit for bit. Normalisation departs from that on purpose (it changes the model).

Where a grading M = diag(m) sits next to a linear map inside the stack, ``config.fold_grading``
(default) folds it into the map's weights (:func:`graded.folding.graded_linear`): the
feed-forward grading into its output layer, (W_2, b_2) ← (diag(m) W_2, m·b_2), the output
grading into the head, W_out ← W_out diag(m), and each attention grading into the projections
(:mod:`graded.attention.graded`). It is the same map, up to rounding, at O(d²) per call instead
of O(B·T·d). Per-token grading and normalisation still act on the activations, after it. The
input grading stays on the activations (see :class:`~graded.transformer.models.InputEmbedding`).

The gradings are made once, from the config, by a :class:`GradingPlan`, and handed to each
stage through its constructor (``InputEmbedding(config, plan=plan)``, ``TransformerStack``,
the blocks, ``AttentionSublayer``, ``FeedForwardSublayer``, the output head). Each grading
carries its ``role`` ("input", "feature", "attention" or "token"); :func:`gradings`,
:func:`feature_gradings`, :func:`head_gradings` and :func:`feature_grading` find them by role.

This module holds that lookup and gives the graded model's names in one place; the plan is
:mod:`graded.transformer.grading_plan`, the stage modules
:mod:`graded.transformer.graded_stages`, and what the plan's owner holds per forward pass
:mod:`graded.transformer.grading_owner`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from torch import nn

from graded.grading import GradingMap
from graded.transformer.graded_stages import (
    GradedFeatures,
    GradedPositions,
    TokenGrading,
    foldable_grading,
    normalize_rows,
    per_token,
)
from graded.transformer.grading_owner import hold_plan
from graded.transformer.grading_plan import (
    GRADE_INITS,
    ROLES,
    GradingPlan,
    graded_stage,
    resolve_plan,
)

__all__ = [
    "GRADE_INITS",
    "ROLES",
    "GradedFeatures",
    "GradedPositions",
    "GradingPlan",
    "TokenGrading",
    "feature_grading",
    "feature_gradings",
    "foldable_grading",
    "graded_stage",
    "gradings",
    "head_gradings",
    "held_gradings",
    "hold_plan",
    "normalize_rows",
    "per_token",
    "resolve_plan",
]


def gradings(model: nn.Module, role: str | None = None) -> dict[str, GradingMap]:
    """Every distinct grading module of a model, by its first qualified name; only those of
    ``role`` (one of :data:`ROLES`) when given."""
    if role is not None and role not in ROLES:
        raise ValueError(f"unknown grading role {role!r}; expected one of {ROLES}")
    held = _HELD.get()
    if held is not None and held[0] is model:
        return {name: m for name, m in held[1].items() if role is None or m.role == role}
    found: dict[str, GradingMap] = {}
    seen: set[int] = set()
    for name, m in model.named_modules():
        if isinstance(m, GradingMap) and id(m) not in seen:
            seen.add(id(m))
            if role is None or m.role == role:
                found[name] = m
    return found


_HELD: contextvars.ContextVar[tuple[nn.Module, dict[str, GradingMap]] | None] = \
    contextvars.ContextVar("held_gradings", default=None)


@contextlib.contextmanager
def held_gradings(model: nn.Module) -> Iterator[dict[str, GradingMap]]:
    """Inside the block, :func:`gradings` of ``model`` (and the functions built on it) answer
    from the gradings found on entry instead of walking the module tree again: a walk costs
    about 150 µs of host time on a 12-layer model, and a graded training step needs three (the
    regularisation, the loss weights, the grade learning-rate bound). For a caller that adds
    or removes no module of ``model`` inside the block, such as the trainer, whose optimizer
    holds the parameters the model was built with. Yields the gradings."""
    found = gradings(model)
    token = _HELD.set((model, found))
    try:
        yield found
    finally:
        _HELD.reset(token)


def head_gradings(model: nn.Module) -> list[GradingMap]:
    """The gradings of attention heads (role ``"attention"``), one per attention layer."""
    return list(gradings(model, "attention").values())


def feature_gradings(model: nn.Module) -> list[GradingMap]:
    """The gradings over features, every grading that is not an attention head's."""
    return [g for g in gradings(model).values() if g.role != "attention"]


def feature_grading(model: nn.Module) -> GradingMap | None:
    """The model's shared d_model grading (role ``"feature"``); None for an ungraded model."""
    found = list(gradings(model, "feature").values())
    if len(found) > 1:
        raise ValueError(f"{type(model).__name__} holds {len(found)} feature gradings; "
                         "expected one (the grading of one GradingPlan)")
    return found[0] if found else None
