"""Graded neural network layers, activations and models (000 §3, 001 Def 2.6), and graph
attention (003 §3.6, 000 §8.9)."""

from graded.nn.activations import (
    GradedExp,
    GradedReLU,
    graded_exp,
    graded_relu,
    signed_power,
)
from graded.nn.centrality import centrality
from graded.nn.graded_layers import (
    GradedLinear,
    InputGradedLinear,
    MultiplicativeGradedLinear,
    OutputGradedLinear,
)
from graded.nn.graph import GATLayer, GATv2Layer, GradedGraphAttention
from graded.nn.mlp import GradedMLP

__all__ = [
    "GATLayer",
    "GATv2Layer",
    "GradedExp",
    "GradedGraphAttention",
    "GradedLinear",
    "GradedMLP",
    "GradedReLU",
    "InputGradedLinear",
    "MultiplicativeGradedLinear",
    "OutputGradedLinear",
    "centrality",
    "graded_exp",
    "graded_relu",
    "signed_power",
]
