"""Positional encodings (002 §3.4, 003 §2.2, Su et al. 2021, Press et al. 2022).

Every encoding takes explicit integer ``positions`` of shape (B, T) or (T,), so left-padded
batches and KV-cached generation place each token at its own position.

- :func:`sinusoidal_table` / :class:`SinusoidalPositions`: the original transformer's
  encoding; ``start=0`` is Vaswani et al.'s 0-indexed form, ``start=1`` is 003 §2.2's
  1-indexed form (p_ij = sin(i·10^{-4(j-1)/d}) for odd j, cos(i·10^{-4(j-2)/d}) for even j).
- :class:`LearnedPositions`: a trained table of ``max_len`` vectors.
- :class:`RotaryEmbedding`: RoPE, rotating query/key pairs by position-dependent angles.
- :class:`ALiBi`: linear biases ``-m_h·|i - j|`` added to attention scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from graded._precision import at_least_float32
from graded.checks import check_float, check_int, inputs_checked, value_range

__all__ = [
    "POSITIONAL",
    "TABLE_POSITIONAL",
    "ALiBi",
    "LearnedPositions",
    "RotaryEmbedding",
    "SinusoidalPositions",
    "alibi_slopes",
    "check_position_range",
    "check_positions",
    "position_start",
    "sinusoidal_table",
]

# The positional encodings a transformer config names (graded.TransformerConfig.positional):
# sinusoidal 0-indexed (Vaswani et al.) or 1-indexed (003 §2.2), learned, RoPE, ALiBi, none.
POSITIONAL = ("sinusoidal", "sinusoidal1", "learned", "rope", "alibi", "none")
# Those added from a table of max_len rows: a model using one cannot see past max_len.
TABLE_POSITIONAL = ("sinusoidal", "sinusoidal1", "learned")


def position_start(positional: str) -> int:
    """The position t of a sequence's first token under ``positional``: 1 for the 1-indexed
    sinusoids of 003 §2.2 / 000 §4.2 (``"sinusoidal1"``), 0 for every other encoding of
    :data:`POSITIONAL`; another name is refused (a misspelt ``"sinusoidal_1"`` would be read
    as 0-indexed, and an LGT factor 1 − αt checked one position short)."""
    if positional not in POSITIONAL:
        raise ValueError(f"positional must be one of {POSITIONAL}, got {positional!r}")
    return 1 if positional == "sinusoidal1" else 0


def _inverse_frequencies(dim: int, base: float) -> Tensor:
    """ω_m = base^{-2m/dim} for m = 0 .. dim/2 - 1 (a base ≤ 0 would make them NaN or inf)."""
    check_float("base (of the position frequencies)", base, minimum=0, strict_min=True)
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def sinusoidal_table(
    n: int, d: int, *, start: int = 0, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The (n, d) sinusoidal matrix for positions ``start .. start + n - 1``.

    Column 2m holds sin(pos·ω_m) and column 2m+1 cos(pos·ω_m), ω_m = base^{-2m/d}.
    With ``start=1`` and n=6, d=8 this is 003 §2.2's worked matrix.
    """
    if check_int("d (the encoding dimension)", d) <= 0 or d % 2:
        raise ValueError(f"sinusoidal encodings need a positive even dimension, got d={d}")
    check_int("n (the number of positions)", n, minimum=0)
    check_int("start (the first position)", start, minimum=0)
    pos = torch.arange(start, start + n, dtype=torch.float64).unsqueeze(1)
    angles = pos * _inverse_frequencies(d, base)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)
    return table.to(dtype)


def check_positions(positions: Tensor, max_len: int | None, who: str) -> None:
    """Raise unless ``positions`` are integers in [0, max_len) (in [0, ∞) for None).

    The values are read in one transfer (:func:`graded.checks.value_range`), not at all under
    ``torch.compile``, nor inside :func:`graded.checks.checked_inputs`."""
    if positions.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{who}: positions must be an integer tensor of dtype torch.int64 or "
                        f"torch.int32, got {positions.dtype}")
    if torch.compiler.is_compiling() or inputs_checked():
        return
    span = value_range(positions)
    if span is not None:
        check_position_range(*span, max_len, who)


def check_position_range(low: int, high: int, max_len: int | None, who: str) -> None:
    """Raise unless the positions from ``low`` to ``high`` lie in [0, max_len) (in [0, ∞) for
    None), naming the first one out of range."""
    if low < 0:
        raise ValueError(f"{who}: positions must be non-negative, got min {low}")
    if max_len is not None and high >= max_len:
        raise ValueError(
            f"{who}: position {high} is beyond max_len={max_len} "
            "(the sequence is longer than the model was configured for)"
        )


