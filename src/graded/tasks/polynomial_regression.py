"""Degree-weighted regression on sequences of polynomial coefficients (000 Ex 5.11, Ex 5.24).

000 Example 5.24 feeds a sequence X ∈ (ℝ⁴)^m of polynomials of degree <= 3 (one coefficient
vector (a_0, a_1, a_2, a_3) per token) and weights degree k by q_k = 1 + 0.5k so that learning
focuses on high-degree terms. The paper gives no target; we fix one whose value depends mostly on
the high-degree coefficients, so that a graded model has a prior that matches the data.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import Tensor

from graded.checks import check_choice, check_float, check_int
from graded.tasks.base import Task, TaskDataset, check_seed

TARGETS = ("graded_energy", "linear")


@dataclasses.dataclass
class PolynomialRegression(Task):
    """Predict a degree-weighted functional of a sequence of random polynomials.

    Each example is m polynomials p_t(x) = Σ_k a_{t,k} x^k, k = 0..degree, with a_{t,k} ~ N(0, 1)
    i.i.d.; m is uniform in [min_polys, max_polys]. With S_k = m^{-1/2} Σ_t a_{t,k} (the
    coefficients of the normalised sum polynomial, so S_k ~ N(0, 1) for every m) and degree
    weights w_k = emphasis^k / Σ_j emphasis^j, the target is

    - ``"graded_energy"``: y = Σ_k w_k S_k² (a graded squared norm of the sum, 000 §3.3 with
      weights growing in the degree); the default, since no linear model can fit it;
    - ``"linear"``: y = Σ_k w_k S_k, a linear control: with min_polys == max_polys it is a
      linear function of the inputs, which ridge regression solves exactly.

    plus N(0, noise²). With the default emphasis 3 and degree 3, degree 3 carries 27/40 of the
    weight. Inputs are (N, max_polys, degree + 1) float32, zero-padded with ``key_padding_mask``;
    targets (N, 1).

    Grades (``graded_object = "features"``): the monomial degree (0, 1, ..., degree) of each
    input feature coordinate; 000 Ex 5.24 grades them as q_k = 1 + 0.5 k.
    """

    degree: int = 3
    min_polys: int = 4
    max_polys: int = 8
    emphasis: float = 3.0
    target: str = "graded_energy"
    noise: float = 0.0

    name: ClassVar[str] = "polynomial_regression"
    kind: ClassVar[str] = "regression"
    metric: ClassVar[str] = "r2"
    graded_object: ClassVar[str] = "features"

    def __post_init__(self) -> None:
        check_int("degree", self.degree, minimum=0)
        check_int("min_polys", self.min_polys, minimum=1)
        check_int("max_polys", self.max_polys, minimum=self.min_polys)
        check_float("emphasis", self.emphasis, minimum=0.0, strict_min=True)
        check_choice("target", self.target, TARGETS)
        check_float("noise", self.noise, minimum=0.0)

    @property
    def grades(self) -> tuple[float, ...]:
        return tuple(float(k) for k in range(self.degree + 1))

    @property
    def input_dim(self) -> int:
        return self.degree + 1

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def max_len(self) -> int:
        return self.max_polys

    @property
    def degree_weights(self) -> Tensor:
        """w_k = emphasis^k / Σ_j emphasis^j, float64."""
        w = torch.tensor([self.emphasis**k for k in range(self.degree + 1)], dtype=torch.float64)
        return w / w.sum()

    def target_of(self, coeffs: Tensor, pad: Tensor) -> Tensor:
        """The noiseless target (N, 1) of coefficients (N, T, degree+1) with padding (N, T)."""
        real = (~pad).to(torch.float64)
        m = real.sum(dim=1, keepdim=True)
        s = (coeffs.to(torch.float64) * real[..., None]).sum(dim=1) / m.sqrt()  # (N, d+1)
        w = self.degree_weights
        y = (s * s * w).sum(-1) if self.target == "graded_energy" else (s * w).sum(-1)
        return y[:, None]

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(self.min_polys, self.max_polys + 1, (n,), generator=g)
        coeffs = torch.randn(n, self.max_polys, self.degree + 1, generator=g, dtype=torch.float64)
        pad = torch.arange(self.max_polys)[None, :] >= lengths[:, None]
        coeffs = coeffs.masked_fill(pad[..., None], 0.0)
        y = self.target_of(coeffs, pad)
        y = y + self.noise * torch.randn(n, 1, generator=g, dtype=torch.float64)
        return {"inputs": coeffs.float(), "targets": y.float(), "key_padding_mask": pad}

    def size_configs(self) -> tuple[PolynomialRegression, PolynomialRegression]:
        """Train on short sequences [min_polys, mid], test on (mid, max_polys]."""
        if self.max_polys <= self.min_polys:
            raise ValueError("a size split needs max_polys > min_polys, got "
                             f"{self.min_polys}..{self.max_polys}")
        mid = (self.min_polys + self.max_polys) // 2
        return (dataclasses.replace(self, max_polys=mid),
                dataclasses.replace(self, min_polys=mid + 1))

    def relabel(self, data: TaskDataset, seed: int) -> TaskDataset:
        """Substitute x ↦ -x in every polynomial (a_{t,k} ↦ (-1)^k a_{t,k}) and permute the
        order of the polynomials: both are bijections; the graded energy is invariant and the
        linear target is recomputed. Noise added at generation is kept."""
        seed = check_seed(seed)
        g = torch.Generator().manual_seed(seed)
        x, pad = data.inputs.to(torch.float64), data.tensors["key_padding_mask"]
        sign = torch.tensor([(-1.0) ** k for k in range(self.degree + 1)], dtype=torch.float64)
        n, t = pad.shape
        # permute the real (unpadded) rows of each example, keep padding at the end
        keys = torch.rand(n, t, generator=g).masked_fill(pad, 2.0)
        order = keys.argsort(dim=1)
        x = torch.gather(x, 1, order[..., None].expand_as(x)) * sign
        residual = data.targets.to(torch.float64) - self.target_of(data.inputs, pad)
        y = self.target_of(x, pad) + residual
        return data.replace(inputs=x.float(), targets=y.float())
