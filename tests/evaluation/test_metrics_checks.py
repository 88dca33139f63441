"""Metrics: the shape checks no other test reaches, each naming the shapes."""

import math

import pytest
import torch

from graded.evaluation.metrics import accuracy, exact_match, mae, mse, r2


def test_predictions_of_another_shape_are_named():
    with pytest.raises(ValueError, match=r"predictions of shape \(4, 2\) do not match targets "
                                         r"of shape \(3,\)"):
        accuracy(torch.zeros(4, 2), torch.zeros(3, dtype=torch.long))


def test_a_mask_of_another_shape_is_named():
    with pytest.raises(ValueError, match=r"mask of shape \(2,\) does not match targets of shape "
                                         r"\(3,\)"):
        accuracy(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long),
                 torch.ones(2, dtype=torch.bool))


def test_exact_match_needs_rows_and_a_kept_target():
    with pytest.raises(ValueError, match=r"exact_match needs \(N, T\) targets, got shape \(3,\)"):
        exact_match(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    t = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"exact_match over an empty set: no row has a kept "
                                         r"target"):
        exact_match(t, t, torch.zeros(2, 3, dtype=torch.bool))


def test_r2_needs_two_examples():
    with pytest.raises(ValueError, match=r"R² needs at least 2 examples, got 1"):
        r2(torch.zeros(1, 2), torch.ones(1, 2))


def test_scores_of_the_targets_shape_are_not_truncated_to_class_ids():
    # probabilities of class 1 (one per example): .long() would read 0.9 as class 0
    targets = torch.tensor([1, 1, 0])
    with pytest.raises(ValueError, match=r"targets' shape \(3,\) are torch.float32 values that "
                                         r"are not whole numbers"):
        accuracy(torch.tensor([0.9, 0.8, 0.2]), targets)
    # whole-number floats are class ids: 2 of 3 right, counted by hand
    assert accuracy(torch.tensor([1.0, 0.0, 0.0]), targets) == pytest.approx(2 / 3)


def test_a_single_logit_column_is_refused_rather_than_argmaxed_to_class_0():
    # one binary logit per example: argmax over one column is 0 everywhere, which would score
    # the fraction of class-0 targets whatever the logits say
    with pytest.raises(ValueError, match=r"logits of shape \(2, 1\) have 1 class column; "
                                         r"expected at least 2"):
        accuracy(torch.tensor([[3.0], [-3.0]]), torch.tensor([1, 0]))


@pytest.mark.parametrize("metric", [mse, mae, r2])
def test_regression_metrics_of_no_entries_raise_instead_of_returning_nan(metric):
    with pytest.raises(ValueError, match=r"over an empty set: targets of shape \(0, 2\) have "
                                         r"no entry"):
        metric(torch.empty(0, 2), torch.empty(0, 2))


def test_bf16_logits_give_the_accuracy_of_their_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.5, 0.25], [0.0, 0.0, 4.0],
                           [1.0, 0.0, 0.5]]).bfloat16()
    targets = torch.tensor([[1, 0], [2, -100]])
    # naive loop over the kept entries
    pred = [max(range(3), key=lambda c: float(row[c])) for row in logits]
    kept = [(p, t) for p, t in zip(pred, targets.flatten().tolist()) if t != -100]
    expected = sum(p == t for p, t in kept) / len(kept)
    assert accuracy(logits.reshape(2, 2, 3), targets) == pytest.approx(expected) == 1.0
    assert exact_match(logits.reshape(2, 2, 3), targets) == 1.0


def test_r2_of_a_single_0d_example_is_refused_by_name_rather_than_an_index_error():
    with pytest.raises(ValueError, match=r"R² needs at least 2 examples, got 1"):
        r2(torch.tensor(1.0), torch.tensor(2.0))


def test_nan_logits_of_a_scored_entry_give_a_nan_score_not_a_counted_guess():
    nan = float("nan")
    targets = torch.tensor([0, 0, 1])
    # argmax takes a NaN for the largest logit: all-NaN rows "predicted" class 0 and the
    # all-NaN logits of a diverged model scored 2/3
    assert math.isnan(accuracy(torch.full((3, 2), nan), targets))
    assert math.isnan(accuracy(torch.tensor([[0.0, 1.0], [nan, 0.0], [0.0, 1.0]]), targets))
    rows = torch.tensor([[0, 1], [1, -100]])
    logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0]], [[0.0, 2.0], [nan, nan]]])
    assert math.isnan(exact_match(torch.full((2, 2, 2), nan), rows))
    # NaN only where the target is ignored (or masked out): the kept entries decide, by hand
    assert accuracy(logits, rows) == 1.0 == exact_match(logits, rows)
    assert accuracy(logits.bfloat16(), rows) == 1.0
    assert math.isnan(mse(torch.tensor([nan, 1.0]), torch.tensor([0.0, 1.0])))  # the same rule


def test_r2_with_a_nan_target_or_prediction_is_nan_as_mse_and_mae_are():
    nan = float("nan")
    clean = torch.tensor([1.0, 2.0, 3.0, 4.0])
    holed = torch.tensor([1.0, 2.0, nan, 4.0])
    for p, y in [(clean, holed), (holed, clean), (holed, holed)]:
        assert math.isnan(mse(p, y)) and math.isnan(mae(p, y))
        assert math.isnan(r2(p, y))
    # one NaN column of two makes the uniform average NaN; a constant target column too
    y = torch.tensor([[1.0, nan], [2.0, 1.0], [3.0, 1.0]])
    assert math.isnan(r2(torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]), y))
    assert math.isnan(r2(torch.tensor([1.0, nan, 1.0]), torch.ones(3)))
    # an infinite target leaves SS_tot undefined (inf - inf)
    assert math.isnan(r2(clean[:3], torch.tensor([1.0, 2.0, float("inf")])))
    # finite columns keep their value, by hand: SS_res = 1, SS_tot = 5
    y = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert r2(torch.tensor([1.0, 2.0, 3.0, 5.0]), y) == pytest.approx(1 - 1 / 5)