class _Float64Tables(nn.Module):
    """A module whose buffers are computed in float64 from its hyperparameters (``_tables``)
    and stay so: a cast of the model (``.to(torch.bfloat16)``, ``.half()``, ``.float()``) moves
    them to the new device but does not round them, so a cast model rotates and encodes as
    the paper's formulas do and a round trip through a low precision loses nothing. (A rotary
    frequency ω rounded to bfloat16 is off by up to 2⁻⁹·ω, and the angle p·ω then by ~1 rad
    at position 1000.) They are computed again after every such move, so a model built on the
    "meta" device and materialised with ``to_empty`` has them too (they are not in state
    dicts: a ``load_state_dict`` would not bring them)."""

    _kept: tuple[str, ...] = ()  # the names of the float64 buffers

    def _tables(self) -> dict[str, Tensor]:
        """The float64 buffers by name, computed on the CPU."""
        raise NotImplementedError

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> _Float64Tables:
        super()._apply(fn, recurse)
        if self._kept:  # computed on the CPU and moved: the same values on every device
            tables = self._tables()
            device = self._buffers[self._kept[0]].device
            for name in self._kept:
                self._buffers[name] = tables[name].to(device)
        return self


class SinusoidalPositions(_Float64Tables):
    """Fixed sinusoidal encodings added to embeddings; ``start`` = 0 or 1 (see module doc).

    The table is kept in float64, whatever the model is cast to, and the rows taken are cast
    to ``dtype`` (default: torch's default dtype), so a float64 model gets float64-exact
    encodings, not float32 values widened."""

    _kept = ("table",)

    def __init__(self, d_model: int, max_len: int, *, start: int = 0, base: float = 10000.0):
        super().__init__()
        if check_int("start (the first position)", start) not in (0, 1):
            raise ValueError(f"start must be 0 or 1, got {start}")
        check_int("max_len", max_len, minimum=1)
        check_float("base (of the position frequencies)", base, minimum=0, strict_min=True)
        self.max_len, self.d_model, self.start, self.base = max_len, d_model, start, base
        self.register_buffer("table", self._tables()["table"], persistent=False)

    def _tables(self) -> dict[str, Tensor]:
        return {"table": sinusoidal_table(self.max_len, self.d_model, start=self.start,
                                          base=self.base, dtype=torch.float64)}

    def forward(self, positions: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """(…, T) integer positions -> (…, T, d_model) encodings in ``dtype``."""
        check_positions(positions, self.max_len, "SinusoidalPositions")
        return self.table[positions].to(dtype or torch.get_default_dtype())


class LearnedPositions(nn.Module):
    """A learned table of ``max_len`` position vectors (GPT-style), initialised N(0, 0.02)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.embedding = nn.Embedding(max_len, check_int("d_model", d_model, minimum=1))
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, positions: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        check_positions(positions, self.max_len, "LearnedPositions")
        out = self.embedding(positions)
        return out if dtype is None else out.to(dtype)


class RotaryEmbedding(_Float64Tables):
    """Rotary position embedding (RoPE, Su et al. 2021) for per-head queries and keys.

    Dimension pairs (2m, 2m+1) of a head vector at position p are rotated by the angle p·ω_m,
    ω_m = base^{-2m/D}, so that q_iᵀ k_j depends on positions only through i - j. The
    frequencies stay float64 whatever the model is cast to. A bfloat16 or float16 input is
    rotated in float32 and the result rounded once to its dtype (rotated in bfloat16, cos and
    sin were rounded, then each product and the sum: x·cos − y·sin, where the two products
    nearly cancel, came out hundreds of half-spacings from the rotation of x).
    """

    _kept = ("inv_freq",)

    def __init__(self, head_dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        if check_int("head_dim", head_dim, minimum=1) % 2:
            raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
        self.head_dim, self.base = head_dim, base
        # float64 angles: exact enough for long positions, cast to the input dtype after
        self.register_buffer("inv_freq", self._tables()["inv_freq"], persistent=False)

    def _tables(self) -> dict[str, Tensor]:
        return {"inv_freq": _inverse_frequencies(self.head_dim, self.base)}

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate x (B, H, T, D) at positions (B, T) or (T,). The shapes are checked where the
        caller has not checked its inputs (:func:`graded.checks.checked_inputs`: a model's
        layers, which make both, call this twice a layer)."""
        if not x.is_floating_point():  # an integer x would come back truncated to integers
            raise TypeError(f"RotaryEmbedding: x must be a floating tensor (queries or keys), "
                            f"got dtype {x.dtype}")
        if not (torch.compiler.is_compiling() or inputs_checked()):
            self._check_shapes(x, positions)
        check_positions(positions, None, "RotaryEmbedding")
        if positions.dim() == 1:
            positions = positions.unsqueeze(0)
        compute = at_least_float32(x.dtype)  # bfloat16/float16: rotated in float32
        angles = positions.to(torch.float64).unsqueeze(-1) * self.inv_freq  # (B, T, D/2)
        cos = angles.cos().unsqueeze(1).to(compute)  # (B, 1, T, D/2)
        sin = angles.sin().unsqueeze(1).to(compute)
        x_even, x_odd = x[..., 0::2].to(compute), x[..., 1::2].to(compute)
        rotated = torch.stack(
            [x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], dim=-1
        )
        return rotated.flatten(-2).to(x.dtype)  # rounded once to the input's dtype

    def _check_shapes(self, x: Tensor, positions: Tensor) -> None:
        """x (B, H, T, head_dim) and positions (T,) or (B or 1, T), named when they are not."""
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"RotaryEmbedding: x must have shape (batch, heads, length, head_dim="
                f"{self.head_dim}), got {tuple(x.shape)}"
            )
        b, t = x.shape[0], x.shape[2]
        if positions.dim() not in (1, 2) or positions.shape[-1] != t or (
            positions.dim() == 2 and positions.shape[0] not in (1, b)
        ):
            raise ValueError(
                f"RotaryEmbedding: positions must have shape (length,) = ({t},) or (batch, "
                f"length) = ({b}, {t}) for x of shape {tuple(x.shape)}, got "
                f"{tuple(positions.shape)}"
            )


