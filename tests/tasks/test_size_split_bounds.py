"""The refusal of a size split states the bound the split really needs: two even lengths for
Dyck (max_length >= min_length + 2) and two lengths for ListOps (max_length >= min_length + 1).
The messages named +4 and +2, which the splits do not need (2..4 and 5..6 split)."""

from __future__ import annotations

import pytest

from graded.tasks import get_task


@pytest.mark.parametrize("name, lo, step", [("dyck", 2, 2), ("dyck", 6, 2), ("listops", 5, 1),
                                            ("listops", 8, 1)])
def test_the_smallest_range_the_size_split_message_names_does_split(name, lo, step):
    with pytest.raises(ValueError) as err:
        get_task(name, min_length=lo, max_length=lo).size_configs()
    assert f"max_length >= min_length + {step}" in str(err.value)
    assert f"got {lo}..{lo}" in str(err.value)
    train, test = get_task(name, min_length=lo, max_length=lo + step).size_configs()
    assert (train.min_length, train.max_length) == (lo, lo)  # each side one length
    assert (test.min_length, test.max_length) == (lo + step, lo + step)
    small, large = get_task(name, min_length=lo, max_length=lo + step).split("size", 5, 5, seed=0)
    real = {"dyck": lambda d: (~d.tensors["key_padding_mask"]).sum(1) - 1,
            "listops": lambda d: (~d.tensors["key_padding_mask"]).sum(1)}[name]
    assert set(real(small).tolist()) == {lo} and set(real(large).tolist()) == {lo + step}
