"""Morphic thresholds are margins τ_e ≥ 0 (004 §3.3): a negative one is refused by the layer and
by the config, naming the value."""

from __future__ import annotations

import pytest
import torch

from graded.morphic.blocks import LinearBlock
from graded.morphic.config import MorphicLayerSpec
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.state import GradedStateSpace


def _layer(thresholds):
    space = GradedStateSpace({"a": 4, "b": 4})
    edges = EdgeSet.explicit(space, [("a", "b", "ab"), ("b", "a", "ba")])
    return MorphicLayer(space, edges, [LinearBlock(4, 4) for _ in edges], thresholds=thresholds)


@pytest.mark.parametrize("thresholds", [-0.1, [0.1, -0.2], torch.tensor([0.0, -1e-9])])
def test_a_negative_threshold_is_refused_by_the_layer(thresholds):
    with pytest.raises(ValueError, match=r"thresholds must be finite and >= 0.*004 §3\.3"):
        _layer(thresholds)


def test_zero_and_positive_thresholds_are_kept_as_given():
    layer = _layer([0.0, 0.25])
    assert layer.thresholds.tolist() == [0.0, 0.25]


@pytest.mark.parametrize("thresholds", [-0.5, [0.1, -0.2], [0.1, float("nan")], True])
def test_the_config_refuses_a_negative_or_non_number_threshold(thresholds):
    with pytest.raises(ValueError, match="thresholds"):
        MorphicLayerSpec(banded=[1], thresholds=thresholds)


def test_the_config_takes_a_threshold_per_edge():
    assert MorphicLayerSpec(banded=[1], thresholds=[0.0, 0.3]).thresholds == [0.0, 0.3]
