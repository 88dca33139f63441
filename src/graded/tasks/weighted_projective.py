"""Points of a weighted projective space P(w) given as random representatives (000 §8.1).

With weights w = (2, 4, 6, 10), the weights of the genus-2 Igusa invariants J2, J4, J6, J10,
a point is the class of x ∈ ℝ⁴ \\ {0} under the weighted action λ⋆x = (λ^{w_i} x_i), λ ≠ 0
(SPEC C1; computed by :class:`graded.algebra.GradedSpace`). A model sees one representative λ⋆x
and must output something that depends only on the class:

- ``weighted_projective``: the weight-0 invariants of the point (regression);
- ``weighted_projective_pair``: whether two representatives are the same point (classification).

Weight-0 invariants. The classical absolute invariants J4/J2², J6/J2³, J10/J2⁵ are unbounded near
J2 = 0, so the default label is the **normal form** of ``GradedSpace.normal_form``: the
representative y = N(x)^{-1} ⋆ x of unit homogeneous norm N(x) = (Σ_i |x_i|^{p/w_i})^{1/p}
(p = ``norm_p``, default 2·max w as in ``graded.algebra``), which satisfies N(λ⋆x) = |λ| N(x),
hence is invariant under every λ, and has |y_i| <= 1 (every term of N(y)^p is <= 1). When some
weight is odd, λ = -1 acts non-trivially and the sign is fixed by making the first nonzero
odd-weight coordinate positive; with all weights even (the default) λ and -λ act alike.
``invariants="igusa"`` gives the classical ratios x_i / x_0^{w_i/w_0} instead, sampling
|x_0| >= ``j2_min`` so they stay finite.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch
from torch import Tensor

from graded.algebra import GradedSpace
from graded.checks import check_choice, check_float
from graded.tasks.base import Task, TaskDataset, check_numbers, check_seed

INVARIANTS = ("normal_form", "igusa")
NEGATIVES = ("perturbed", "independent")
#: The largest factor λ^{w_i} (and smallest, as its inverse) a representative may be scaled by,
#: in powers of ten: the float32 inputs span 1e±38, which leaves 1e8 for the coordinates
#: themselves; beyond it coordinates become ∞ (NaN in every later computation) or 0 (the point
#: is lost).
MAX_SCALE_DIGITS = 30.0


@dataclasses.dataclass
class WeightedProjectiveInvariants(Task):
    """Predict the weight-0 invariants of a point of P(weights) from a random representative.

    A point x ~ N(0, I) (float64) is shown as λ⋆x with |λ| log-uniform in ``lambda_range`` and a
    random sign. Inputs (N, 1, n) float32: one token whose n features are the coordinates;
    targets (N, n) (normal form) or (N, n - 1) (Igusa ratios). Metric: R² averaged over outputs.

    Grades (``graded_object = "features"``): the weights, e.g. (2, 4, 6, 10) for
    (J2, J4, J6, J10). The normal form y is a point of the same graded space, coordinate i of
    weight w_i, so its targets have ``output_grades`` the weights too (the Igusa ratios are
    all of weight 0: none).
    """

    weights: tuple[float, ...] = (2.0, 4.0, 6.0, 10.0)
    lambda_range: tuple[float, float] = (0.5, 2.0)
    invariants: str = "normal_form"
    norm_p: float | None = None
    j2_min: float = 0.5

    name: ClassVar[str] = "weighted_projective"
    kind: ClassVar[str] = "regression"
    metric: ClassVar[str] = "r2"
    graded_object: ClassVar[str] = "features"

    def __post_init__(self) -> None:
        weights = check_numbers("weights", self.weights)
        if len(weights) < 2 or any(w <= 0 for w in weights):
            raise ValueError(f"weights must be >= 2 positive numbers, got {weights}")
        self.weights = weights
        lo, hi = check_numbers("lambda_range", self.lambda_range, length=2)
        if not 0 < lo <= hi:
            raise ValueError(f"lambda_range must satisfy 0 < low <= high, got {self.lambda_range}")
        self.lambda_range = (lo, hi)
        self._check_scale(1, "")
        check_choice("invariants", self.invariants, INVARIANTS)
        if self.norm_p is not None:
            check_float("norm_p", self.norm_p, minimum=0.0, strict_min=True)
        self.space = GradedSpace(self.weights)
        check_float("j2_min", self.j2_min, minimum=0.0, strict_min=True)
        if self.invariants == "igusa":
            w0 = self.weights[0]
            ratios = [w / w0 for w in self.weights[1:]]  # 0.6 / 0.2 is 2.9999999999999996
            if any(not math.isclose(r, round(r), rel_tol=1e-9) for r in ratios):
                raise ValueError(f"invariants='igusa' needs weights divisible by the first, got "
                                 f"{self.weights}")

    def _check_scale(self, actions: int, what: str) -> None:
        """ValueError unless ``actions`` actions of λ in ``lambda_range`` (1 for a generated
        representative λ⋆x, 2 for a relabelled one λ'⋆(λ⋆x)) scale every coordinate by
        |λ|^{w_i} within 10^±``MAX_SCALE_DIGITS``, inside the float32 range of the inputs."""
        lo, hi = self.lambda_range
        digits = actions * max(self.weights) * max(abs(math.log10(lo)), abs(math.log10(hi)))
        if digits > MAX_SCALE_DIGITS:
            raise ValueError(
                f"lambda_range={self.lambda_range} with weights={self.weights} scales "
                f"{what}coordinates by up to 10^±{digits:.1f} (|λ|^{actions * max(self.weights):g}"
                f"), beyond the 10^±{MAX_SCALE_DIGITS:g} that float32 inputs hold (they would "
                "become inf or 0); narrow lambda_range towards 1 or lower the weights"
            )

    @property
    def grades(self) -> tuple[float, ...]:
        return self.weights

    @property
    def input_dim(self) -> int:
        return len(self.weights)

    @property
    def num_outputs(self) -> int:
        return len(self.weights) - (self.invariants == "igusa")

    @property
    def output_grades(self) -> tuple[float, ...] | None:
        return self.weights if self.invariants == "normal_form" else None

    @property
    def max_len(self) -> int:
        return 1

    def labels(self, x: Tensor) -> Tensor:
        """The weight-0 invariants (float64) of representatives x (N, n)."""
        x = x.to(torch.float64)
        if self.invariants == "normal_form":
            return self.space.normal_form(x, self.norm_p)
        w0 = self.weights[0]
        powers = torch.tensor([round(w / w0) for w in self.weights[1:]], dtype=torch.float64)
        return x[:, 1:] / x[:, :1].pow(powers)

    def sample_points(self, n: int, g: torch.Generator) -> Tensor:
        x = torch.randn(n, len(self.weights), generator=g, dtype=torch.float64)
        if self.invariants == "igusa":
            x[:, 0] = torch.sign(x[:, 0]) * (self.j2_min + x[:, 0].abs())
        return x

    def sample_lambdas(self, n: int, g: torch.Generator) -> Tensor:
        """|λ| log-uniform in ``lambda_range``; a random sign when all weights are integers."""
        lo, hi = (math.log(v) for v in self.lambda_range)
        mag = torch.exp(lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64))
        sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        if not all(w == round(w) for w in self.weights):
            sign = torch.ones_like(sign)
        return mag * sign

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = self.sample_points(n, g)
        rep = self.space.act(self.sample_lambdas(n, g), x)
        return {"inputs": rep[:, None, :].float(), "targets": self.labels(x).float()}

    def canonicalize(self, data: TaskDataset) -> TaskDataset:
        """Inputs replaced by their normal forms (λ = 1 on the unit homogeneous sphere)."""
        x = data.inputs[:, 0].to(torch.float64)
        return data.replace(inputs=self.space.normal_form(x, self.norm_p)[:, None].float())

    def relabel(self, data: TaskDataset, seed: int) -> TaskDataset:
        """Every input moved to another representative λ⋆x of its point (labels unchanged).
        A generated input is itself λ⋆x, so a relabelled one is (λ'λ)⋆x: ValueError when that
        can leave the float32 range (``MAX_SCALE_DIGITS``)."""
        seed = check_seed(seed)
        self._check_scale(2, "relabelled ")
        g = torch.Generator().manual_seed(seed)
        x = data.inputs[:, 0].to(torch.float64)
        rep = self.space.act(self.sample_lambdas(len(data), g), x)
        return data.replace(inputs=rep[:, None].float())


@dataclasses.dataclass
class WeightedProjectiveSamePoint(WeightedProjectiveInvariants):
    """Decide whether two representatives are the same point of P(weights) (label 1) or not.

    Positives: (λ₁⋆x, λ₂⋆x). Negatives (half of the examples): (λ₁⋆x, λ₂⋆x') with x' either an
    independent point (``negatives="independent"``) or x with one random coordinate scaled by
    1 ± ``perturbation`` (``"perturbed"``, the default; the hard case). A perturbed x' is a
    different point: over the reals λ^{w_j} x_j = x_j with x_j ≠ 0 forces λ = ±1, and neither
    maps x_i to (1 ± perturbation) x_i for perturbation in (0, 1). Inputs (N, 2, n): two tokens.
    """

    negatives: str = "perturbed"
    perturbation: float = 0.3

    name: ClassVar[str] = "weighted_projective_pair"
    kind: ClassVar[str] = "classification"
    metric: ClassVar[str] = "accuracy"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("negatives", self.negatives, NEGATIVES)
        check_float("perturbation", self.perturbation, minimum=0.0, maximum=0.9,
                    strict_min=True)

    @property
    def num_outputs(self) -> int:
        return 2

    @property
    def output_grades(self) -> tuple[float, ...] | None:
        return None  # "same point" and "different points" carry no grades

    @property
    def max_len(self) -> int:
        return 2

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = self.sample_points(n, g)
        label = (torch.rand(n, generator=g) < 0.5).long()
        if self.negatives == "independent":
            other = self.sample_points(n, g)
        else:
            coord = torch.randint(0, len(self.weights), (n,), generator=g)
            sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
            factor = torch.ones_like(x)
            factor[torch.arange(n), coord] = 1.0 + sign * self.perturbation
            other = x * factor
        x2 = torch.where(label[:, None] == 1, x, other)
        a = self.space.act(self.sample_lambdas(n, g), x)
        b = self.space.act(self.sample_lambdas(n, g), x2)
        return {"inputs": torch.stack([a, b], dim=1).float(), "targets": label}

    def canonicalize(self, data: TaskDataset) -> TaskDataset:
        x = data.inputs.to(torch.float64)
        n, t, d = x.shape
        y = self.space.normal_form(x.reshape(n * t, d), self.norm_p)
        return data.replace(inputs=y.reshape(n, t, d).float())

    def relabel(self, data: TaskDataset, seed: int) -> TaskDataset:
        seed = check_seed(seed)
        self._check_scale(2, "relabelled ")
        g = torch.Generator().manual_seed(seed)
        x = data.inputs.to(torch.float64)
        n, t, d = x.shape
        rep = self.space.act(self.sample_lambdas(n * t, g), x.reshape(n * t, d))
        return data.replace(inputs=rep.reshape(n, t, d).float())
