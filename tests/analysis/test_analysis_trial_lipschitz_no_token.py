"""The Lipschitz estimate of a batch of padding only: no real token to perturb, so no estimate
(NaN, as the other diagnostics' means over no real query), not an adversarial ratio of 0 and a
graded/ungraded ratio of inf."""

from __future__ import annotations

import math

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import empirical_lipschitz, model_lipschitz
from graded.transformer.models import TransformerClassifier

ESTIMATES = ("random_max", "random_mean", "adversarial", "estimate")


@pytest.mark.parametrize("kind", ["lm", "classifier"])
def test_model_lipschitz_of_a_batch_of_padding_only_is_nan(kind):
    torch.manual_seed(0)
    config = tiny_config(grading="exponential")
    model = TransformerLM(config) if kind == "lm" else TransformerClassifier(config, 3)
    ids = torch.randint(0, 11, (2, 4))
    out = model_lipschitz(model, ids, n_random=2, steps=2,
                          key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    for label in ("graded", "ungraded"):
        for name in ESTIMATES:
            assert math.isnan(out[f"{label}/{name}"]), (label, name, out[f"{label}/{name}"])
    assert math.isnan(out["ratio"]) and math.isnan(out["epsilon"])
    assert out["max_scale"] > 0  # the bound factors do not depend on the batch


def test_model_lipschitz_checks_its_counts_where_no_token_is_measured():
    model = TransformerLM(tiny_config())
    ids = torch.randint(0, 11, (1, 3))
    pad = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"n_random must be >= 0, got -1"):
        model_lipschitz(model, ids, n_random=-1, key_padding_mask=pad)
    with pytest.raises(ValueError, match=r"relative_epsilon must be > 0(\.0)?, got 0"):
        model_lipschitz(model, ids, relative_epsilon=0, key_padding_mask=pad)


def test_empirical_lipschitz_refuses_a_point_without_entries():
    with pytest.raises(ValueError, match=r"x must have at least one entry to perturb, got "
                                         r"shape \(0, 3\)"):
        empirical_lipschitz(lambda v: 2 * v, torch.zeros(0, 3))


def test_lipschitz_under_inference_mode_names_the_way_out():
    """torch.inference_mode turns autograd off for good (enable_grad does not undo it): the
    ascent failed with 'element 0 of tensors does not require grad'."""
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="exponential"))
    ids = torch.randint(0, 11, (2, 4))
    message = (r"the adversarial Lipschitz estimate \({}=2\) takes gradients, which "
               r"torch.inference_mode\(\) turns off: call it outside inference mode "
               r"\(torch.no_grad\(\) is fine\), or with {}=0")
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match=message.format("steps", "steps")):
            model_lipschitz(model, ids, n_random=1, steps=2)
        with pytest.raises(RuntimeError, match=message.format("steps", "steps")):
            empirical_lipschitz(lambda v: 2 * v, torch.ones(3), n_random=1, steps=2)
        from graded.analysis import diagnose
        with pytest.raises(RuntimeError, match=message.format("lipschitz_steps",
                                                              "lipschitz_steps")):
            diagnose(model, ids, lipschitz_steps=2, n_random=1)
        random_only = model_lipschitz(model, ids, n_random=2, steps=0)
    with torch.no_grad():  # the random directions need no gradient: the same numbers
        assert model_lipschitz(model, ids, n_random=2, steps=0) == random_only
