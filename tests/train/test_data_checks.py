"""StepSampler and dataset_size: the checks no other test reaches and the unshuffled order."""

import pytest
import torch

from graded.train.data import StepSampler, dataset_size


def test_an_empty_dataset_is_refused():
    with pytest.raises(ValueError, match=r"dataset is empty: expected a dict of tensors"):
        dataset_size({})


def test_tensors_of_different_lengths_are_named():
    with pytest.raises(ValueError, match=r"disagree on their first dimension: "
                                         r"\{'x': 4, 'y': 5\}"):
        dataset_size({"x": torch.zeros(4, 2), "y": torch.zeros(5)})


def test_batch_not_divisible_by_accumulation_times_ranks_is_named():
    with pytest.raises(ValueError, match=r"batch size 6 must be divisible by grad_accum × "
                                         r"world_size = 2 × 2"):
        StepSampler(10, 6, seed=0, grad_accum=2, world_size=2)


def test_unshuffled_steps_walk_the_dataset_in_order():
    sampler = StepSampler(10, 4, seed=0, shuffle=False, grad_accum=2)
    assert sampler.steps_per_epoch == 2  # 10 // 4; the last 2 examples are dropped
    assert sampler.global_indices(0).tolist() == [0, 1, 2, 3]
    assert sampler.global_indices(1).tolist() == [4, 5, 6, 7]
    assert sampler.global_indices(2).tolist() == [0, 1, 2, 3]  # epoch 1, same order
    assert [m.tolist() for m in sampler.micro_batches(1)] == [[4, 5], [6, 7]]
    assert sampler.epoch_of(3) == 1.5
