"""Positional encodings against naive references: a shared ALiBi bias is one row expanded,
RoPE refuses inputs it would truncate, and unknown encoding names are refused."""

import math

import pytest
import torch

from graded.positional import POSITIONAL, ALiBi, RotaryEmbedding, position_start


def _press_slopes(n: int) -> list[float]:
    """Press et al.'s slopes, written out: 2^{-8k/n} for n a power of two, else interleaved."""
    if math.log2(n).is_integer():
        return [2 ** (-8 * k / n) for k in range(1, n + 1)]
    c = 2 ** math.floor(math.log2(n))
    return _press_slopes(c) + _press_slopes(2 * c)[0::2][: n - c]


@pytest.mark.parametrize("heads", [3, 8])
def test_alibi_bias_of_positions_shared_by_the_batch_is_one_row_expanded_not_copied(heads):
    batch, length = 4, 33
    positions = torch.arange(5, 5 + length).expand(batch, length)  # a model's default rows
    bias = ALiBi(heads).double()(positions, positions)
    assert bias.shape == (batch, heads, length, length)
    assert bias.stride(0) == 0  # B copies of one (H, T, T) bias would cost B times the memory
    assert bias.untyped_storage().nbytes() == heads * length * length * 8
    expected = [[[-m * abs(i - j) for j in range(length)] for i in range(length)]
                for m in _press_slopes(heads)]
    for b in range(batch):
        assert (bias[b] - torch.tensor(expected, dtype=torch.float64)).abs().max() < 1e-12


def test_alibi_bias_of_rows_with_their_own_positions_stays_per_row():
    q = torch.tensor([[0, 1, 2], [0, 0, 1]])  # the second row left-padded by one
    bias = ALiBi(2).double()(q, q)
    slopes = _press_slopes(2)
    for b in range(2):
        for h in range(2):
            expected = [[-slopes[h] * abs(int(q[b, i]) - int(q[b, j])) for j in range(3)]
                        for i in range(3)]
            assert (bias[b, h] - torch.tensor(expected, dtype=torch.float64)).abs().max() < 1e-12


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_rope_refuses_a_non_floating_input_instead_of_truncating_its_rotation(dtype):
    x = torch.ones(1, 1, 3, 2, dtype=dtype)
    with pytest.raises(TypeError, match=f"floating tensor.*{dtype}"):
        RotaryEmbedding(2)(x, torch.arange(3))
    # the same values as floats: (1, 1) turned by p radians, p = 0, 1, 2
    out = RotaryEmbedding(2)(x.double(), torch.arange(3))[0, 0]
    for p in range(3):
        turned = [math.cos(p) - math.sin(p), math.sin(p) + math.cos(p)]
        assert out[p].tolist() == pytest.approx(turned, abs=1e-15)


def test_position_start_is_one_for_sinusoidal1_only_and_refuses_unknown_names():
    assert [position_start(p) for p in POSITIONAL] == [int(p == "sinusoidal1")
                                                       for p in POSITIONAL]
    with pytest.raises(ValueError, match=r"positional must be one of .*got 'sinusoidal_1'"):
        position_start("sinusoidal_1")
