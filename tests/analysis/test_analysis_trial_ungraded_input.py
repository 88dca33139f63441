"""Feature concentration measures the input vectors under the grading the model applies to
them (000 Def 5.19). A token model with ``grade_input=False`` never grades its embeddings, so
it is refused (as a model over real features is) and ``diagnose`` reports no concentration;
with ``grade_input=True`` the value is the share by hand."""

from __future__ import annotations

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import diagnose, model_feature_concentration
from graded.analysis.capture import embedding_perturbation


def _model(grade_input: bool) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                     grade_init_value=0.3, grade_input=grade_input))


def test_a_token_model_whose_input_is_not_graded_has_no_concentration_to_measure():
    model = _model(grade_input=False)
    x = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"over tokens without an input grading \(config"
                                         r"\.grade_input is False\)"):
        model_feature_concentration(model, x)
    report = diagnose(model, x, n_random=1, lipschitz_steps=0)
    assert not any(key.startswith("concentration/") for key in report.metrics)


def test_concentration_of_a_graded_input_is_the_share_by_hand():
    model = _model(grade_input=True).eval()
    x = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), embedding_perturbation(model) as slot:
        model(x)
    grading = model.decoder.embed.input_grading.grading
    q, s = grading.grades.detach().double(), grading.scales().detach().double()
    mx = (slot["clean"].double() * s).reshape(-1, q.shape[0]).pow(2)
    top = q == q.max()
    share = float((mx[:, top].sum(-1) / mx.sum(-1)).mean())
    assert model_feature_concentration(model, x).high_grade_share == pytest.approx(share)
