"""Generated data do not depend on the number of intra-op threads: the torch-based generators
draw from a seeded ``torch.Generator`` and must give bit-identical tensors with 1 thread and
with several, for tensors large enough (> 32768 elements) for torch to split the work."""

import pytest
import torch

from graded.tasks import get_task


@pytest.mark.parametrize("name, options, n", [
    ("weighted_projective", {}, 20_000),
    ("weighted_projective_pair", {}, 10_000),
    ("multiscale", {}, 1_000),
    ("polynomial_regression", {}, 3_000),
    ("modular", {"p": 211}, 40_000),
])
def test_generation_is_bit_identical_with_one_thread_and_with_several(name, options, n):
    task = get_task(name, **options)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = task.generate(n, seed=7)
        torch.set_num_threads(max(2, before))
        several = task.generate(n, seed=7)
    finally:
        torch.set_num_threads(before)
    keys = single.keys()  # a TaskDataset iterates over its rows, not its keys
    assert keys == several.keys()
    for key in keys:
        assert torch.equal(single.tensors[key], several.tensors[key]), key
