"""Kinds: NaN logits score NaN, a float64 output keeps its loss in float64, and an evaluation's
figures are those of all the data at once."""

import math

import pytest
import torch
import torch.nn.functional as F

from graded.kinds import get_kind
from graded.train.objectives import evaluate


class _Table(torch.nn.Module):
    """Logits looked up from a fixed table by input token: (B, T) ids -> (B, T, V)."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, x, mask=None):
        return self.table[x]


class _Constant(torch.nn.Module):
    """The same logits for every row: (B, ...) -> (B, C)."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, x, mask=None):
        return self.logits.expand(x.shape[0], -1)


def test_a_model_with_nan_logits_scores_nan_accuracy_not_its_argmax_guesses():
    # argmax reads an all-NaN row as class 0: 4 of these 6 targets are 0, so a diverged model
    # scored 2/3 beside a NaN loss
    data = {"inputs": torch.zeros(6, 2, 3), "targets": torch.tensor([0, 0, 0, 1, 2, 0])}
    report = evaluate(_Constant(torch.full((3,), math.nan)), data, "classification")
    assert math.isnan(report["loss"]) and math.isnan(report["accuracy"])


def test_lm_nan_logits_score_nan_where_scored_and_nothing_where_ignored():
    table = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [math.nan] * 3])
    inputs = torch.tensor([[0, 1, 2], [1, 1, 0]])
    ignored_nan = {"inputs": inputs, "targets": torch.tensor([[0, 1, -100], [1, 0, 0]])}
    report = evaluate(_Table(table), ignored_nan, "lm", batch_size=1)
    # by hand: predictions 0, 1 | 1, 1, 0 against 0, 1 | 1, 0, 0: 4 of 5, row 0 exact
    assert report["token_accuracy"] == pytest.approx(4 / 5)
    assert report["exact_match"] == 0.5
    scored_nan = {"inputs": inputs, "targets": torch.tensor([[0, 1, 2], [1, 0, 0]])}
    report = evaluate(_Table(table), scored_nan, "lm", batch_size=1)
    assert math.isnan(report["token_accuracy"]) and math.isnan(report["exact_match"])
    assert math.isnan(report["perplexity"])


def test_prediction_keeps_int64_ids_for_integer_outputs_and_exact_ids_for_floats():
    kind = get_kind("lm")
    assert kind.prediction(torch.tensor([[[0, 3, 1]]]), {}).dtype == torch.int64
    logits = torch.zeros(1, 2, 70_000)
    logits[0, 0, 65_537], logits[0, 1, 3] = 1.0, 1.0
    assert kind.prediction(logits, {}).tolist() == [[65_537.0, 3.0]]
    # one NaN anywhere among an entry's logits marks it, whatever the other logits are
    logits = torch.tensor([[[5.0, math.nan, 0.0], [0.0, 1.0, 5.0]], [[math.nan, 9.0, 1.0],
                                                                     [1.0, 0.0, math.nan]]])
    ids = kind.prediction(logits, {})
    assert ids.isnan().tolist() == [[True, False], [True, True]] and ids[0, 1] == 2.0


@pytest.mark.parametrize("batch_size", [1, 2, 3, 5])
def test_lm_evaluation_over_uneven_batches_equals_the_loop_over_all_tokens(batch_size):
    # perplexity is exp of the mean NLL over every scored token, not a mean of batch figures;
    # rows hold 2, 1, 4, 1 and 3 scored tokens
    g = torch.Generator().manual_seed(0)
    table = torch.randn(6, 6, generator=g)
    inputs = torch.randint(0, 6, (5, 4), generator=g)
    targets = torch.randint(0, 6, (5, 4), generator=g)
    targets[0, 2:] = targets[1, 1:] = targets[3, 1:] = targets[4, 3] = -100
    nll, right, exact = [], [], []
    for b in range(5):
        row = []
        for t in range(4):
            if targets[b, t] != -100:
                logits = table[inputs[b, t]]
                nll.append(float(-F.log_softmax(logits.double(), -1)[targets[b, t]]))
                row.append(int(logits.argmax()) == int(targets[b, t]))
        right += row
        exact.append(all(row))
    report = evaluate(_Table(table), {"inputs": inputs, "targets": targets}, "lm",
                      batch_size=batch_size)
    mean_nll = sum(nll) / len(nll)
    assert report["loss"] == pytest.approx(mean_nll, rel=1e-6)
    assert report["perplexity"] == pytest.approx(math.exp(mean_nll), rel=1e-6)
    assert report["token_accuracy"] == sum(right) / len(right)
    assert report["exact_match"] == sum(exact) / len(exact)


def test_a_float64_model_has_its_loss_in_float64_and_a_half_precision_one_in_float32():
    # .float() rounded a float64 output: squared errors of 1e-3 about 1e8 summed to 0.0
    g = torch.Generator().manual_seed(1)
    values = torch.randn(4, 2, generator=g, dtype=torch.float64) * 1e4 + 1e8
    targets = values + 1e-3
    part = get_kind("regression").output_loss(values, {"targets": targets})
    assert part.total.dtype == torch.float64
    assert float(part.total) == pytest.approx(float(((values - targets) ** 2).sum()), rel=1e-9)
    assert float(part.total) > 7e-6
    logits = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 5, (3, 4), generator=g)
    reference = F.cross_entropy(logits.reshape(-1, 5), tokens.reshape(-1), reduction="sum")
    for kind, out, y in (("lm", logits, tokens), ("classification", logits[:, 0], tokens[:, 0])):
        total = get_kind(kind).output_loss(out, {"targets": y}).total
        expected = reference if kind == "lm" else F.cross_entropy(out, y, reduction="sum")
        assert total.dtype == torch.float64
        assert float(total) == pytest.approx(float(expected), rel=1e-12, abs=0)
        weighted = get_kind(kind).output_loss(
            out, {"targets": y}, weights=torch.ones(5 if kind == "classification" else (3, 4),
                                                    dtype=torch.float64)).total
        assert float(weighted) == pytest.approx(float(expected), rel=1e-12, abs=0)
    assert get_kind("lm").output_loss(logits.bfloat16(), {"targets": tokens}).total.dtype == \
        torch.float32
