"""The seeds of the random backends: refused at construction, naming the value, when torch's
generator cannot take them (they used to pass and fail at the first call with torch's
"Overflow when unpacking long long"), and taken over the generator's whole range."""

from __future__ import annotations

import pytest
import torch

from graded.attention.backends import get_backend

SEEDED = [
    ("lsh", {"n_buckets": 2, "chunk_size": 2}),
    ("bigbird", {"block_size": 2, "window_blocks": 1, "num_random_blocks": 1}),
    ("performer", {"num_features": 4}),
]


@pytest.mark.parametrize(("name", "options"), SEEDED)
@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 2**70])
def test_seed_out_of_generator_range_is_refused_naming_it(name, options, seed):
    with pytest.raises(ValueError, match=rf"{name} backend: seed must be an int in .*got {seed}"):
        get_backend(name, seed=seed, **options)
    backend = get_backend(name, seed=1, **options)
    with pytest.raises(ValueError, match=rf"seed must be an int in .*got {seed}"):
        backend.seed = seed
    assert backend.seed == 1


@pytest.mark.parametrize(("name", "options"), SEEDED)
@pytest.mark.parametrize("seed", [2**64 - 1, -(2**63), -1])
def test_seed_at_the_generator_bounds_draws_as_torch_generator_does(name, options, seed):
    """A seed the generator takes runs, and two backends of one seed agree exactly."""
    q, k, v = torch.randn(3, 1, 2, 8, 4).unbind(0)
    first = get_backend(name, seed=seed, **options).eval()
    second = get_backend(name, seed=seed, **options).eval()
    out = first(q, k, v, is_causal=True)
    assert torch.isfinite(out).all()
    assert torch.equal(out, second(q, k, v, is_causal=True))
