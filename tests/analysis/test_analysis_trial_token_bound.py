"""The bound factors of a model that grades tokens (000 §6.2) use the scales of the call's
token grades: diag(M)·M_{q_i} with q_i = s_i·p, not the profile p alone (the grades s_i = 1)."""

from __future__ import annotations

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import lipschitz_bound_factors, model_lipschitz


def _token_model() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(tiny_config(n_layers=1, grading="exponential", token_grading=True,
                                     grade_init="warm_start", grade_init_value=0.25))


def _largest_stage_scale(model: TransformerLM, grades: torch.Tensor) -> float:
    """max_{i,k} λ^{q_k}·λ^{s_i p_k} by hand, from the model's own grades and base."""
    embed = model.decoder.embed.input_grading.grading
    profile = model.decoder.token_grading.profile
    lam = float(embed.base)
    q = embed.grades.detach().double()
    p = profile.grades.detach().double()
    s = grades.double().reshape(-1, 1)
    return float((lam ** q * lam ** (s * p)).max())


@pytest.mark.parametrize("grade", [0.0, 4.0])
def test_bound_factors_use_the_scales_of_the_calls_token_grades(grade):
    model = _token_model()
    grades = torch.full((2, 5), grade)
    grades[0, 0] = 0.0
    s = _largest_stage_scale(model, grades)
    f = lipschitz_bound_factors(model, token_grades=grades)
    assert f["max_scale"] == pytest.approx(s, rel=1e-6)
    assert f["prop_5_12_factor"] == pytest.approx(s ** (1 * 2 + 3), rel=1e-5)
    x = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    out = model_lipschitz(model, x, token_grades=grades, n_random=1, steps=0)
    assert out["max_scale"] == pytest.approx(s, rel=1e-6)


def test_bound_factors_of_a_token_graded_model_need_its_token_grades():
    with pytest.raises(ValueError, match="token_grades"):
        lipschitz_bound_factors(_token_model())
