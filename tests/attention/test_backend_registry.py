"""The backend registry, the shared input checks, and composition with grading."""

import re

import pytest
import torch

from graded.attention import backends
from graded.attention.backends import (
    AttentionBackend,
    available_backends,
    get_backend,
    register_backend,
)

ALL = [
    "bigbird", "block_sparse", "chunked", "dilated", "explicit", "full", "linear", "linformer",
    "lsh", "performer", "sliding_window", "sparse_fixed",
]

# deterministic settings of every backend for a length-16, head-dim-4 self-attention call
OPTIONS = {
    "bigbird": {"block_size": 4, "seed": 0},
    "block_sparse": {"layout": torch.ones(4, 4, dtype=torch.bool).tril(), "block_size": 4},
    "chunked": {"query_chunk": 5, "key_chunk": 3},
    "dilated": {"dilation": 3},
    "explicit": {},
    "full": {},
    "linear": {"chunk_size": 4},
    "linformer": {"max_len": 16, "rank": 6},
    "lsh": {"n_buckets": 2, "chunk_size": 4, "seed": 0},
    "performer": {"num_features": 12, "seed": 0, "head_dim": 4},
    "sliding_window": {"window": 3},
    "sparse_fixed": {"block": 4, "summary": 1},
}


def test_registry_lists_every_backend():
    assert available_backends() == ALL


def test_unknown_backend_name_lists_the_available_ones():
    with pytest.raises(ValueError, match="unknown attention backend 'flash'; available: bigbird"):
        get_backend("flash")


def test_unknown_option_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"no option\(s\) windw; allowed: window, block_size"):
        get_backend("sliding_window", windw=3)


def test_missing_required_option_is_named():
    with pytest.raises(ValueError, match=r"'linformer' needs option\(s\) max_len"):
        get_backend("linformer")
    with pytest.raises(ValueError, match=r"'block_sparse' needs option\(s\) layout"):
        get_backend("block_sparse")


@pytest.mark.parametrize("name", [n for n in ALL if n not in ("linear",)])
@pytest.mark.parametrize("scale", [0, 0.0, -0.5, float("nan"), float("inf"), True, "0.5"])
def test_every_backend_refuses_a_softmax_scale_that_is_not_positive_and_finite(name, scale):
    """``full`` with scale 0 or -0.5 returned NaN rows under a causal mask (the fused kernel
    multiplies the masked -inf scores by the scale); the others took the square root of a
    negative scale (performer) or silently flipped the ranking."""
    with pytest.raises(ValueError) as exc:  # graded.checks.check_float's refusal
        get_backend(name, **{**OPTIONS[name], "scale": scale})
    message = str(exc.value)
    assert message.startswith(f"{name} backend: scale (None for 1/√head_dim) must be ")
    assert "> 0" in message and f"got {scale!r}" in message


def test_a_positive_scale_is_the_softmax_temperature_of_the_full_backend():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out = get_backend("full", scale=0.3)(q, k, v, is_causal=True)
    scores = (q @ k.transpose(-2, -1) * 0.3).masked_fill(~torch.ones(5, 5).tril().bool(),
                                                          float("-inf"))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v)


@pytest.mark.parametrize("option, value", [("chunk_size", 0), ("eps", 0.0), ("eps", -1e-6),
                                           ("head_dim", -3)])
def test_performer_refuses_a_bad_option_naming_it_and_the_value(option, value):
    with pytest.raises(ValueError, match=rf"performer backend: {option} must be "
                                         rf"(a positive |> 0).*got {re.escape(repr(value))}"):
        get_backend("performer", **{option: value})


@pytest.mark.parametrize("name", ["bigbird", "lsh", "performer"])
@pytest.mark.parametrize("seed", [1.5, "0", True])
def test_a_seeded_backend_refuses_a_seed_that_is_not_an_int(name, seed):
    """The generator truncated a float seed: bigbird with seed=1.5 drew seed 1's blocks."""
    with pytest.raises(ValueError, match=rf"{name} backend: seed must be an int.*got "
                                         rf"{re.escape(repr(seed))}"):
        get_backend(name, **{**OPTIONS[name], "seed": seed})


def test_register_backend_adds_a_custom_backend_and_refuses_a_clash(monkeypatch):
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))

    class Doubled(AttentionBackend):
        name = "test_doubled_full"

        def forward(self, q, k, v, **kwargs):
            return 2 * get_backend("full")(q, k, v, **kwargs)

    register_backend(Doubled)
    assert "test_doubled_full" in available_backends()
    q = torch.randn(1, 1, 3, 2)
    torch.testing.assert_close(get_backend("test_doubled_full")(q, q, q),
                               2 * get_backend("full")(q, q, q))

    class Clash(AttentionBackend):
        name = "full"

    with pytest.raises(ValueError, match="'full' is already registered to FullBackend"):
        register_backend(Clash)
    with pytest.raises(TypeError, match="AttentionBackend subclass"):
        register_backend(int)


@pytest.mark.parametrize("name", ALL)
def test_unit_grading_scales_leave_every_backend_unchanged(name):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 4, generator=g) for _ in range(3))
    pad = torch.zeros(2, 16, dtype=torch.bool)
    pad[1, 12:] = True
    backend = get_backend(name, **OPTIONS[name])
    causal = name != "linformer"
    plain = backend(q, k, v, key_padding_mask=pad, is_causal=causal)
    graded = backend(q * torch.ones(4), k, v, key_padding_mask=pad, is_causal=causal)
    assert torch.equal(graded, plain)
    assert plain.shape == (2, 2, 16, 4) and torch.isfinite(plain).all()


@pytest.mark.parametrize("name", ALL)
def test_every_backend_names_itself_when_given_malformed_inputs(name):
    backend = get_backend(name, **OPTIONS[name])
    q = torch.randn(2, 2, 16, 4)
    with pytest.raises(ValueError, match=f"{name} backend: k must have shape"):
        backend(q, q[0], q)
    with pytest.raises(ValueError, match=f"{name} backend: key_padding_mask must be a bool"):
        backend(q, q, q, key_padding_mask=torch.zeros(2, 15, dtype=torch.bool))
