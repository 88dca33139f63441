"""The three constructions of 004 §5.3 as tasks: modular addition (A1 fixed k, A2 variable k),
retrieval (B), Dyck (C)."""

from graded.morphic.tasks.adder import VariableAdditionTask, build_adder_model, evaluate_adder
from graded.morphic.tasks.dyck import DyckDepthTask, build_dyck_model
from graded.morphic.tasks.fixed_adder import (
    FixedAdditionTask,
    build_fixed_adder_model,
    evaluate_fixed_adder,
)
from graded.morphic.tasks.retrieval import corrected_retrieval_bound, retrieval_sweep

__all__ = [
    "DyckDepthTask",
    "FixedAdditionTask",
    "VariableAdditionTask",
    "build_adder_model",
    "build_dyck_model",
    "build_fixed_adder_model",
    "corrected_retrieval_bound",
    "evaluate_adder",
    "evaluate_fixed_adder",
    "retrieval_sweep",
]
