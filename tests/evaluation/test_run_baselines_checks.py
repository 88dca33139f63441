"""Baselines beside a model: the dataset checks of run_baselines and baseline_report."""

import pytest
import torch

from graded.evaluation.metrics import compute_metric
from graded.kinds import baseline_report, run_baselines
from graded.tasks.base import TaskDataset


def _data(kind, metric="accuracy", n=8):
    info = {"metric": metric} if metric else {}
    return TaskDataset({"inputs": torch.zeros(n, 1, 2), "targets": torch.arange(n) % 2},
                       task="t", kind=kind, info=info)


@pytest.mark.parametrize("fn", [run_baselines, baseline_report])
def test_train_and_test_of_different_kinds_are_refused(fn):
    with pytest.raises(ValueError, match=r"train and test kinds differ: 'classification' vs "
                                         r"'regression'"):
        fn(_data("classification"), _data("regression"))


def test_a_metric_is_needed():
    with pytest.raises(ValueError, match=r"no metric given and the dataset does not name one"):
        run_baselines(_data("classification", metric=None), _data("classification", metric=None))


def test_an_explicit_metric_is_used_when_the_dataset_names_none():
    train, test = _data("classification", metric=None), _data("classification", metric=None)
    scores = run_baselines(train, test, metric="accuracy")
    assert scores and all(0.0 <= v <= 1.0 for v in scores.values())
    # the majority class of a balanced 0/1 training set scores 1/2 on the same labels
    majority = [v for name, v in scores.items() if "majority" in name]
    assert majority == [pytest.approx(0.5)] * len(majority)
    assert compute_metric("accuracy", torch.zeros(8, dtype=torch.long), test) == pytest.approx(0.5)
