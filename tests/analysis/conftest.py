"""Fixtures of the diagnostics tests; helpers live in analysis_helpers.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from analysis_helpers import tiny_config

from graded import TransformerLM


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def egt_lm() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                     grade_init_value=0.2, grades_per_head=True))
