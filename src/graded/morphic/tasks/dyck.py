"""Task C: Dyck-1 depth with a stack grade (004 §5.3.3; notes C3).

Tokens "(", ")", "x"; the target at each position is the depth class after the token: D0
(depth 0, a close is not allowed next) or D+ (depth > 0). G = {sem, stack}. 004's stack morphism
s_t + δ_t reads the destination as well as the source, so it is the additive ``residual_typed``
update of an edge stack ← sem; the prefix depth comes from one causal attention head with
uniform weights at initialisation: mean_{s≤t} δ_s = depth_t/(t + 1) has the sign of depth_t.

Length split (:func:`length_split`): train on sequences of length L, evaluate on sequences of a
longer length L' drawn from the same walk. The model has no positional embedding
(``positional="none"``), so it applies at any length up to its ``max_len``; what is tested is
whether the learned prefix-depth reading carries over to positions it never saw (t ≥ L), where
depth_t/(t + 1) is smaller than anything seen at depth 1 in training.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graded.morphic.attention_block import GradeTypedAttention
from graded.morphic.blocks import LinearBlock
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.model import MorphicObjective, MorphicTransformer
from graded.morphic.state import GradedStateSpace

OPEN, CLOSE, FILL, D0, DPOS = 0, 1, 2, 3, 4


class DyckDepthTask:
    vocab_size = 5

    def __init__(self, length: int = 16, p_open: float = 0.45, p_fill: float = 0.2) -> None:
        """Each token is "x" with probability ``p_fill``, "(" with ``p_open`` and ")" with the
        rest, 1 − p_open − p_fill (a ")" at depth 0 becomes "("): both must be probabilities
        with p_open + p_fill ≤ 1 (above 1 no ")" is ever drawn, NaN draws no "(")."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 2:
            raise ValueError(f"length must be an int >= 2, got {length!r}")
        for name, value in (("p_open", p_open), ("p_fill", p_fill)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 <= value <= 1):
                raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
        if p_open + p_fill > 1:
            raise ValueError(f"p_open + p_fill must be at most 1 (the rest is the probability "
                             f"of ')'), got {p_open} + {p_fill} = {p_open + p_fill}")
        self.length, self.p_open, self.p_fill = length, p_open, p_fill

    def sample(self, batch: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """input_ids (B, L) of a non-negative walk and targets (B, L) in {D0, D+}."""
        u = torch.rand(batch, self.length, generator=generator)
        ids = torch.empty(batch, self.length, dtype=torch.long)
        depth = torch.zeros(batch, dtype=torch.long)
        targets = torch.empty_like(ids)
        for t in range(self.length):
            tok = torch.where(u[:, t] < self.p_fill, FILL,
                              torch.where(u[:, t] < self.p_fill + self.p_open, OPEN, CLOSE))
            tok = torch.where((tok == CLOSE) & (depth == 0), OPEN, tok)
            depth = depth + (tok == OPEN).long() - (tok == CLOSE).long()
            ids[:, t] = tok
            targets[:, t] = torch.where(depth > 0, DPOS, D0)
        return ids, targets


def length_split(train_length: int, test_length: int, *, p_open: float = 0.45,
                 p_fill: float = 0.2) -> tuple[DyckDepthTask, DyckDepthTask]:
    """The training task (sequences of ``train_length``) and the held-out one (sequences of
    ``test_length`` > ``train_length``, the same walk): no held-out sequence has a training
    sequence's length, and positions t ≥ ``train_length`` occur only in the held-out one."""
    for name, value in (("train_length", train_length), ("test_length", test_length)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if not test_length > train_length:
        raise ValueError(f"test_length must exceed train_length = {train_length}, got "
                         f"{test_length}")
    return (DyckDepthTask(train_length, p_open, p_fill),
            DyckDepthTask(test_length, p_open, p_fill))


@torch.no_grad()
def evaluate_dyck(model: MorphicTransformer, ids: Tensor, targets: Tensor, *,
                  from_position: int = 0) -> dict[str, float]:
    """Depth-class accuracy with context-only routing (``model(ids)``): over every token, and
    over the positions t ≥ ``from_position`` (the positions a length split never trained)."""
    was_training = model.training
    model.eval()
    hit = model(ids).argmax(-1) == targets
    model.train(was_training)
    return {"accuracy": float(hit.float().mean()),
            "accuracy_from_position": float(hit[:, from_position:].float().mean())}


def build_dyck_model(task: DyckDepthTask, *, sem_dim: int = 8, stack_dim: int = 2,
                     objective: MorphicObjective | None = None, max_len: int | None = None
                     ) -> MorphicTransformer:
    """The one-layer stack model of the module doc; ``max_len`` (default: the task's length)
    is the longest sequence it accepts, e.g. the held-out length of :func:`length_split`."""
    space = GradedStateSpace({"sem": sem_dim, "stack": stack_dim})
    edges = EdgeSet.explicit(space, [("sem", "stack", "push_pop"), ("stack", "stack", "keep")])
    push = GradeTypedAttention(sem_dim, stack_dim, num_heads=1, head_dim=4, value_source="source",
                               key_source="source")
    torch.nn.init.zeros_(push.k.weight)  # uniform causal weights: the depth/(t+1) reading
    keep = LinearBlock(stack_dim, stack_dim, init="identity")
    layer = MorphicLayer(space, edges, [push, keep],
                         router={"rank": 4, "normalization": "logistic"},
                         update="residual_typed")
    return MorphicTransformer(space, [layer], task.vocab_size, max_len=max_len or task.length,
                              positional="none", objective=objective)
