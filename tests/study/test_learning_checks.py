"""The learning study's pieces: the needle task against its formula, the task and needle checks,
and the token cross-entropy loss (plain and weighted) against a direct computation."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from graded.study.learning import TaskSpec, _loss, evaluate, make_data, needle_data
from graded.tasks.base import IGNORE_INDEX


def test_the_needle_target_is_the_needle_column_sum_squared():
    data = needle_data(5, 6, seed=1, tokens=3, needle=4)
    x = data["inputs"]
    expected = x[:, :, 4].sum(1) ** 2 / 3 - 1.0
    torch.testing.assert_close(data["targets"][:, 0], expected)


@pytest.mark.parametrize("needle", [-1, 6])
def test_the_needle_must_be_a_column(needle):
    with pytest.raises(ValueError, match=rf"needle={needle} must lie in \[0, 6\)"):
        needle_data(5, 6, seed=1, needle=needle)


def test_an_unknown_task_family_is_named():
    spec = TaskSpec("x", "graphs", (), True, "")
    with pytest.raises(ValueError, match=r"unknown task family 'graphs'; expected poly, needle "
                                         r"or dyck"):
        make_data(spec, n_eval=4, pool=8)


class _Fixed(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, inputs, mask=None):
        return self.logits


def _lm_batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 5, generator=g)
    targets = torch.tensor([[1, 2, IGNORE_INDEX, 0], [4, IGNORE_INDEX, IGNORE_INDEX, 3]])
    return logits, {"inputs": torch.zeros(2, 4, dtype=torch.long), "targets": targets}


def _per_token(logits, targets):
    out = {}
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            if int(targets[b, t]) != IGNORE_INDEX:
                out[(b, t)] = -float(torch.log_softmax(logits[b, t], -1)[targets[b, t]])
    return out


def test_lm_evaluation_is_the_mean_over_scored_tokens():
    logits, batch = _lm_batch()
    per = _per_token(logits, batch["targets"])
    assert len(per) == 5
    assert evaluate(_Fixed(logits), batch, "lm") == pytest.approx(sum(per.values()) / 5)


def test_weighted_lm_loss_weights_each_token_and_still_divides_by_the_count():
    logits, batch = _lm_batch()
    weights = torch.arange(8, dtype=torch.float32).view(2, 4)
    per = _per_token(logits, batch["targets"])
    expected = sum(weights[b, t].item() * v for (b, t), v in per.items()) / 5
    assert float(_loss(logits, batch, "lm", weights)) == pytest.approx(expected, rel=1e-6)
    assert float(_loss(logits[..., 0:1].squeeze(-1), {"targets": logits[..., 1]}, "regression")) \
        == pytest.approx(float(F.mse_loss(logits[..., 0], logits[..., 1])))
