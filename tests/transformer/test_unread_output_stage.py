"""A classifier or regressor pools its tokens before its output layer, so per-token grading has
no token to act on there: a run config that lists the "output" stage for one is refused,
naming the value and the stages the model reads (which tokens reach). Which models read which
stages: the LM and the seq2seq decoder grade their output tokens (their heads take the token
scales), the encoder classifier does not (its head gets the pooled vector alone)."""

from __future__ import annotations

import re

import pytest
import torch

from graded.config import ConfigError, validate_config
from graded.transformer import TransformerClassifier, TransformerConfig, TransformerLM

GRADED = {"grading": "exponential", "token_grading": True, "d_model": 16, "n_heads": 2,
          "n_layers": 1}
ALL = ["input", "ffn", "output"]


@pytest.mark.parametrize(("task", "kind"), [("listops", "classification"),
                                            ("polynomial_regression", "regression")])
@pytest.mark.parametrize("stages", [ALL, ["output"], ["ffn", "output"]])
def test_a_pooling_models_output_stage_is_refused_naming_the_value_and_the_stages_it_reads(
        task, kind, stages):
    base = {"task": {"name": task, "n_train": 16, "n_eval": 8}}
    expected = (rf"model\.token_grade_stages: got {re.escape(repr(stages))}; task '{task}' is "
                rf"'{kind}', whose model \(TransformerClassifier\) grades tokens at the stages "
                r"\['input', 'ffn'\] only: its output layer reads the pooled vector, which has "
                r"no token grade, so the 'output' stage would change nothing; expected a list "
                r"from \['input', 'ffn'\] \(or leave it out\)")
    with pytest.raises(ConfigError, match=expected):
        validate_config({**base, "model": {**GRADED, "token_grade_stages": stages}})
    # the stages it reads, and the default (every stage the model has), are accepted
    validate_config({**base, "model": {**GRADED, "token_grade_stages": ["input", "ffn"]}})
    validate_config({**base, "model": GRADED})


def test_stages_given_as_a_tuple_are_read_as_the_list_the_model_config_takes():
    """A config built in Python may give the stages as a tuple, which the model config takes
    as its list: ("input", "output") for a classifier was accepted, the 'output' stage
    doing nothing."""
    base = {"task": {"name": "listops", "n_train": 16, "n_eval": 8}}
    with pytest.raises(ConfigError, match=r"model\.token_grade_stages: got \('input', 'output'\);"
                                          r" task 'listops' is 'classification'"):
        validate_config({**base, "model": {**GRADED, "token_grade_stages": ("input", "output")}})
    cfg = validate_config({**base, "model": {**GRADED, "token_grade_stages": ("input", "ffn")}})
    assert cfg.built_model_config.token_grade_stages == ["input", "ffn"]


@pytest.mark.parametrize("task", ["dyck", "polynomials_seq2seq"])
def test_models_with_output_tokens_take_the_output_stage(task):
    cfg = validate_config({"task": {"name": task},
                           "model": {**GRADED, "token_grade_stages": ALL}})
    assert cfg.built_model_config.token_grade_stages == ALL


def _config(stages: list[str], **extra) -> TransformerConfig:
    return TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, max_len=6,
                             grading="exponential", grade_init="warm_start",
                             grade_init_value=0.5, token_grading=True,
                             token_grade_stages=stages, **extra)


def test_the_output_stage_changes_nothing_in_a_classifier_and_changes_an_lms_logits():
    """The independent side of the refusal: a classifier with and without the "output" stage,
    from one seed, gives the same outputs; an LM's logits differ (its head applies
    M_{q_i} to each token)."""
    ids = torch.randint(0, 11, (2, 5))
    grades = torch.randint(0, 4, (2, 5))
    outs = {}
    for name, build in (("classifier", lambda c: TransformerClassifier(c, 3)),
                        ("lm", TransformerLM)):
        for stages in (ALL, ["input", "ffn"]):
            torch.manual_seed(0)
            model = build(_config(stages)).eval()
            with torch.no_grad():
                outs[name, len(stages)] = model(ids, token_grades=grades)
    torch.testing.assert_close(outs["classifier", 3], outs["classifier", 2], rtol=0, atol=0)
    assert not torch.allclose(outs["lm", 3], outs["lm", 2])
