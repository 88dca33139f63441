"""The GPU suite: every test here is marked ``cuda`` and skipped when torch sees no CUDA device.

Run it on a machine with a GPU with ``pytest -m cuda tests/cuda``. The tests compare the
accelerator against the CPU, so their bodies take the accelerator as the ``device`` fixture;
``GRADED_TEST_DEVICE=cpu pytest -m cuda tests/cuda`` runs the same bodies with the CPU in the
accelerator's place (CPU against CPU), which checks that they execute without a GPU.
``GRADED_TEST_DEVICE=cuda:1`` picks another GPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # device_checks
sys.path.insert(0, str(HERE.parent / "train"))  # tiny_training: the trainer tests' tiny LM task

ACCELERATOR = torch.device(os.environ.get("GRADED_TEST_DEVICE", "cuda"))
SKIP_REASON = ("needs a CUDA GPU: torch.cuda.is_available() is False (run on a GPU machine "
               "with `pytest -m cuda tests/cuda`; GRADED_TEST_DEVICE=cpu runs these bodies on "
               "the CPU against the CPU)")


def accelerator_missing() -> bool:
    return ACCELERATOR.type == "cuda" and not torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a conftest hook sees the whole session's items: touch only this folder's
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.cuda)
            if accelerator_missing():
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture
def device() -> torch.device:
    """The accelerator the CPU is compared against."""
    return ACCELERATOR


@pytest.fixture(autouse=True)
def exact_float32_matmuls():
    """CPU and GPU compare in full float32: TF32 matmuls and convolutions (about 10 mantissa
    bits) are turned off for each test and restored afterwards."""
    precision = torch.get_float32_matmul_precision()
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
