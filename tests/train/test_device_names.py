"""The device names training takes, read by the config and by ``resolve_device`` alike."""

from __future__ import annotations

import pytest
import torch

from graded.train.distributed import check_device_name, resolve_device
from graded.train.options import TrainOptions


@pytest.mark.parametrize("name", ["cpu:0", "cpu:5", "mps", "meta", "tpu7", "CPU", " cpu", "cuda:",
                                  "cuda:-1", ""])
def test_a_name_training_does_not_take_is_refused_by_both_readers(name):
    """``resolve_device`` called directly took ``cpu:5`` (and ran on the CPU) while the config
    refused it: both now apply one rule and name the value."""
    message = f"device {name!r} is not supported: expected 'auto', 'cpu', 'cuda' or 'cuda:N'"
    with pytest.raises(ValueError, match=message):
        resolve_device(name)
    with pytest.raises(ValueError, match=message):
        TrainOptions(device=name)


@pytest.mark.parametrize("name", [None, 0, torch.device("cpu")])
def test_a_device_that_is_not_a_name_is_refused(name):
    with pytest.raises(ValueError, match="is not supported"):
        resolve_device(name)
    with pytest.raises(ValueError, match="device"):
        TrainOptions(device=name)


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_the_documented_names_pass_the_check(name):
    assert check_device_name(name) == name
    assert TrainOptions(device=name).device == name


def test_cpu_and_auto_resolve_without_a_gpu():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_without_a_gpu_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="'cuda:0' requested but CUDA is not available; use 'cpu'"):
        resolve_device("cuda:0")
