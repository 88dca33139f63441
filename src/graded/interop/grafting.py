"""Grading grafted onto a pretrained model: the LGT or EGT (000 §5-6) with its weights and
neutral grades (M = I), so that fine-tuning with learnable grades starts from the pretrained
function itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from graded._precision import at_least_float32
from graded.grading import GradingMap
from graded.interop._common import _GRADING_FIELDS
from graded.transformer import Seq2SeqTransformer, TransformerLM
from graded.transformer.models import TransformerEncoder

__all__ = ["graft_grading"]


_GRAFTABLE = (TransformerLM, TransformerEncoder, Seq2SeqTransformer)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Tensors made without a dtype are ``dtype`` inside the block. A grading's initial grades
    (the neutral log(e − 1) of softplus, a ``grade_init_value``) are made so: built in float32
    and cast, a float64 model's softplus scales were 1 − 4.5e-10, not 1 to float64 rounding.
    Half precision models are still built in float32 and rounded once (``at_least_float32``)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def graft_grading(lm: nn.Module, grading: str, **options: Any) -> nn.Module:
    """An LGT (``grading="linear"``) or EGT (``"exponential"``) with ``lm``'s weights and
    neutral grades (M = I), so that it computes the same outputs until its grades move.
    ``lm`` is a :class:`TransformerLM`, a :class:`TransformerEncoder` (as :func:`from_bert`
    builds) or a :class:`~graded.Seq2SeqTransformer`, ungraded (a graded one is refused: its
    grades, loaded into the new grading, would make it neither neutral nor ``lm``'s function);
    the graded model is of the same class.

    ``options`` are the other grading fields of :class:`TransformerConfig`
    (``learnable_grades``, ``grade_attention_variant``, ``grade_ffn``, ...); ``grade_init``
    other than ``"neutral"`` or ``grade_normalize`` change the function on purpose. Any other
    field would change the architecture the weights belong to and is refused.

    Which weights train is kept too: a parameter frozen in ``lm`` (``requires_grad=False``) is
    frozen in the graded model, and an embedding's ``padding_idx`` (its row without gradient)
    is kept, as :func:`~graded.interop.from_marian` sets them; so are the converted model's
    ``generation_options`` (the reference's generation config, e.g. Marian's).
    """
    if not isinstance(lm, _GRAFTABLE):
        raise TypeError(f"expected one of {[cls.__name__ for cls in _GRAFTABLE]}, got "
                        f"{type(lm).__name__}")
    if grading not in ("linear", "exponential"):  # None would give back an ungraded copy
        raise ValueError(f"graft_grading: grading must be 'linear' (LGT) or 'exponential' "
                         f"(EGT), got {grading!r}")
    if lm.config.grading is not None:  # its grades would be loaded as the new grading's
        raise ValueError(
            f"graft_grading: the model is already graded (TransformerConfig.grading="
            f"{lm.config.grading!r}); expected an ungraded model: its grades would be read as "
            f"the grades of the {grading!r} grading, which then computes neither the model's "
            "function nor the pretrained one (graft onto the model before grading)")
    not_grading = sorted(set(options) - _GRADING_FIELDS)
    if not_grading:
        raise ValueError(f"graft_grading sets grading fields only; got {not_grading}, expected "
                         f"names among {sorted(_GRADING_FIELDS)}")
    config = lm.config.replace(grading=grading, **options)
    weight = next(lm.parameters())
    with _default_dtype(at_least_float32(weight.dtype)):  # float64 grades for a float64 model
        graded = type(lm)(config).to(device=weight.device, dtype=weight.dtype)
    missing, unexpected = graded.load_state_dict(lm.state_dict(), strict=False)
    grading_maps = {name for name, m in graded.named_modules(remove_duplicate=False)
                    if isinstance(m, GradingMap)}
    not_grading = [k for k in missing if k.rpartition(".")[0] not in grading_maps]
    if unexpected or not_grading:
        raise ValueError(f"the model's weights do not fit its graded form: unexpected "
                         f"{unexpected}, missing {not_grading}")
    params = dict(graded.named_parameters(remove_duplicate=False))
    for name, p in lm.named_parameters(remove_duplicate=False):
        params[name].requires_grad_(p.requires_grad)
    modules = dict(graded.named_modules())
    for name, m in lm.named_modules():
        if isinstance(m, nn.Embedding):
            modules[name].padding_idx = m.padding_idx
    if hasattr(lm, "generation_options"):
        graded.generation_options = dict(lm.generation_options)
    return graded.train(lm.training)
