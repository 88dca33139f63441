"""A name listed in a choice's constant but not built by its constructor is refused as such
(listed, no construction, where to add it), not as an unknown name whose list contains it; an
unknown name is refused with the constant's current names."""

from __future__ import annotations

import pytest

import graded.transformer.graded as graded_module
from graded.attention import scores
from graded.transformer import grading_plan
from graded.transformer.config import TransformerConfig
from graded.transformer.graded import GradingPlan

BASE = dict(vocab_size=13, d_model=8, n_heads=2, n_layers=1, max_len=16, grading="linear")


def test_a_score_listed_without_its_construction_says_so(monkeypatch):
    monkeypatch.setattr(scores, "SCORES", (*scores.SCORES, "cosine"))
    with pytest.raises(NotImplementedError) as err:
        scores.make_score("cosine", num_heads=2, head_dim=4)
    message = str(err.value)
    assert "'cosine' is listed in graded.attention.scores.SCORES" in message
    assert "make_score has no construction for it" in message
    assert "graded/attention/scores.py" in message
    assert "unknown" not in message


def test_an_unknown_score_is_refused_with_the_current_list(monkeypatch):
    monkeypatch.setattr(scores, "SCORES", (*scores.SCORES, "cosine"))
    with pytest.raises(ValueError, match=r"unknown attention score 'cosin'; expected one of "
                                         r"\('scaled_dot', 'dot', 'bilinear', 'additive', "
                                         r"'cosine'\) or a Score"):
        scores.make_score("cosin", num_heads=2, head_dim=4)


def test_a_grade_init_listed_without_its_construction_says_so(monkeypatch):
    inits = (*grading_plan.GRADE_INITS, "orthogonal")
    monkeypatch.setattr(grading_plan, "GRADE_INITS", inits)
    monkeypatch.setattr(graded_module, "GRADE_INITS", inits)  # what the config validates against
    config = TransformerConfig(**BASE, grade_init="orthogonal")
    with pytest.raises(NotImplementedError) as err:
        GradingPlan(config)
    message = str(err.value)
    assert "grade_init='orthogonal' is listed in graded.transformer.grading_plan.GRADE_INITS" \
        in message
    assert "_initial_grades has no construction for it" in message
    assert "graded/transformer/grading_plan.py" in message
    assert "invalid" not in message


def test_an_unknown_grade_init_is_refused_with_the_current_list(monkeypatch):
    """A grade_init that reached _initial_grades unvalidated (set without the config's check)
    is refused naming every init of GRADE_INITS, an added one included."""
    monkeypatch.setattr(grading_plan, "GRADE_INITS", (*grading_plan.GRADE_INITS, "orthogonal"))
    config = TransformerConfig(**BASE)
    object.__setattr__(config, "grade_init", "warm")
    with pytest.raises(ValueError, match=r"grade_init='warm' is invalid: expected one of "
                                         r"'neutral', 'zeros', 'constant', 'warm_start', "
                                         r"'orthogonal'$"):
        GradingPlan(config)
