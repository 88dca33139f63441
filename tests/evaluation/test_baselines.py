"""Baselines against hand computations on tiny data, and the harness on every task."""

import pytest
import torch
import torch.nn.functional as F

from graded.evaluation import (
    knn_classify,
    knn_regress,
    logistic_regression,
    majority_class,
    mean_predictor,
    ridge_regression,
    sequence_baselines,
)
from graded.evaluation.baselines import (
    bigram,
    features,
    positional_majority,
    prompt_nearest_neighbour,
)
from graded.kinds import run_baselines
from graded.tasks import IGNORE_INDEX, TaskDataset, available_tasks, get_task


def test_majority_and_mean_by_hand():
    assert majority_class(torch.tensor([2, 0, 2, 1, 0]), 3).tolist() == [0, 0, 0]  # tie -> 0
    assert majority_class(torch.tensor([1, 1, 2]), 2).tolist() == [1, 1]
    m = mean_predictor(torch.tensor([[1.0, 10.0], [3.0, 20.0]]), 2)
    assert m.tolist() == [[2.0, 15.0], [2.0, 15.0]]


def test_ridge_with_tiny_alpha_is_the_least_squares_line():
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    y = torch.tensor([[1.0], [3.0], [2.0], [5.0]])
    # slope = cov(x, y)/var(x) = (sum (x-1.5)(y-2.75)) / 5 = 5.5/5; intercept = 2.75 - 1.1*1.5
    pred = ridge_regression(x, y, torch.tensor([[4.0]]), alpha=1e-9)
    assert pred.item() == pytest.approx(2.75 - 1.1 * 1.5 + 1.1 * 4.0, abs=1e-6)
    # a large alpha shrinks the slope towards 0: the prediction tends to the mean
    assert ridge_regression(x, y, torch.tensor([[4.0]]), alpha=1e9).item() == \
        pytest.approx(2.75, abs=1e-5)


def test_knn_by_hand():
    x = torch.tensor([[0.0], [1.0], [2.0], [10.0], [11.0]])
    y = torch.tensor([0, 0, 1, 1, 1])
    assert knn_classify(x, y, torch.tensor([[0.4], [10.6], [1.6]]), k=3).tolist() == [0, 1, 0]
    yr = torch.tensor([[0.0], [2.0], [4.0], [6.0], [8.0]])
    assert knn_regress(x, yr, torch.tensor([[0.9]]), k=2).item() == pytest.approx(1.0)


def test_logistic_regression_reaches_a_stationary_point_of_its_objective():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=g, dtype=torch.float64)
    y = (x @ torch.tensor([[2.0, 0, -2], [0, 2, 0], [1, -1, 0]], dtype=torch.float64)).argmax(-1)
    l2 = 0.1
    logits = logistic_regression(x, y, x, num_classes=3, l2=l2)
    # recover (W, b) from logits on the train set via least squares and check the gradient
    design = torch.cat([x, torch.ones(60, 1, dtype=torch.float64)], 1)
    wb = torch.linalg.lstsq(design, logits).solution
    w = wb[:3]
    p = torch.softmax(logits, -1)
    grad_w = x.T @ (p - F.one_hot(y, 3).double()) / 60 + l2 * w
    grad_b = (p - F.one_hot(y, 3).double()).mean(0)
    assert grad_w.abs().max() < 1e-4 and grad_b.abs().max() < 1e-4
    assert (logits.argmax(-1) == y).float().mean() > 0.8


def _lm_dataset(inputs, targets):
    inputs, targets = torch.tensor(inputs), torch.tensor(targets)
    return TaskDataset({"inputs": inputs, "targets": targets,
                        "loss_mask": targets != IGNORE_INDEX,
                        "key_padding_mask": torch.zeros_like(inputs, dtype=torch.bool)},
                       task="t", kind="lm", info={"vocab_size": 4, "metric": "token_accuracy"})


def test_sequence_baselines_by_hand():
    train = _lm_dataset([[0, 1, 2], [0, 1, 3], [0, 2, 3]],
                        [[1, 2, 3], [1, 3, 3], [2, 3, IGNORE_INDEX]])
    test = _lm_dataset([[0, 2, 1]], [[1, 2, 3]])
    # position 0: targets 1,1,2 -> 1; position 1: 2,3,3 -> 3; position 2: 3,3 -> 3
    assert positional_majority(train, test, 4).tolist() == [[1, 3, 3]]
    # after 0: 1,1,2 -> 1; after 1: 2,3 -> 2 (tie, smaller id); after 2: 3,3 -> 3
    assert bigram(train, test, 4).tolist() == [[1, 3, 2]]


