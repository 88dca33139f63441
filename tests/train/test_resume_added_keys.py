"""Keys added to the run config after runs were recorded: a recorded config without one reads as
the default it was added with (graded.train.runs.ADDED_KEYS), so such a run resumes with the
default and is refused a different value of a key that cannot change."""

from __future__ import annotations

import pytest

from graded.config import RunConfig, TaskSection
from graded.train.options import TrainOptions
from graded.train.runs import (
    ADDED_KEYS,
    RunError,
    checked_changes,
    refusal_message,
    resume_changes,
)

RECORDED = {"task": {"name": "dyck", "split": "random", "n_train": 64},  # before task.unseen
            "train": {"steps": 4, "batch_size": 16}}  # before train.precision, train.compile


def _now(*, unseen: bool, precision: str = "fp32") -> dict:
    return {"task": {**RECORDED["task"], "unseen": unseen},
            "train": {**RECORDED["train"], "precision": precision, "compile": False}}


def test_a_run_recorded_before_task_unseen_resumes_with_the_default():
    assert resume_changes(RECORDED, _now(unseen=True)) == ({}, {})
    # and the other way round: a config without the key against one that records the default
    assert resume_changes(_now(unseen=True), RECORDED) == ({}, {})


def test_task_unseen_false_against_a_recorded_absent_or_true_is_refused_naming_the_key():
    for recorded in (RECORDED, _now(unseen=True)):
        allowed, refused = resume_changes(recorded, _now(unseen=False))
        assert allowed == {} and refused == {"task.unseen": (True, False)}
        message = refusal_message("RUN", refused)
        assert "task.unseen was true, now false" in message
    # a run recorded with unseen: false resumes only with false
    assert resume_changes(_now(unseen=False), _now(unseen=False)) == ({}, {})
    assert resume_changes(_now(unseen=False), RECORDED)[1] == {"task.unseen": (False, True)}
    state = {"config": RECORDED, "options": RECORDED["train"], "seed": 0, "kind": "lm"}
    now = {**_now(unseen=False), "seed": 0, "kind": "lm"}
    with pytest.raises(RunError, match=r"cannot resume RUN .*task\.unseen was true, now false"):
        checked_changes("RUN", state, now)


def test_train_precision_added_later_is_compared_as_its_default():
    assert resume_changes(RECORDED, _now(unseen=True, precision="fp32")) == ({}, {})
    refused = resume_changes(RECORDED, _now(unseen=True, precision="bf16"))[1]
    assert refused == {"train.precision": ("fp32", "bf16")}


def test_a_key_absent_on_both_sides_or_not_in_the_table_is_unchanged_by_the_rule():
    python_run = {"kind": "lm", "model": {"d_model": 16}, "train": {"steps": 4}}
    assert resume_changes(python_run, python_run) == ({}, {})  # no task section: nothing added
    refused = resume_changes({"model": {}}, {"model": {"x": 1}})[1]
    assert refused == {"model.x": ("absent", 1)}


@pytest.mark.parametrize("key", sorted(ADDED_KEYS))
def test_each_added_key_stands_for_the_schema_default(key):
    section, name = key.split(".")
    model = {"task": TaskSection, "train": TrainOptions,
             "output": RunConfig.model_fields["output"].annotation}[section]
    assert model.model_fields[name].default == ADDED_KEYS[key]
