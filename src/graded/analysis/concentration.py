"""Feature concentration of a grading (000 Lemma 5.7, Thm 5.10 Eq. 38; EGT: Lemma 6.7).

000 Lemma 5.7 says that M_q x "suppresses low-grade features by O(q_j/q_max)" and
"concentrates mass on high-grade dimensions"; its proof claims that the relative
contribution of component j satisfies

    c_j = s_j |x_j| / ‖M x‖ ≤ (s_j / s_max) · |x_j| / ‖x‖        (s = diag M).

That inequality needs ‖M x‖ ≥ s_max‖x‖, the reverse of Lemma 5.5 (iii) ‖M x‖ ≤ s_max‖x‖, so it
fails for most x (it holds with equality only when x lives on the top-scale features). We
measure both the concentration and the stated inequality:

- ``high_grade_share``: Σ_{i∈top} (s_i x_i)² / ‖M x‖², the share of the squared norm in the
  high-grade features top = {i : q_i ≥ q_max − δ} (the d_eff set of Thm 5.10, Eq. 38), against
  ``ungraded_share`` Σ_{i∈top} x_i² / ‖x‖² of the same vectors;
- ``lemma_bound_fraction``: the fraction of (vector, j) with q_j < q_max where the inequality
  above holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from graded.analysis._common import Inputs, eval_mode, real_tokens, run_model
from graded.analysis.capture import embedding_perturbation
from graded.analysis.lipschitz import _input_perturbation
from graded.checks import check_finite, check_float
from graded.transformer.graded import GradedFeatures, feature_grading
from graded.transformer.models import InputEmbedding

__all__ = ["FeatureConcentration", "feature_concentration", "model_feature_concentration"]


@dataclass
class FeatureConcentration:
    """See the module docstring. ``d_eff`` = |top|, ``dim`` = d."""

    d_eff: int
    dim: int
    high_grade_share: float
    ungraded_share: float
    lemma_bound_fraction: float

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


def feature_concentration(x: Tensor, scales: Tensor, grades: Tensor,
                          delta: float = 0.0) -> FeatureConcentration:
    """Concentration of vectors ``x`` (..., d) under the grading with diagonal ``scales`` (d,)
    and grades ``grades`` (d,); vectors with x = 0 or M x = 0 are skipped. All three must be
    finite."""
    if scales.dim() != 1 or grades.shape != scales.shape or x.shape[-1] != scales.shape[0]:
        raise ValueError(
            f"need x (..., d) with scales and grades of shape (d,); got x {tuple(x.shape)}, "
            f"scales {tuple(scales.shape)}, grades {tuple(grades.shape)}"
        )
    delta = check_float("delta", delta, minimum=0)
    for name, t in (("x", x), ("scales", scales), ("grades", grades)):
        check_finite(t, name)  # a NaN vector would fail the norm tests below and drop out
    x = x.detach().to(torch.float64).reshape(-1, x.shape[-1])
    s = scales.detach().to(torch.float64)
    q = grades.detach().to(torch.float64)
    # a vector that is zero, or that the grading maps to zero (a zero scale), has no shares
    x = x[(torch.linalg.vector_norm(x, dim=-1) > 0)
          & (torch.linalg.vector_norm(x * s, dim=-1) > 0)]
    if x.shape[0] == 0:
        raise ValueError("feature_concentration needs at least one vector x with M x ≠ 0")
    q_max = q.max()
    top = q >= q_max - delta
    mx = x * s
    mx_sq = mx.pow(2)
    graded_share = mx_sq[:, top].sum(-1) / mx_sq.sum(-1)
    plain_share = x.pow(2)[:, top].sum(-1) / x.pow(2).sum(-1)
    low = q < q_max
    if bool(low.any()):
        c = mx.abs() / torch.linalg.vector_norm(mx, dim=-1, keepdim=True)
        bound = (s / s.max()) * x.abs() / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        holds = (c <= bound + 1e-12)[:, low]
        fraction = float(holds.to(torch.float64).mean())
    else:
        fraction = float("nan")
    return FeatureConcentration(int(top.sum()), int(s.shape[0]), float(graded_share.mean()),
                                float(plain_share.mean()), fraction)


@torch.no_grad()
def model_feature_concentration(model: nn.Module, inputs: Inputs, *, delta: float = 0.0,
                                **model_kwargs: object) -> FeatureConcentration:
    """:func:`feature_concentration` of the model's input vectors under the grading 000 Def
    5.19 applies to them: for a token model the first token embedding's output under the
    feature grading; for a model over real features (``config.vocab_size`` None) the raw
    features under the input grading, which acts on them before the projection (the
    projection's output is graded already, and has another dimension); with a
    ``key_padding_mask``, of the real tokens' vectors only (a batch of padding only has none:
    its shares and fraction are NaN, the mean of nothing, as the other diagnostics' means
    over no real query)."""
    grading, features = measured_grading(model)
    if grading is None and getattr(getattr(model, "config", None), "grading", None) is not None:
        kind = "real features" if features else "tokens"
        vectors = "raw features" if features else "token embeddings"
        raise ValueError(f"{type(model).__name__} is a graded model over {kind} without an "
                         f"input grading (config.grade_input is False): its {vectors}, which "
                         "000 Def 5.19 grades, are not graded in this model, so there is no "
                         "grading of them to measure")
    if grading is None:
        raise ValueError(f"{type(model).__name__} has no feature grading: build it with "
                         "TransformerConfig(grading='linear' or 'exponential')")
    if grading.grades.dim() != 1:
        raise ValueError("feature concentration needs shared feature grades of shape (d,)")
    perturbation = _input_perturbation(model) if features else embedding_perturbation(model)
    with eval_mode(model), perturbation as slot:
        run_model(model, inputs, **model_kwargs)
    x = slot["clean"]
    real = real_tokens(model, inputs, model_kwargs, x)  # padded: the real tokens only
    if real is not None and not bool(real.any()):
        delta = check_float("delta", delta, minimum=0)
        grades = grading.grades.detach()
        top = int((grades >= grades.max() - delta).sum())
        nan = float("nan")
        return FeatureConcentration(top, int(grades.shape[0]), nan, nan, nan)
    return feature_concentration(x if real is None else x[real], grading.scales(),
                                 grading.grades, delta)


def measured_grading(model: nn.Module) -> tuple[nn.Module | None, bool]:
    """The grading :func:`model_feature_concentration` measures (None when the model has
    none), and whether the model is over real features: the input grading (000 Def 5.19) of
    the model's input vectors, a token model's token embeddings (its feature grading) or the
    raw features of a model over real features. A model whose input stage is not graded
    (``grade_input=False``) has none: its feature grading acts on the feed-forward and output
    stages only, never on the vectors measured."""
    embed = next((m for m in model.modules() if isinstance(m, InputEmbedding)), None)
    if embed is None:  # not a graded.transformer model: its feature grading, if any
        return feature_grading(model), False
    stage = embed.input_grading
    return ((stage.grading if isinstance(stage, GradedFeatures) else None),
            embed.config.vocab_size is None)
