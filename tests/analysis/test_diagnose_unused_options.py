"""``diagnose`` refuses an option that would have no effect, naming it and the setting that uses
it: ``alphas`` and ``k`` set the positional sweep only, ``grade_records`` a plot in ``out_dir``."""

from __future__ import annotations

import pytest
import torch
from analysis_helpers import tiny_config
from torch import nn

from graded import TransformerLM
from graded.analysis import diagnose

FAST = dict(lipschitz_steps=1, n_random=1)


def _forward_counter(model: nn.Module) -> list[int]:
    calls = [0]
    model.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize(("options", "named"), [
    (dict(alphas=[0.0, 0.1]), r"alphas=\[0\.0, 0\.1\] sets"),
    (dict(k=2), r"k=2 sets"),
    (dict(alphas=[0.0], k=2), r"alphas=\[0\.0\] and k=2 set"),
])
@pytest.mark.parametrize(("config", "inputs", "why"), [
    (dict(), (3, 7), r"TransformerLM is not graded \(its config has no grading\)"),
    (dict(grading="linear", positional="rope"), (3, 7),
     r"the model's positional='rope' is not an additive table; the sweep runs for positional "
     r"in \('sinusoidal', 'sinusoidal1', 'learned'\)"),
    (dict(grading="linear"), (3, 1), r"the inputs have 1 position, and the sweep needs at least "
                                     r"two"),
])
def test_sweep_options_without_the_sweep_are_refused_naming_them_and_why(options, named,
                                                                        config, inputs, why):
    # they were dropped without a word: the report had no positional/... metrics and the caller
    # no hint that the α values or k asked for were never used
    model = TransformerLM(tiny_config(**config))
    forwards = _forward_counter(model)
    ids = torch.randint(0, 11, inputs, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=named + r" the positional sweep, which does not run "
                                         r"here: " + why):
        diagnose(model, ids, **options, **FAST)
    assert forwards[0] == 0  # refused before any diagnostic runs


def test_without_them_the_same_models_are_diagnosed_without_a_sweep():
    ids = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(0))
    for model in (TransformerLM(tiny_config()),
                  TransformerLM(tiny_config(grading="linear", positional="rope"))):
        metrics = diagnose(model, ids, **FAST).metrics
        assert not any(key.startswith("positional/") for key in metrics)


def test_sweep_options_with_the_sweep_are_used():
    model = TransformerLM(tiny_config(grading="linear"))
    ids = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(0))
    metrics = diagnose(model, ids, alphas=[0.0, 0.1], k=2, **FAST).metrics
    assert {key for key in metrics if key.startswith("positional/early_mass")} == {
        "positional/early_mass/alpha=0", "positional/early_mass/alpha=0.1"}


def test_grade_records_without_out_dir_are_refused(tmp_path):
    # the trajectory plot is the only use of grade_records, and it is written to out_dir
    model = TransformerLM(tiny_config(grading="linear"))
    ids = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"grade_records is drawn as the grade trajectory plot, "
                                         r"which is written only with out_dir"):
        diagnose(model, ids, grade_records=[{"step": 0}], **FAST)
