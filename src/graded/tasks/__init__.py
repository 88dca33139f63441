"""Seeded task generators whose data carries natural grades (SPEC C10; 000 §8; 003 §3.2).

``get_task(name, **options)`` builds a task; ``task.generate(n, seed)`` returns a
:class:`TaskDataset`; ``task.split(kind, n_train, n_test, seed)`` returns train and test sets.
See ``docs/tasks.md`` for every task's format, grades and metric.
"""

from graded.tasks.base import IGNORE_INDEX, Task, TaskDataset, Vocab
from graded.tasks.dyck import DyckLM, DyckRecognition
from graded.tasks.graphs import GraphProperties
from graded.tasks.listops import ListOps
from graded.tasks.modular import ModularArithmetic
from graded.tasks.multiscale import MultiScaleSignals
from graded.tasks.polynomial_regression import PolynomialRegression
from graded.tasks.polynomials import PolynomialArithmetic, PolynomialArithmeticSeq2Seq
from graded.tasks.registry import TASKS, available_tasks, get_task, task_options
from graded.tasks.weighted_projective import (
    WeightedProjectiveInvariants,
    WeightedProjectiveSamePoint,
)

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "DyckLM",
    "DyckRecognition",
    "GraphProperties",
    "ListOps",
    "ModularArithmetic",
    "MultiScaleSignals",
    "PolynomialArithmetic",
    "PolynomialArithmeticSeq2Seq",
    "PolynomialRegression",
    "Task",
    "TaskDataset",
    "Vocab",
    "WeightedProjectiveInvariants",
    "WeightedProjectiveSamePoint",
    "available_tasks",
    "get_task",
    "task_options",
]
