"""Positional encodings: the 003 §2.2 worked matrix, RoPE's relative property, ALiBi."""

import math
import re

import pytest
import torch

from graded.positional import (
    ALiBi,
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    alibi_slopes,
    sinusoidal_table,
)

# 003 §2.2, n = 6, d = 8, positions 1..6, printed to 4 decimals.
P_003 = torch.tensor([
    [0.8415, 0.5403, 0.0998, 0.9950, 0.0100, 1.0000, 0.0010, 1.0000],
    [0.9093, -0.4161, 0.1987, 0.9801, 0.0200, 0.9998, 0.0020, 1.0000],
    [0.1411, -0.9900, 0.2955, 0.9553, 0.0300, 0.9996, 0.0030, 1.0000],
    [-0.7568, -0.6536, 0.3894, 0.9211, 0.0400, 0.9992, 0.0040, 1.0000],
    [-0.9589, 0.2837, 0.4794, 0.8776, 0.0500, 0.9988, 0.0050, 1.0000],
    [-0.2794, 0.9602, 0.5646, 0.8253, 0.0600, 0.9982, 0.0060, 1.0000],
], dtype=torch.float64)


def test_one_indexed_table_equals_003_worked_matrix_to_4_decimals():
    table = sinusoidal_table(6, 8, start=1, dtype=torch.float64)
    assert torch.equal(torch.round(table * 1e4) / 1e4, P_003)


def test_one_indexed_table_equals_003_formula_loop():
    n, d = 7, 10
    table = sinusoidal_table(n, d, start=1, dtype=torch.float64)
    for i in range(1, n + 1):
        for j in range(1, d + 1):
            if j % 2 == 0:
                expected = math.cos(i * 10 ** (-4 * (j - 2) / d))
            else:
                expected = math.sin(i * 10 ** (-4 * (j - 1) / d))
            assert table[i - 1, j - 1].item() == pytest.approx(expected, abs=1e-12)


def test_zero_indexed_table_is_vaswani():
    table = sinusoidal_table(5, 6, dtype=torch.float64)
    for pos in range(5):
        for i in range(3):
            w = 10000 ** (-2 * i / 6)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos * w))
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos * w))


def test_shift_is_a_fixed_rotation_003_exercise_1():
    table = sinusoidal_table(20, 8, start=1, dtype=torch.float64)
    k = 3
    blocks = []
    for m in range(4):
        w = 10000 ** (-2 * m / 8)
        c, s = math.cos(k * w), math.sin(k * w)
        blocks.append(torch.tensor([[c, -s], [s, c]], dtype=torch.float64))
    r = torch.block_diag(*blocks)
    torch.testing.assert_close(table[:-k] @ r, table[k:])


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    rope = RotaryEmbedding(8)
    q = torch.randn(1, 1, 1, 8).double()
    k = torch.randn(1, 1, 1, 8).double()

    def score(i, j):
        qi = rope(q, torch.tensor([i]))
        kj = rope(k, torch.tensor([j]))
        return (qi * kj).sum().item()

    assert score(5, 2) == pytest.approx(score(13, 10), abs=1e-9)
    assert score(0, 0) == pytest.approx((q * k).sum().item(), abs=1e-9)


def test_rope_rotation_matches_explicit_2x2_blocks():
    rope = RotaryEmbedding(4, base=100.0)
    x = torch.randn(1, 1, 1, 4).double()
    p = 3
    out = rope(x, torch.tensor([p]))[0, 0, 0]
    for m in range(2):
        theta = p * 100.0 ** (-2 * m / 4)
        a, b = x[0, 0, 0, 2 * m].item(), x[0, 0, 0, 2 * m + 1].item()
        assert out[2 * m].item() == pytest.approx(a * math.cos(theta) - b * math.sin(theta))
        assert out[2 * m + 1].item() == pytest.approx(a * math.sin(theta) + b * math.cos(theta))


def test_alibi_slopes_and_bias():
    assert alibi_slopes(8).tolist() == [2.0 ** -(i + 1) for i in range(8)]
    bias = ALiBi(2)(torch.arange(3), torch.arange(3))
    slopes = alibi_slopes(2)
    for h in range(2):
        for i in range(3):
            for j in range(3):
                assert bias[0, h, i, j].item() == pytest.approx(-slopes[h].item() * abs(i - j))


