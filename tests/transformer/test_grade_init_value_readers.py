"""Which grade inits read ``grade_init_value`` comes from their own entries
(``GradeInit.reads_value`` in ``GRADE_INIT_ENTRIES``): the shipped ones are unchanged, and a new
entry that declares it reads the value is accepted with one, with nothing else to edit."""

from __future__ import annotations

import re

import pytest
import torch

import graded.transformer.graded as graded_module
from graded.transformer import grading_plan
from graded.transformer.config import TransformerConfig
from graded.transformer.grading_plan import GRADE_INIT_ENTRIES, GradeInit, GradingPlan

BASE = dict(vocab_size=13, d_model=8, n_heads=2, n_layers=1, max_len=16, grading="linear")
K = torch.arange(8, dtype=torch.get_default_dtype())  # the feature grading's dimension index


@pytest.fixture
def added_init(monkeypatch):
    """Adds a grade init entry for the test (the listed names follow it); undone after."""

    def add(name: str, entry: GradeInit) -> None:
        monkeypatch.setitem(GRADE_INIT_ENTRIES, name, entry)
        names = tuple(GRADE_INIT_ENTRIES)
        monkeypatch.setattr(grading_plan, "GRADE_INITS", names)
        monkeypatch.setattr(graded_module, "GRADE_INITS", names)  # what the config validates

    return add


def _feature_grades(**fields) -> torch.Tensor | None:
    return GradingPlan(TransformerConfig(**BASE, **fields)).feature.grades


def test_the_shipped_inits_that_read_the_value_are_constant_and_warm_start():
    reads = {name: entry.reads_value for name, entry in GRADE_INIT_ENTRIES.items()}
    assert reads == {"neutral": False, "zeros": False, "constant": True, "warm_start": True}
    # the declaration agrees with the constructions: c changes the grades exactly where read
    for name, entry in GRADE_INIT_ENTRIES.items():
        a, b = entry.grades((2, 8), 0.5), entry.grades((2, 8), 0.0)
        changed = a is not None and not torch.equal(a, b)
        assert changed == entry.reads_value, name


@pytest.mark.parametrize(("init", "expected"), [("constant", torch.full((8,), 0.5)),
                                                ("warm_start", 0.5 * K)])
def test_an_init_that_reads_the_value_takes_it(init, expected):
    assert torch.equal(_feature_grades(grade_init=init, grade_init_value=0.5), expected)


@pytest.mark.parametrize("init", ["neutral", "zeros"])
def test_an_init_that_reads_no_value_refuses_one_naming_the_readers(init):
    with pytest.raises(ValueError, match=re.escape(
            f"TransformerConfig.grade_init_value=0.5 is invalid: expected its default 0.0 (or "
            f"left out): grade_init={init!r} reads no value; the grade inits that read it: "
            f"'constant', 'warm_start'")):
        TransformerConfig(**BASE, grade_init=init, grade_init_value=0.5)
    assert TransformerConfig(**BASE, grade_init=init).grade_init_value == 0.0


def test_a_new_init_declaring_it_reads_the_value_is_accepted_with_one(added_init):
    # q_k = c·(k + 1): a ramp that starts at c rather than 0
    added_init("ramp", GradeInit(lambda shape, c: torch.full(shape, c).cumsum(-1),
                                 reads_value=True))
    assert torch.equal(_feature_grades(grade_init="ramp", grade_init_value=0.5),
                       0.5 * (K + 1))
    with pytest.raises(ValueError, match=r"grade_init='zeros' reads no value; the grade inits "
                                         r"that read it: 'constant', 'warm_start', 'ramp'$"):
        TransformerConfig(**BASE, grade_init="zeros", grade_init_value=0.5)


def test_a_new_init_declaring_no_value_refuses_one(added_init):
    added_init("ones", GradeInit(lambda shape, c: torch.ones(shape)))
    assert torch.equal(_feature_grades(grade_init="ones"), torch.ones(8))
    with pytest.raises(ValueError, match=r"grade_init='ones' reads no value"):
        TransformerConfig(**BASE, grade_init="ones", grade_init_value=0.5)


def test_the_added_init_is_gone_after_its_test():
    assert "ramp" not in GRADE_INIT_ENTRIES and "ones" not in GRADE_INIT_ENTRIES
    assert graded_module.GRADE_INITS == ("neutral", "zeros", "constant", "warm_start")