def test_prompt_neighbour_matches_the_whole_prompt_including_its_last_token():
    # prompt "1 2" answers "3 5", prompt "1 4" answers "2 5": input t + 1 is target t, so the
    # prompt is inputs 0..1 and the answer starts at input 2; the prompts differ only in
    # their last token, which was blanked with the answer (both then read "1", a tie)
    train = _lm_dataset([[1, 2, 3], [1, 4, 2]], [[IGNORE_INDEX, 3, 5], [IGNORE_INDEX, 2, 5]])
    test = _lm_dataset([[1, 4, 3]], [[IGNORE_INDEX, 3, 5]])
    # by hand: the test prompt "1 4" is train row 1's exactly, at Hamming distance 1 from row 0
    assert prompt_nearest_neighbour(train, test, 6).tolist() == [[0, 2, 5]]
    flipped = _lm_dataset([[1, 4, 2], [1, 2, 3]], [[IGNORE_INDEX, 2, 5], [IGNORE_INDEX, 3, 5]])
    assert prompt_nearest_neighbour(flipped, test, 6).tolist() == [[0, 2, 5]]


def test_token_features_are_one_hot_per_position_or_bag_of_tokens():
    data = TaskDataset({"inputs": torch.tensor([[1, 2, 0]]), "targets": torch.tensor([0]),
                        "key_padding_mask": torch.tensor([[False, False, True]])},
                       task="t", kind="classification")
    onehot = features(data, vocab_size=3)
    assert onehot.tolist() == [[0, 1, 0, 0, 0, 1, 0, 0, 0]]
    bag = features(data, vocab_size=3, max_onehot=4)
    assert bag.tolist() == [[0.0, 0.5, 0.5]]


SMALL = {"listops": {"max_length": 24, "max_depth": 3}, "modular": {"p": 11},
         "dyck": {"max_length": 12}, "dyck_recognition": {"max_length": 12},
         "polynomials": {"max_degree": 2, "coeff_range": 2},
         "polynomials_seq2seq": {"max_degree": 2, "coeff_range": 2}}
EXPECTED = {"lm": {"majority", "bigram"}, "seq2seq": {"majority", "bigram", "knn"},
            "classification": {"majority", "logistic", "knn"},
            "regression": {"mean", "ridge", "knn"}}


@pytest.mark.parametrize("name", available_tasks())
def test_run_baselines_scores_every_baseline_of_the_kind(name):
    task = get_task(name, **SMALL.get(name, {}))
    train, test = task.split("random", 60, 30, seed=0)
    scores = run_baselines(train, test)
    assert EXPECTED[task.kind] <= set(scores)
    lo = -float("inf") if task.metric == "r2" else 0.0
    assert all(lo <= v <= 1.0 for v in scores.values())


def test_ridge_solves_the_linear_control_and_mean_scores_zero():
    task = get_task("polynomial_regression", target="linear", min_polys=6, max_polys=6)
    train, test = task.split("random", 200, 100, seed=0)
    scores = run_baselines(train, test)
    assert scores["ridge"] > 0.999
    assert abs(scores["mean"]) < 0.05


def test_sequence_baselines_without_a_vocab_size_count_tokens_only_seen_as_targets():
    # no info["vocab_size"]: token 3 occurs only as a target (the last of each sequence); the
    # vocabulary taken from the inputs alone (3 symbols) made the bigram table too small
    train = TaskDataset({"inputs": torch.tensor([[1, 2, 1], [2, 1, 2]]),
                         "targets": torch.tensor([[2, 1, 3], [1, 2, 3]])}, task="t", kind="lm")
    test = TaskDataset({"inputs": torch.tensor([[1, 2, 2]]),
                        "targets": torch.tensor([[2, 1, 3]])}, task="t", kind="lm")
    out = sequence_baselines(train, test, encoder_decoder=False)
    # by hand: position 0 targets 2,1 -> 1 (tie, smaller id); 1: 1,2 -> 1; 2: 3,3 -> 3
    assert out["majority"].tolist() == [[1, 1, 3]]
    # after 1: 2 (row 0), 3 (row 0, last), 2 (row 1) -> 2; after 2: 1, 1, 3 -> 1
    assert out["bigram"].tolist() == [[2, 1, 1]]


def test_knn_with_no_neighbour_is_refused_rather_than_voting_for_class_0():
    # k = 0 used to give an empty vote (every test row class 0) and a mean over nothing (NaN)
    x, y = torch.tensor([[0.0], [1.0]]), torch.tensor([1, 1])
    with pytest.raises(ValueError, match=r"k must be >= 1, got 0"):
        knn_classify(x, y, x, k=0)
    with pytest.raises(ValueError, match=r"k must be >= 1, got 0"):
        knn_regress(x, y.double(), x, k=0)
