"""Attention-map plots and rollout: the checks no other test reaches, each naming the value."""

import pytest
import torch

from graded.analysis.maps import attention_rollout, plot_attention_maps


def _maps(*shape):
    return torch.softmax(torch.randn(*shape), -1)


def test_plot_attention_maps_checks_the_maps(tmp_path):
    with pytest.raises(ValueError, match=r"needs at least one attention map, got none"):
        plot_attention_maps({}, tmp_path)
    with pytest.raises(ValueError, match=r"attention map 'layer 0' must be \(B, H, Tq, Tk\), got "
                                         r"\(2, 3, 3\)"):
        plot_attention_maps([_maps(2, 3, 3)], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_attention_rollout_checks_the_layers():
    with pytest.raises(ValueError, match=r"needs at least one layer of attention maps"):
        attention_rollout([])
    with pytest.raises(ValueError, match=r"layer 1 weights must be square self-attention "
                                         r"\(B, H, T, T\), got \(1, 2, 3, 4\)"):
        attention_rollout([_maps(1, 2, 3, 3), _maps(1, 2, 3, 4)])
    with pytest.raises(ValueError, match=r"layer 1 has shape \(1, 4, 4\), the previous layers "
                                         r"\(1, 3, 3\)"):
        attention_rollout({"a": _maps(1, 2, 3, 3), "b": _maps(1, 2, 4, 4)})
