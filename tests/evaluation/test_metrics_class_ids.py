"""Metrics: what counts as a class id among the targets and the predictions, and NaN ids."""

import math

import pytest
import torch

from graded.evaluation.metrics import accuracy, compute_metric, exact_match, mse

NAN, INF = math.nan, math.inf


def _naive_accuracy(pred, targets):
    kept = [(p, t) for p, t in zip(pred, targets) if t != -100]
    return sum(p == t for p, t in kept) / len(kept)


def test_a_negative_target_other_than_ignore_index_is_refused_not_scored_as_a_miss():
    # -1 is the ignore value of other code bases (minGPT): it was kept and counted as a wrong
    # guess, so perfect predictions scored 2/3 and exact match 0
    targets = torch.tensor([[1, 2, -1]])
    for metric in (accuracy, exact_match):
        with pytest.raises(ValueError, match=r"targets hold the class id -1; expected ids >= 0, "
                                             r"or -100 \(IGNORE_INDEX\)"):
            metric(torch.tensor([[1, 2, 0]]), targets)
    # masked out, it is not scored; -100 stays the ignore value (by hand: 2 of 2)
    assert accuracy(torch.tensor([[1, 2, 0]]), targets, torch.tensor([[1, 1, 0]])) == 1.0
    pred, ids = [1, 0, 5, 3], [1, 2, -100, 3]
    assert accuracy(torch.tensor(pred), torch.tensor(ids)) == _naive_accuracy(pred, ids) == 2 / 3


def test_infinite_float_targets_and_ids_are_refused_by_value():
    # inf == inf.round(): an infinite target passed as a whole number and counted as a miss
    with pytest.raises(ValueError, match=r"targets are torch.float32 values that are not whole "
                                         r"numbers \(e.g. inf\)"):
        accuracy(torch.tensor([0, 1]), torch.tensor([0.0, INF]))
    with pytest.raises(ValueError, match=r"are torch.float32 values that are not whole numbers "
                                         r"\(e.g. -inf\)"):
        accuracy(torch.tensor([0.0, -INF]), torch.tensor([0, 1]))


def test_a_nan_class_id_of_a_kept_entry_scores_nan_as_nan_logits_do():
    # float ids with NaN are what a kind's prediction leaves where the logits held NaN
    targets = torch.tensor([0, 0, 1])
    assert math.isnan(accuracy(torch.tensor([0.0, NAN, 1.0]), targets))
    rows = torch.tensor([[0, 1], [1, -100]])
    assert math.isnan(exact_match(torch.tensor([[0.0, 1.0], [NAN, 0.0]]), rows))
    # NaN only where nothing is scored: the kept entries decide, by hand 3 of 3
    ids = torch.tensor([[0.0, 1.0], [1.0, NAN]])
    assert accuracy(ids, rows) == 1.0 == exact_match(ids, rows)


def test_compute_metric_without_targets_names_the_keys():
    with pytest.raises(ValueError, match=r"accuracy needs a 'targets' tensor; the data has "
                                         r"\['inputs'\]"):
        compute_metric("accuracy", torch.zeros(2), {"inputs": torch.zeros(2)})


def test_complex_regression_values_are_refused_not_cut_to_their_real_part():
    # (1+1j) - (1-1j) has squared modulus 4; double() of the two gave 0.0
    with pytest.raises(TypeError, match=r"mse of predictions of dtype torch.complex64; "
                                        r"expected real values"):
        mse(torch.tensor([1 + 1j]), torch.tensor([1 - 1j]))
