"""The grades a model that grades tokens needs to answer a prompt: ``token_grades`` of the prompt
and, where it continues the sequence, a ``token_grader`` for the tokens it generates.

A model built with ``TransformerConfig.token_grading`` grades each token by the grade its task
gives it (``Task.grade_tokens``); its ``generate`` takes the prompt's grades and a function that
grades each new token (:mod:`graded.transformer.decoding_grades`). :func:`prompt_grading` makes
both from the task, for the task kinds' ``generate`` (:mod:`graded.kinds`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["prompt_grading"]


def prompt_grading(model: nn.Module, task: Any, ids: Tensor, *, continues: bool
                   ) -> dict[str, Any]:
    """What a model that grades tokens (``TransformerConfig.token_grading``) needs besides the
    prompt ``ids`` (B, T): ``token_grades``, the task's grades of the prompt
    (``Task.grade_tokens``, as its datasets grade the same sequence), and, when the model
    ``continues`` a sequence (an LM's new tokens, a seq2seq decoder's), ``token_grader``: the
    task's grades of a sequence of ids, whose last grades each generated token. {} for a model
    that does not grade tokens. ValueError naming the task when it cannot grade a
    continuation (``Task.causal_grades`` False: a token's grade depends on later tokens)."""
    if not getattr(getattr(model, "config", None), "token_grading", False):
        return {}
    vocab = task.vocab

    def grade(row: Tensor | list[int]) -> list[int]:
        return task.grade_tokens(vocab.decode(row, skip_pad=False))

    grades = torch.tensor([grade(row) for row in ids.tolist()], dtype=torch.float32,
                          device=ids.device)
    if not continues:
        return {"token_grades": grades}
    if not getattr(task, "causal_grades", False):
        raise ValueError(f"task {task.name!r} cannot grade a continuation: the grade of a "
                         "token depends on tokens after it, so a generated token has no grade "
                         "when the next one is chosen, and this model grades tokens "
                         "(TransformerConfig.token_grading=True)")
    return {"token_grades": grades, "token_grader": grade}
