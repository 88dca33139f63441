"""The grades a token-graded model (``TransformerConfig.token_grading``, 000 §6.2) reads while
it generates: the prompt's ``token_grades``, checked, and a grader of each new token from a task's
grading of the extended sequence (:func:`token_grading`, :func:`grader_of`), used by
:mod:`graded.transformer.generation`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from graded.checks import check_float

__all__ = ["GradeLast", "TokenGrader", "grader_of", "token_grading"]

#: The grades of one sequence's token ids (a task's grading, e.g. ``Task.grade_tokens``).
TokenGrader = Callable[[list[int]], Sequence[float]]
GradeLast = Callable[[Tensor, Tensor], Tensor]


def grader_of(token_grader: TokenGrader, dtype: torch.dtype) -> GradeLast:
    """``grade_last(ids, key_padding_mask)``: the grade (B,) of each row's last token, the last
    of ``token_grader``'s grades of the row's real tokens (so the task grades the extended
    sequence as it grades its data; its grading must be causal, ``Task.causal_grades``, for the
    earlier grades to stay those already used). A row whose last token is padding (a finished
    row) gets grade 0, as padding has in the datasets. The grades are read on the host and
    checked here (a count per token, finite and >= 0): the model reads them no more."""

    def grade_last(ids: Tensor, key_padding_mask: Tensor) -> Tensor:
        out = []
        for row, pads in zip(ids.tolist(), key_padding_mask.tolist(), strict=True):
            if pads[-1]:
                out.append(0.0)
                continue
            real = [t for t, p in zip(row, pads, strict=True) if not p]
            grades = list(token_grader(real))
            if len(grades) != len(real):
                raise ValueError(f"token_grader gave {len(grades)} grades for a sequence of "
                                 f"{len(real)} tokens; expected one per token")
            try:  # a number (not a bool, nor a string that float() would read), finite, >= 0
                last = check_float("grade", grades[-1], minimum=0.0)
            except ValueError:
                raise ValueError(f"token_grader graded token {real[-1]} with {grades[-1]!r}; "
                                 "expected a finite grade >= 0") from None
            out.append(last)
        return torch.tensor(out, dtype=dtype, device=ids.device)

    return grade_last


def token_grading(
    model: torch.nn.Module, input_ids: Tensor, token_grades: Tensor | None,
    token_grader: TokenGrader | None, *, grades_new_tokens: bool,
) -> tuple[Tensor | None, GradeLast | None]:
    """The checked ``token_grades`` of ``input_ids`` (a tensor, or nested lists such as
    ``Task.grade_tokens`` gives per row, as a float tensor) and the grader of new
    tokens (:func:`grader_of`) for a model that grades tokens (``TransformerConfig.
    token_grading``): it needs both, the grader only when it generates (``grades_new_tokens``).
    (None, None) for a model that does not, which refuses them."""
    if not getattr(getattr(model, "config", None), "token_grading", False):
        if token_grades is not None or token_grader is not None:
            given = "token_grades" if token_grades is not None else "token_grader"
            raise ValueError(f"{given} was given, but this model does not grade tokens "
                             "(TransformerConfig.token_grading=False)")
        return None, None
    if token_grades is None:
        raise ValueError(
            "generate is refused for a token-graded model (TransformerConfig.token_grading="
            "True) without token_grades: pass the grades of the input's tokens, shape (batch, "
            f"length) = {tuple(input_ids.shape)} (e.g. Task.grade_tokens), and a token_grader "
            "for the generated tokens")
    if not isinstance(token_grades, Tensor):  # e.g. a list of Task.grade_tokens' lists
        try:
            token_grades = torch.tensor(token_grades, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(
                f"token_grades must be a tensor or nested lists of numbers of the input's shape "
                f"(batch, length) = {tuple(input_ids.shape)}, got {token_grades!r}") from error
    if tuple(token_grades.shape) != tuple(input_ids.shape):
        raise ValueError(f"token_grades has shape {tuple(token_grades.shape)}; expected the "
                         f"input's {tuple(input_ids.shape)}")
    if grades_new_tokens and token_grader is None:
        raise ValueError(
            "generate with a token-graded model (TransformerConfig.token_grading=True) needs "
            "token_grader: a function from a sequence's token ids to their grades (e.g. "
            "Task.grade_tokens of the decoded tokens) that grades each generated token")
    if token_grader is not None and not callable(token_grader):
        raise TypeError(f"token_grader must be callable, got {type(token_grader).__name__}")
    dtype = token_grades.dtype if token_grades.is_floating_point() else torch.float32
    grade_last = None if token_grader is None else grader_of(token_grader, dtype)
    return token_grades.to(device=input_ids.device, dtype=dtype), grade_last
