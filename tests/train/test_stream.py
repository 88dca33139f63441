"""The stream loop equals a hand-written AdamW loop with clipping, step for step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from graded.train.stream import train_on_stream


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 5, generator=g)
    return x, (x @ torch.arange(1.0, 6.0)).unsqueeze(-1)


def test_stream_loop_equals_a_naive_loop_and_stops_when_asked():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    twin = copy.deepcopy(model)
    x, y = _data(1)

    def batches(gen: torch.Generator):
        rows = torch.randint(64, (16,), generator=gen)
        return x[rows], y[rows]

    # by hand
    gen = torch.Generator().manual_seed(3)
    opt = torch.optim.AdamW(twin.parameters(), lr=0.05)
    expected = []
    for _ in range(7):
        xb, yb = batches(gen)
        loss = nn.functional.mse_loss(twin(xb), yb)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
        opt.step()
        expected.append(loss.item())

    gen = torch.Generator().manual_seed(3)
    seen: list[float] = []
    ran = train_on_stream(
        model, lambda: batches(gen),
        lambda b: (nn.functional.mse_loss(model(b[0]), b[1]), {}),
        steps=100, optimizer=torch.optim.AdamW(model.parameters(), lr=0.05), clip_norm=0.5,
        after_step=lambda s, loss, m: seen.append(loss.item()) or s == 7,
    )
    assert ran == 7 and seen == pytest.approx(expected, abs=0, rel=0)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    assert not model.training


def test_stream_loop_rejects_a_non_positive_step_count():
    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        train_on_stream(model, lambda: None, lambda b: (model.weight.sum(), {}), steps=0,
                        optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