def alibi_slopes(num_heads: int, dtype: torch.dtype | None = None) -> Tensor:
    """Head slopes of Press et al. (2022): a geometric sequence 2^{-8/n}, ..., for n heads a
    power of two, and the paper's interleaving rule otherwise; in ``dtype`` (default: torch's
    default dtype), rounded once from the Python floats."""
    check_int("num_heads", num_heads, minimum=1)

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = power_of_two(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=dtype)


class ALiBi(nn.Module):
    """Attention with linear biases: adds ``-m_h·|p_i - p_j|`` to the scores of head h.

    With causal masking only j <= i matters, which is the paper's form; the absolute distance
    makes the bias usable in bidirectional encoders as well.

    The slopes are held in float32 at least, whatever the module is cast to (float64 under
    ``.double()``), and the bias is formed in their precision: the attention rounds it once to
    its score dtype, as BLOOM's ``build_alibi_tensor`` multiplies slopes and positions in
    float32 before casting. (A bfloat16 slope such as 2^{-1/2} is off by up to 2⁻⁹ of itself,
    so the bias -m·|i - j| made from it is off by as much as one more rounding to bfloat16
    would put it: rounded again, up to twice the error of one rounding.)
    """

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> ALiBi:
        """``nn.Module._apply`` with the slopes computed again on their new device, in their
        new dtype widened to float32 at least (not in state dicts: after ``to_empty`` from the
        "meta" device nothing else would)."""
        super()._apply(fn, recurse)
        slopes = self._buffers["slopes"]
        dtype = at_least_float32(slopes.dtype)
        self._buffers["slopes"] = alibi_slopes(self.num_heads, dtype).to(slopes.device)
        return self

    def forward(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """Additive bias of shape (B, H, Tq, Tk) from (B, Tq) and (B, Tk) positions (or (Tq,)
        and (Tk,), shared by the batch), in the slopes' dtype (float32 at least). Positions
        that are one row for the whole batch (1-D, (1, T), or one row expanded, as a model's
        default positions without padding are) give the bias of that row expanded over the
        batch as a view: formed B times, it cost B·H·Tq·Tk values (268 MB for B = H = 8,
        T = 1024) and 0.25 s per forward pass on a 2-core CPU, for B equal copies."""
        ranks = (q_positions.dim(), k_positions.dim())
        rows = {p.shape[0] for p in (q_positions, k_positions) if p.dim() == 2} - {1}
        if not set(ranks) <= {1, 2} or len(rows) > 1:
            raise ValueError(
                "ALiBi: positions must have shape (length,) or (batch, length), one batch size "
                f"for queries and keys, got query positions {tuple(q_positions.shape)} and key "
                f"positions {tuple(k_positions.shape)}"
            )
        for positions in (q_positions, k_positions):
            if positions.dtype not in (torch.int64, torch.int32):
                raise TypeError(f"ALiBi: positions must be an integer tensor of dtype "
                                f"torch.int64 or torch.int32, got {positions.dtype}")
        if q_positions.dim() == 1:
            q_positions = q_positions.unsqueeze(0)
        if k_positions.dim() == 1:
            k_positions = k_positions.unsqueeze(0)
        batch = max(q_positions.shape[0], k_positions.shape[0])
        if all(p.shape[0] == 1 or p.stride(0) == 0 for p in (q_positions, k_positions)):
            # one row shared by the batch (a model's default positions are one row expanded)
            q_positions, k_positions = q_positions[:1], k_positions[:1]
        dist = (q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2)).abs()
        dist = dist.to(self.slopes.dtype)
        bias = -self.slopes[:, None, None] * dist.unsqueeze(1)
        return bias.expand(batch, -1, -1, -1)
