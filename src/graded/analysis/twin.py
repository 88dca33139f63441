"""The ungraded twin of a graded model: the same weights with every grading made neutral.

000 §5-6 compare a graded model Ψ_q = T ∘ φ_q with the standard transformer T. With the
weights fixed, T is the same model with M = I in every stage: neutral grades (q = 0 for EGT
and for LGT's "shift"/"abs_shift", q = 1 for "identity", softplus⁻¹(1) for "softplus"), no
position grading (α = 0), no normalisation of the graded stages and none of the graded
positions (000 Eq. 48's z/‖z‖, ``grade_position_normalize``). By the core's guarantee
(SPEC C5: "with q = 0 (EGT) or f(q) = 1 (LGT) every graded model equals its ungraded twin")
this is exactly the ungraded model with the same weights.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from graded.analysis._common import check_materialised
from graded.grading import ExponentialGrading, LinearGrading
from graded.transformer.graded import GradedFeatures, TokenGrading, gradings
from graded.transformer.models import InputEmbedding

__all__ = ["neutral_grade", "ungraded_twin"]


def neutral_grade(grading: nn.Module) -> float:
    """The grade whose scale is 1 for this grading map (``GradingMap.neutral``)."""
    if isinstance(grading, (ExponentialGrading, LinearGrading)):
        return grading.neutral
    raise TypeError(f"expected a LinearGrading or ExponentialGrading, got "
                    f"{type(grading).__name__}")


class _IdentityTokenGrading(TokenGrading):
    """The per-token grading of the ungraded twin: M_{q_i} = I whatever the token's grade
    (checked as :class:`TokenGrading` checks it). A neutral profile p is not enough: q_i =
    s_i·p with LGT's softplus has f(s_i·p) = 1 for no p at every s_i (f(0) = ln 2)."""

    def forward(self, token_grades: Tensor, batch: int, length: int) -> Tensor:
        return torch.ones_like(super().forward(token_grades, batch, length))


def ungraded_twin(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every grading neutral (M = I), per-token grading the
    identity (:class:`_IdentityTokenGrading`), the graded positions removed (with their
    normalisation z/‖z‖, 000 Eq. 48) and graded-stage normalisation off. An ungraded model
    is copied unchanged."""
    check_materialised(model)  # its grades have no values to make neutral
    twin = copy.deepcopy(model)
    for name, m in list(twin.named_modules()):
        if isinstance(m, TokenGrading) and not isinstance(m, _IdentityTokenGrading):
            parent, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(parent), attr, _IdentityTokenGrading(m.profile))
    for grading in gradings(twin).values():
        grading.set_grades(grading.grades.detach().clone().fill_(neutral_grade(grading)))
    for m in twin.modules():
        if isinstance(m, InputEmbedding):
            m.position_grading = None
            m.position_normalize = False  # 000 Eq. 48's z/‖z‖ belongs to the graded positions
        if isinstance(m, GradedFeatures):
            m.normalize = False
    return twin
