"""The three constructions of 004 §5.3 as tasks: modular addition (A1 fixed k, A2 variable k, and
A2 over several moduli with held-out adder sets and moduli), retrieval (B), Dyck (C, with a length
split)."""

from graded.morphic.tasks.adder import VariableAdditionTask, build_adder_model, evaluate_adder
from graded.morphic.tasks.dyck import (
    DyckDepthTask,
    build_dyck_model,
    evaluate_dyck,
    length_split,
)
from graded.morphic.tasks.fixed_adder import (
    FixedAdditionTask,
    build_fixed_adder_model,
    evaluate_fixed_adder,
)
from graded.morphic.tasks.modular import (
    ModularAdditionTask,
    ModularReduction,
    build_modular_model,
    evaluate_modular,
)
from graded.morphic.tasks.retrieval import corrected_retrieval_bound, retrieval_sweep

__all__ = [
    "DyckDepthTask",
    "FixedAdditionTask",
    "ModularAdditionTask",
    "ModularReduction",
    "VariableAdditionTask",
    "build_adder_model",
    "build_dyck_model",
    "build_fixed_adder_model",
    "build_modular_model",
    "corrected_retrieval_bound",
    "evaluate_adder",
    "evaluate_dyck",
    "evaluate_fixed_adder",
    "evaluate_modular",
    "length_split",
    "retrieval_sweep",
]
