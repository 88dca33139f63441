"""Baselines scored beside a model: every trivial predictor of a task's kind (003 §3.2), fitted on
the training set and scored on the test set.

The kind picks its baselines (:meth:`graded.kinds.TaskKind.baselines`, from
:mod:`graded.evaluation.baselines`) and its metrics (:meth:`graded.kinds.TaskKind.metrics_for`);
the scores are those of :mod:`graded.evaluation.metrics`, as a model's evaluation computes them.
"""

from __future__ import annotations

from graded.evaluation.metrics import compute_metric
from graded.kinds import get_kind
from graded.tasks.base import TaskDataset

__all__ = ["baseline_report", "run_baselines"]


def run_baselines(train: TaskDataset, test: TaskDataset, *, metric: str | None = None,
                  k: int = 5) -> dict[str, float]:
    """Score every baseline of the datasets' kind on ``test`` after fitting on ``train``.

    ``metric`` defaults to the task's headline metric (``train.info["metric"]``).
    """
    if train.kind != test.kind:
        raise ValueError(f"train and test kinds differ: {train.kind!r} vs {test.kind!r}")
    metric = metric or train.info.get("metric")
    if metric is None:
        raise ValueError("no metric given and the dataset does not name one")
    preds = get_kind(train.kind).baselines(train, test, k=k)
    return {name: compute_metric(metric, p, test) for name, p in preds.items()}


def baseline_report(train: TaskDataset, test: TaskDataset, *, k: int = 5
                    ) -> dict[str, dict[str, float]]:
    """Every baseline of the datasets' kind, fitted on ``train``, scored on ``test`` by every
    metric the kind's evaluation reports there (:meth:`TaskKind.metrics_for`; not the loss,
    which baselines that predict labels have not): ``{baseline: {metric: value}}``, to read
    beside a model's evaluation metric by metric."""
    if train.kind != test.kind:
        raise ValueError(f"train and test kinds differ: {train.kind!r} vs {test.kind!r}")
    kind = get_kind(train.kind)
    preds = kind.baselines(train, test, k=k)
    return {name: {m: compute_metric(m, p, test) for m in kind.metrics_for(test)}
            for name, p in preds.items()}
