"""Baselines and splits on the id and mask dtypes a dataset may hold: int32 ids as int64 ones,
padding masks that are not boolean refused."""

import pytest
import torch

from graded.evaluation import (
    features,
    knn_classify,
    logistic_regression,
    sequence_lengths,
    size_split,
)
from graded.kinds import run_baselines
from graded.tasks import IGNORE_INDEX, TaskDataset

I = IGNORE_INDEX


def _lm(dtype):
    data = {"inputs": torch.tensor([[1, 2, 3, 0], [1, 3, 3, 2], [2, 2, 3, 0]]),
            "targets": torch.tensor([[I, 3, 0, I], [I, 3, 2, I], [I, 3, I, I]])}
    return TaskDataset({k: v.to(dtype) for k, v in data.items()}, task="t", kind="lm",
                       info={"pad_id": 0, "metric": "token_accuracy"})


def test_int32_class_and_token_ids_give_the_int64_classification_baselines():
    # one_hot and the cross-entropy refused int32 ids with a RuntimeError, though the kinds'
    # losses and data checks take them
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (12, 3), generator=g)
    y = (x[:, 0] > 2).long()
    data = TaskDataset({"inputs": x, "targets": y}, task="t", kind="classification")
    narrow = TaskDataset({"inputs": x.int(), "targets": y.int()}, task="t",
                         kind="classification")
    onehot = features(data, vocab_size=5)
    assert torch.equal(features(narrow, vocab_size=5), onehot)
    assert knn_classify(onehot, y.int(), onehot, k=3).tolist() == \
        knn_classify(onehot, y, onehot, k=3).tolist()
    assert torch.equal(logistic_regression(onehot, y.int(), onehot, max_iter=5),
                       logistic_regression(onehot, y, onehot, max_iter=5))


def test_int32_lm_data_give_the_int64_sequence_baselines():
    expected = run_baselines(_lm(torch.int64), _lm(torch.int64))
    assert run_baselines(_lm(torch.int32), _lm(torch.int32)) == expected
    # by hand, position majority 3 then 0 (tie 0/2, smallest): 4 of 5 scored targets
    assert expected["majority"] == pytest.approx(4 / 5)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float32])
def test_a_padding_mask_that_is_not_boolean_is_refused_by_dtype(dtype):
    # ~ of a 0/1 int64 mask is -1/-2: a 2-token row counted -4 tokens (764 for uint8), and
    # the size split and the one-hot features used those counts
    pad = torch.tensor([[0, 0, 1], [0, 0, 0]])
    data = TaskDataset({"inputs": torch.tensor([[1, 2, 0], [1, 2, 3]]),
                        "targets": torch.tensor([0, 1]), "key_padding_mask": pad.to(dtype)},
                       task="t", kind="classification")
    message = rf"key_padding_mask of dtype {dtype}; expected a boolean mask \(True = padding\)"
    for call in (lambda: sequence_lengths(data), lambda: features(data, vocab_size=4),
                 lambda: size_split(data, 2)):
        with pytest.raises(TypeError, match=message):
            call()
    boolean = data.replace(key_padding_mask=pad.bool())
    assert sequence_lengths(boolean).tolist() == [2, 3]
    assert features(boolean, vocab_size=4).sum().item() == 5.0  # one 1 per real token
