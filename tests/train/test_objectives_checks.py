"""Evaluation over a data set (graded.train.objectives): the batch size is checked naming it,
and the loss and accuracy do not depend on it (against a computation over the whole set)."""

import pytest
import torch
from torch import nn

from graded.train.objectives import evaluate, predict


class _Pooled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(12, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, **_: object) -> torch.Tensor:
        return self.head(self.embed(x).mean(1))


def _data() -> dict[str, torch.Tensor]:
    x = torch.randint(0, 12, (10, 8), generator=torch.Generator().manual_seed(1))
    return {"inputs": x, "targets": x.sum(1) % 3}


@pytest.mark.parametrize(("batch_size", "error", "message"),
                         [(0, ValueError, r"batch_size must be >= 1, got 0"),
                          (-1, ValueError, r"batch_size must be >= 1, got -1"),
                          (2.5, TypeError, r"batch_size must be an int, got 2.5")])
def test_a_bad_batch_size_is_named(batch_size, error, message):
    # 0 raised "range() arg 3 must not be zero", -1 "torch.cat(): expected a non-empty list"
    for run in (evaluate, predict):
        with pytest.raises(error, match=message):
            run(_Pooled(), _data(), "classification", batch_size=batch_size)


@pytest.mark.parametrize("batch_size", [1, 3, 10, 64])
def test_loss_and_accuracy_equal_the_whole_set_at_every_batch_size(batch_size):
    model, data = _Pooled(), _data()
    with torch.no_grad():
        logits = model(data["inputs"])
    loss = nn.functional.cross_entropy(logits, data["targets"]).item()
    accuracy = (logits.argmax(-1) == data["targets"]).float().mean().item()
    report = evaluate(model, data, "classification", batch_size=batch_size)
    assert report["loss"] == pytest.approx(loss, rel=1e-6)
    assert report["accuracy"] == pytest.approx(accuracy)
    torch.testing.assert_close(predict(model, data, "classification", batch_size=batch_size),
                               logits)


def test_data_without_examples_are_named():
    # was torch.cat(): expected a non-empty list of Tensors
    empty = {name: t[:0] for name, t in _data().items()}
    for run in (evaluate, predict):
        with pytest.raises(ValueError, match=r"hold no examples .*'inputs', 'targets'.* 0 rows"):
            run(_Pooled(), empty, "classification")
