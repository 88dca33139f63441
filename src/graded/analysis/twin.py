"""The ungraded twin of a graded model: the same weights with every grading made neutral.

000 §5-6 compare a graded model Ψ_q = T ∘ φ_q with the standard transformer T. With the
weights fixed, T is the same model with M = I in every stage: neutral grades (q = 0 for EGT
and for LGT's "shift"/"abs_shift", q = 1 for "identity", softplus⁻¹(1) for "softplus"), no
position grading (α = 0) and no normalisation of the graded stages. By the core's guarantee
(SPEC C5: "with q = 0 (EGT) or f(q) = 1 (LGT) every graded model equals its ungraded twin")
this is exactly the ungraded model with the same weights.
"""

from __future__ import annotations

import copy

from torch import nn

from graded.grading import ExponentialGrading, LinearGrading
from graded.transformer.graded import GradedFeatures, gradings
from graded.transformer.models import InputEmbedding

__all__ = ["neutral_grade", "ungraded_twin"]


def neutral_grade(grading: nn.Module) -> float:
    """The grade whose scale is 1 for this grading map (``GradingMap.neutral``)."""
    if isinstance(grading, (ExponentialGrading, LinearGrading)):
        return grading.neutral
    raise TypeError(f"expected a LinearGrading or ExponentialGrading, got "
                    f"{type(grading).__name__}")


def ungraded_twin(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every grading neutral (M = I), the graded positions
    removed and graded-stage normalisation off. An ungraded model is copied unchanged."""
    twin = copy.deepcopy(model)
    for grading in gradings(twin).values():
        grading.set_grades(grading.grades.detach().clone().fill_(neutral_grade(grading)))
    for m in twin.modules():
        if isinstance(m, InputEmbedding):
            m.position_grading = None
        if isinstance(m, GradedFeatures):
            m.normalize = False
    return twin
