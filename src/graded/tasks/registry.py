"""The task registry: ``get_task(name, **options)`` builds a task from its configuration."""

from __future__ import annotations

from typing import Any

from graded.tasks.base import Task
from graded.tasks.dyck import DyckLM, DyckRecognition
from graded.tasks.graphs import GraphProperties
from graded.tasks.listops import ListOps
from graded.tasks.modular import ModularArithmetic
from graded.tasks.multiscale import MultiScaleSignals
from graded.tasks.polynomial_regression import PolynomialRegression
from graded.tasks.polynomials import PolynomialArithmetic, PolynomialArithmeticSeq2Seq
from graded.tasks.weighted_projective import (
    WeightedProjectiveInvariants,
    WeightedProjectiveSamePoint,
)

TASKS: dict[str, type[Task]] = {
    cls.name: cls
    for cls in (
        PolynomialArithmetic,
        PolynomialArithmeticSeq2Seq,
        PolynomialRegression,
        WeightedProjectiveInvariants,
        WeightedProjectiveSamePoint,
        ListOps,
        DyckLM,
        DyckRecognition,
        ModularArithmetic,
        MultiScaleSignals,
        GraphProperties,
    )
}


def available_tasks() -> list[str]:
    """Registered task names, sorted."""
    return sorted(TASKS)


def get_task(name: str, **options: Any) -> Task:
    """The task ``name`` configured by ``options`` (its dataclass fields).

    Unknown names and unknown options raise ``ValueError`` naming them and what is allowed;
    bad values raise the task's own ``TypeError``/``ValueError``.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available tasks: {available_tasks()}")
    cls = TASKS[name]
    fields = task_options(name)
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for task {name!r}; allowed: {fields}")
    return cls(**options)


def task_options(name: str) -> dict[str, Any]:
    """The options of task ``name`` with their defaults."""
    import dataclasses

    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available tasks: {available_tasks()}")
    return {f.name: (f.default if f.default is not dataclasses.MISSING else None)
            for f in dataclasses.fields(TASKS[name])}
