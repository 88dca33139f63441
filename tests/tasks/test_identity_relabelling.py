"""A relabelled split whose only relabelling is the identity is refused: Dyck with one bracket
type (the type permutation of k = 1 maps every token to itself) and multiscale signals with
num_points = 1 (shifts are multiples of the whole length). Such a split returned a random split
of fresh draws under the name "relabelled", measuring nothing about the symmetry."""

from __future__ import annotations

import pytest
import torch

from graded.tasks import get_task


@pytest.mark.parametrize("name", ["dyck", "dyck_recognition"])
def test_dyck_with_one_bracket_type_refuses_a_relabelled_split(name):
    task = get_task(name, k=1, max_length=12)
    assert torch.equal(task.type_permutation(5), torch.arange(len(task.vocab)))  # the identity
    with pytest.raises(ValueError, match=rf"relabelled split is not meaningful for task "
                                         rf"'{name}' with k=1"):
        task.split("relabelled", 20, 20, seed=0)
    data = get_task(name, k=2, max_length=12).generate(20, 1)  # k = 2 relabels types
    moved = get_task(name, k=2, max_length=12).relabel(data, 2)
    assert not torch.equal(moved.inputs, data.inputs)


def test_multiscale_with_one_target_point_refuses_a_relabelled_split():
    task = get_task("multiscale", length=16, bands=((1, 2), (4, 6)), num_points=1)
    with pytest.raises(ValueError, match=r"not meaningful for task 'multiscale' with "
                                         r"num_points=1"):
        task.split("relabelled", 10, 10, seed=0)
    two = get_task("multiscale", length=16, bands=((1, 2), (4, 6)), num_points=2)
    data = two.generate(40, 1)
    moved = two.relabel(data, 2)
    # a shift by 0 keeps an example; by half the length it negates every odd wavenumber's
    # coefficient and swaps the two target points (an independent check of both)
    sign = ((-1.0) ** torch.arange(1, 9))[None, :, None]
    kept = (moved.inputs - data.inputs).abs().amax((1, 2)) < 1e-5
    half = (moved.inputs - data.inputs * sign).abs().amax((1, 2)) < 1e-5
    assert bool((kept | half).all()) and 0 < int((half & ~kept).sum()) < 40
    assert torch.equal(moved.targets[kept], data.targets[kept])
    assert torch.equal(moved.targets[half & ~kept], data.targets[half & ~kept].flip(1))