def test_position_beyond_max_len_is_rejected():
    with pytest.raises(ValueError, match=r"position 8 is beyond max_len=8"):
        SinusoidalPositions(4, 8)(torch.arange(9))
    with pytest.raises(ValueError, match=r"beyond max_len=4"):
        LearnedPositions(4, 4)(torch.arange(5))
    with pytest.raises(ValueError, match=r"positive even dimension, got d=5"):
        sinusoidal_table(3, 5)


def test_alibi_slopes_for_six_heads_follow_press_et_al_interleaving():
    """Press et al.'s rule for n heads not a power of two: the 4-head slopes 2^-2, 2^-4,
    2^-6, 2^-8, then every other one of the 8-head slopes 2^-1 .. 2^-8, the first 6 - 4."""
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


def naive_rotation(x, positions, base):
    """RoPE as complex multiplication, one pair (2m, 2m+1) at a time, in float64."""
    out = torch.empty(x.shape, dtype=torch.float64)
    d = x.shape[-1]
    for t, p in enumerate(positions.tolist()):
        for m in range(d // 2):
            z = complex(x[..., t, 2 * m].item(), x[..., t, 2 * m + 1].item())
            z *= complex(math.cos(p * base ** (-2 * m / d)), math.sin(p * base ** (-2 * m / d)))
            out[..., t, 2 * m], out[..., t, 2 * m + 1] = z.real, z.imag
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rope_cast_to_a_low_precision_rotates_by_the_exact_angles(dtype):
    """``.to(dtype)`` leaves the frequencies in float64: a bfloat16 ω is off by up to
    2^-9·ω, which turned the angle p·ω at p = 4000 wrong by radians. The rotation of a
    cast module equals the complex rotation to the input's rounding, and a round trip
    through bfloat16 gives back the float32 rotation exactly."""
    x = torch.randn(1, 1, 4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([0, 100, 1000, 4000])
    expected = naive_rotation(x, positions, 10000.0)
    rope = RotaryEmbedding(16).to(dtype)
    out = rope(x.to(dtype), positions).double()
    tolerance = {torch.bfloat16: 0.05, torch.float16: 0.01, torch.float32: 1e-5}[dtype]
    assert (out - expected).abs().max() < tolerance
    back = RotaryEmbedding(16).to(torch.bfloat16).float()
    assert torch.equal(back(x.float(), positions), RotaryEmbedding(16)(x.float(), positions))


def test_sinusoidal_table_survives_a_round_trip_through_bfloat16():
    """The table stays float64 under casts: after ``.to(bfloat16).float()`` the encodings are
    the formula's in float32, not bfloat16 values widened."""
    enc = SinusoidalPositions(8, 50).to(torch.bfloat16).float()
    assert enc.table.dtype == torch.float64
    positions = torch.arange(50)
    assert torch.equal(enc(positions, torch.float32),
                       sinusoidal_table(50, 8, dtype=torch.float64).float())
    assert torch.equal(enc(positions, torch.bfloat16),
                       sinusoidal_table(50, 8, dtype=torch.float64).to(torch.bfloat16))


def press_slopes_float64(n):
    """Press et al.'s slopes in closed form, float64: 2^{-8h/n}, h = 1..n, for n a power of
    two; otherwise those of c = 2^⌊log2 n⌋ heads, then 2^{-8(2h-1)/(2c)}, h = 1..n-c."""
    c = 2 ** math.floor(math.log2(n))
    slopes = [2.0 ** (-8 * h / c) for h in range(1, c + 1)]
    slopes += [2.0 ** (-8 * (2 * h - 1) / (2 * c)) for h in range(1, n - c + 1)]
    return torch.tensor(slopes, dtype=torch.float64)


@pytest.mark.parametrize("heads", [12, 32])
@pytest.mark.parametrize("dtype, bits", [(torch.bfloat16, 8), (torch.float16, 11)],
                         ids=["bfloat16", "float16"])
def test_alibi_bias_of_a_half_precision_model_is_one_rounding_of_the_exact_bias(
        heads, dtype, bits):
    """A model cast to bfloat16 (float16) rounded the slopes to it, so the bias the attention
    rounds to its score dtype was made from a slope off by up to 2^-9 of itself: off by up to
    twice half a spacing at distances near 4096. The slopes now stay float32, and the bias,
    rounded as the attention rounds it, is within half a spacing of -m_h·|i - j| in float64."""
    positions = torch.arange(4097)
    bias = ALiBi(heads).to(dtype)(positions[:1], positions)[0, :, 0]  # (H, Tk): distances
    expected = -press_slopes_float64(heads)[:, None] * positions.double()
    exponent = torch.frexp(expected)[1]  # |expected| in [2^(e-1), 2^e): spacing 2^(e-bits)
    half_spacing = torch.ldexp(torch.ones_like(expected), exponent - bits - 1)
    error = (bias.to(dtype).double() - expected).abs()
    assert (error <= half_spacing).all(), (error / half_spacing).max()


def test_alibi_slopes_stay_float32_at_least_under_casts():
    """The slopes of a cast module are float32 for bfloat16 and float16, float64 under
    ``.double()``, where they equal the closed form (they were float32 values widened)."""
    assert ALiBi(12).to(torch.bfloat16).slopes.dtype == torch.float32
    assert ALiBi(12).half().slopes.dtype == torch.float32
    alibi = ALiBi(12).to(torch.bfloat16).double()
    assert alibi.slopes.dtype == torch.float64
    torch.testing.assert_close(alibi.slopes, press_slopes_float64(12), rtol=1e-15, atol=0)


def test_bad_sizes_and_bases_are_named_instead_of_failing_inside_torch_or_giving_nan():
    # alibi_slopes(0) raised "math domain error", RotaryEmbedding(-2) "upper bound and lower
    # bound inconsistent with step sign"; a base of -1 gave NaN columns, and base 10 the
    # frequencies 10^{-2m/d} (checked against the formula)
    with pytest.raises(ValueError, match=r"num_heads must be >= 1, got 0"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match=r"num_heads must be an int, got True"):
        ALiBi(True)
    for head_dim in (0, -2):
        with pytest.raises(ValueError, match=rf"head_dim must be >= 1, got {head_dim}"):
            RotaryEmbedding(head_dim)
    for base in (-1.0, 0.0, math.nan):
        with pytest.raises(ValueError, match=r"base \(of the position frequencies\) must be"):
            sinusoidal_table(3, 4, base=base)
        with pytest.raises(ValueError, match=r"base \(of the position frequencies\) must be"):
            RotaryEmbedding(4, base=base)
    table = sinusoidal_table(3, 4, base=10.0, dtype=torch.float64)
    expected = [[f(t * 10.0 ** (-2 * m / 4)) for m in range(2) for f in (math.sin, math.cos)]
                for t in range(3)]
    torch.testing.assert_close(table, torch.tensor(expected, dtype=torch.float64))


def test_rope_names_mismatched_shapes_instead_of_broadcasting_them():
    """Positions of another length, batch or rank, or x of another head_dim or rank, failed
    inside torch ("The size of tensor a (5) must match ...") or, for 3-D positions or a 3-D x,
    returned a tensor of another shape without complaint."""
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 3, 5, 8)
    bad_positions = [torch.arange(4), torch.arange(5).expand(3, 5),
                     torch.arange(5).expand(2, 3, 5)]
    for positions in bad_positions:
        shape = re.escape(str(tuple(positions.shape)))
        with pytest.raises(ValueError, match=rf"positions must have shape \(length,\) = "
                                             rf"\(5,\) or \(batch, length\) = \(2, 5\).*"
                                             rf"got {shape}"):
            rope(x, positions)
    for bad_x in (torch.randn(2, 3, 5, 6), torch.randn(3, 5, 8)):
        shape = re.escape(str(tuple(bad_x.shape)))
        with pytest.raises(ValueError, match=r"x must have shape \(batch, heads, length, "
                                             rf"head_dim=8\), got {shape}"):
            rope(bad_x, torch.arange(5))
    assert rope(x, torch.arange(5)[None]).shape == x.shape  # one row of positions broadcasts


def test_alibi_names_positions_of_the_wrong_rank_or_batch():
    """3-D positions gave a 5-D bias without complaint; query and key positions of two batch
    sizes failed inside torch ("The size of tensor a (2) must match ...")."""
    alibi = ALiBi(2)
    cases = [(torch.arange(5).expand(2, 3, 5), torch.arange(5)),
             (torch.arange(5).expand(2, 5), torch.arange(5).expand(3, 5))]
    for q_pos, k_pos in cases:
        with pytest.raises(ValueError, match=re.escape(
                f"got query positions {tuple(q_pos.shape)} and key positions "
                f"{tuple(k_pos.shape)}")):
            alibi(q_pos, k_pos)
    # one row of key positions serves every query row (a cached decoding step)
    bias = alibi(torch.tensor([[4], [6]]), torch.arange(5)[None])
    assert bias.shape == (2, 2, 1, 5)
    slopes = alibi_slopes(2)
    torch.testing.assert_close(bias[1, 0, 0], -slopes[0] * torch.tensor([6.0, 5, 4, 3, 2]))


def test_positions_of_a_narrow_integer_dtype_are_named_with_the_dtypes_taken():
    # int16 positions are integers: "must be an integer tensor, got torch.int16" contradicted
    # itself; the message names the two dtypes the encodings index with
    for module, call in ((LearnedPositions(4, 8), lambda m, p: m(p)),
                         (RotaryEmbedding(4), lambda m, p: m(torch.zeros(1, 1, 3, 4), p))):
        with pytest.raises(TypeError, match=r"positions must be an integer tensor of dtype "
                                            r"torch.int64 or torch.int32, got torch.int16"):
            call(module, torch.arange(3, dtype=torch.int16))


@pytest.mark.parametrize("dtype, bits", [(torch.bfloat16, 8), (torch.float16, 11)],
                         ids=["bfloat16", "float16"])
def test_rope_of_a_half_precision_input_is_the_float32_rotation_rounded_once(dtype, bits):
    """Rotated in bfloat16 (float16), cos and sin were rounded, then each product and the sum:
    where x·cos and y·sin nearly cancel, the result was hundreds of half-spacings from the
    rotation of x (up to 51 in bfloat16, 87 in float16 here). Now it is the complex rotation of
    the input, in float64 by a naive loop, to one rounding to the dtype plus float32's error
    (a few 2^-24 of the pair's size, for the cancelling sums)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 48, 8, dtype=torch.float64, generator=g).to(dtype)
    positions = torch.arange(0, 48 * 97, 97)
    out = RotaryEmbedding(8).to(dtype)(x, positions)
    assert out.dtype == dtype
    expected = naive_rotation(x.double(), positions, 10000.0)
    half_spacing = torch.ldexp(torch.ones_like(expected), torch.frexp(expected)[1] - bits - 1)
    pair_size = (x.double()[..., 0::2].abs() + x.double()[..., 1::2].abs()).repeat_interleave(
        2, dim=-1)
    error = (out.double() - expected).abs()
    assert (error <= half_spacing + 4 * 2.0**-24 * pair_size).all(), (error / half_spacing).max()
    assert torch.equal(out, RotaryEmbedding(8)(x.float(), positions).to(dtype))


def test_bools_and_fractions_given_for_sizes_and_starts_are_refused_by_name():
    # True passed for the start of SinusoidalPositions (True in (0, 1)), for n or d of the table
    # (True rows, or "got d=True"), a 2.0 start made a table of float positions without
    # complaint, and LearnedPositions(True, 4) built a one-dimensional table
    cases = [
        (lambda: SinusoidalPositions(8, 16, start=True), r"start \(the first position\) must "
                                                          r"be an int, got True"),
        (lambda: sinusoidal_table(True, 4), r"n \(the number of positions\) must be an int, "
                                            r"got True"),
        (lambda: sinusoidal_table(3, True), r"d \(the encoding dimension\) must be an int, "
                                            r"got True"),
        (lambda: sinusoidal_table(3, 4, start=2.0), r"start \(the first position\) must be an "
                                                    r"int, got 2.0"),
        (lambda: sinusoidal_table(3, 4, start=-1), r"start \(the first position\) must be "
                                                   r">= 0, got -1"),
        (lambda: SinusoidalPositions(8, True), r"max_len must be an int, got True"),
        (lambda: SinusoidalPositions(8, 0), r"max_len must be >= 1, got 0"),
        (lambda: SinusoidalPositions(8, 4, base=True), r"base \(of the position frequencies\) "
                                                        r"must be a number"),
        (lambda: LearnedPositions(True, 4), r"d_model must be an int, got True"),
        (lambda: LearnedPositions(4, 2.5), r"max_len must be an int, got 2.5"),
        (lambda: ALiBi(True), r"num_heads must be an int, got True"),
    ]
    for build, message in cases:
        with pytest.raises((TypeError, ValueError), match=message):
            build()


def test_alibi_refuses_float_positions_instead_of_biasing_by_fractional_distances():
    # float positions 0.5 apart gave a bias of -m/2 without complaint
    alibi = ALiBi(2)
    with pytest.raises(TypeError, match=r"ALiBi: positions must be an integer tensor of dtype "
                                        r"torch.int64 or torch.int32, got torch.float32"):
        alibi(torch.tensor([0.5]), torch.arange(3))
    bias = alibi(torch.arange(3, dtype=torch.int32), torch.arange(3))
    torch.testing.assert_close(bias[0, 0, 2], -alibi_slopes(2)[0] * torch.tensor([2.0, 1, 0]))
