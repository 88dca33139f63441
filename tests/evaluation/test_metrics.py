"""Metrics against hand computations."""

import pytest
import torch

from graded.evaluation import accuracy, compute_metric, exact_match, mae, mse, r2
from graded.tasks import IGNORE_INDEX, TaskDataset


def test_accuracy_counts_correct_labels_from_ids_or_logits():
    targets = torch.tensor([0, 1, 2, 1])
    assert accuracy(torch.tensor([0, 1, 1, 1]), targets) == 0.75
    logits = torch.tensor([[2.0, 0, 0], [0, 3, 0], [0, 0, 1], [5, 0, 0]])
    assert accuracy(logits, targets) == 0.75
    assert accuracy(torch.tensor([0, 0, 2, 0]), targets,
                    mask=torch.tensor([True, False, True, False])) == 1.0


def test_token_metrics_ignore_unscored_positions():
    targets = torch.tensor([[5, IGNORE_INDEX, 3], [1, 2, IGNORE_INDEX], [IGNORE_INDEX] * 3])
    pred = torch.tensor([[5, 9, 4], [1, 2, 7], [0, 0, 0]])
    assert accuracy(pred, targets) == pytest.approx(3 / 4)
    # row 0 has a wrong token, row 1 is right, row 2 has nothing scored and is left out
    assert exact_match(pred, targets) == 0.5


def test_mse_mae_and_r2_by_hand():
    y = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    p = torch.tensor([[1.0], [2.0], [3.0], [5.0]])
    assert mse(p, y) == pytest.approx(0.25)
    assert mae(torch.tensor([[0.0], [2.0], [3.0], [6.0]]), y) == pytest.approx(3 / 4)
    assert r2(p, y) == pytest.approx(1 - 1 / 5)  # SS_tot = 2.25 + 0.25 + 0.25 + 2.25
    assert r2(torch.full_like(y, 2.5), y) == pytest.approx(0.0)
    two = torch.tensor([[1.0, 7.0], [3.0, 7.0]])
    assert r2(torch.tensor([[1.0, 7.0], [3.0, 7.0]]), two) == 1.0  # constant column exact
    assert r2(torch.tensor([[2.0, 6.0], [2.0, 6.0]]), two) == pytest.approx(0.0)


def test_shape_mismatch_and_empty_masks_raise_with_shapes():
    with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
        mse(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="empty"):
        accuracy(torch.zeros(2, dtype=torch.long), torch.full((2,), IGNORE_INDEX))


def test_compute_metric_uses_the_metric_mask_only_for_masked_token_accuracy():
    targets = torch.tensor([[1, 2, 3]])
    data = TaskDataset({"inputs": torch.zeros(1, 3, dtype=torch.long), "targets": targets,
                        "loss_mask": torch.ones(1, 3, dtype=torch.bool),
                        "metric_mask": torch.tensor([[False, True, False]])},
                       task="t", kind="lm")
    pred = torch.tensor([[0, 2, 0]])
    assert compute_metric("masked_token_accuracy", pred, data) == 1.0
    assert compute_metric("token_accuracy", pred, data) == pytest.approx(1 / 3)
    assert compute_metric("exact_match", pred, data) == 0.0
    del data.tensors["metric_mask"]
    with pytest.raises(ValueError, match="needs a 'metric_mask'"):
        compute_metric("masked_token_accuracy", pred, data)
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        compute_metric("f1", pred, data)


def test_compute_metric_takes_a_dict_of_tensors_as_well_as_a_dataset():
    tensors = {"inputs": torch.zeros(2, 3, dtype=torch.long),
               "targets": torch.tensor([[1, 2, IGNORE_INDEX], [0, 1, 1]]),
               "loss_mask": torch.tensor([[True, True, False], [False, True, True]])}
    pred = torch.tensor([[1, 0, 0], [1, 1, 1]])
    data = TaskDataset(tensors, task="t", kind="lm")
    for name in ("token_accuracy", "exact_match"):
        assert compute_metric(name, pred, tensors) == compute_metric(name, pred, data)
    assert compute_metric("token_accuracy", pred, tensors) == pytest.approx(3 / 4)
