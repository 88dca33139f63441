"""Graded vector spaces V_q = ⊕ F·e_i with grades q_i (000 Def 2.1, 001 Def 2.1).

All tensor operations act on the last dimension and broadcast over any leading batch
dimensions; they are differentiable and keep the input's dtype. float16 and bfloat16 inputs are
computed in float32 (normal forms: every dtype in float64) and rounded once at the end: in their
own dtype λ = 1.01 is 1.0078 and the normal form's logarithms lose digits (errors of several
units in the last place, up to 0.07 in a bfloat16 normal form), and the graded norm's
Σ q_i x_i² overflows float16 at |x_i|·√q_i > 256.

Conventions where the papers are silent:

- *Negative λ.* λ^{q} for λ < 0 is a real number only for rational q with odd denominator; the
  action accepts λ < 0 only when every grade is an integer, and then
  λ^{q_i} = sign(λ)^{q_i}|λ|^{q_i}.
  For fractional grades a negative λ raises ValueError, and the weighted projective space is the
  quotient by λ > 0 only.
- *Homogeneous norm.* N_w(x) = (Σ|x_i|^{w/q_i})^{1/w} with w > 0 (w = ∞ gives max|x_i|^{1/q_i}),
  requiring q_i > 0; N(λ⋆x) = |λ|·N(x). The default w = 2·q_max makes every exponent w/q_i ≥ 2,
  so N^w is continuously differentiable, and the gradient at a zero coordinate is 0.
- *Normal forms.* :meth:`GradedSpace.normal_form` picks, in the orbit of x ≠ 0, the point with
  N = 1 and, for integer grades, a canonical sign. :meth:`normal_form_exact` does the same
  exactly for rational points: integral, weighted gcd 1, canonical sign. Both are computed in
  :mod:`graded.algebra.projective` (weighted projective space), as the graded linear maps are
  in :mod:`graded.algebra.maps`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from fractions import Fraction

import torch
from torch import Tensor

from graded._precision import at_least_float32

__all__ = ["GradedSpace", "power_norm"]


def power_norm(a: Tensor, p: float) -> Tensor:
    """(Σ_i a_i^p)^{1/p} over the last dimension of a ≥ 0, for p > 0 (p = ∞: max_i a_i).

    Computed as m·(Σ_i (a_i/m)^p)^{1/p} with m = max_i a_i, so the sum cannot overflow where the
    result does not (float32: a_i = 10^4 with p = 10 is 10^40). A NaN a_i gives NaN and an
    infinite one ∞ (the result is ≥ m); the result for a = 0 is 0 with a zero gradient, and a
    zero a_i has slope 0 (for p < 1 its one-sided slope is ∞).
    """
    m = a.amax(-1, keepdim=True)
    if math.isinf(p):
        return m.squeeze(-1)
    # m != 0, not m > 0: a NaN m must reach the result, not be read as the zero vector
    nonzero = m != 0
    m_safe = torch.where(nonzero, m, torch.ones_like(m))
    r = a / m_safe
    # a zero a_i adds 0 with slope 0: for p < 1 the slope of r^p at 0 is ∞, and its product
    # with ∂r/∂m = −a/m² = 0 made the gradient of every other a_i NaN
    zero = r == 0
    rp = torch.where(zero, torch.zeros_like(r), torch.where(zero, torch.ones_like(r), r) ** p)
    total = rp.sum(-1, keepdim=True)  # >= 1 wherever 0 < m < ∞
    total = torch.where(nonzero, total, torch.ones_like(total))  # no 0^{1/p - 1} in backward
    n = m_safe * total ** (1.0 / p)
    n = torch.where(torch.isinf(m), m, n)  # a_i = ∞ made a_i/m = ∞/∞ = NaN
    return torch.where(nonzero, n, torch.zeros_like(n)).squeeze(-1)


class GradedSpace:
    """A graded vector space over ℝ with grading tuple ``grades`` (000 Def 2.1).

    Grades are finite real numbers (ints, floats, Fractions); operations that need positive or
    integer grades check for it and name the offending grade.
    """

    def __init__(self, grades: Sequence[float] | Tensor) -> None:
        if isinstance(grades, Tensor):
            if grades.ndim != 1:
                raise ValueError(f"grades must be one-dimensional, got shape {tuple(grades.shape)}")
            grades = grades.detach().cpu().tolist()
        if isinstance(grades, (str, bytes)) or not hasattr(grades, "__iter__"):
            raise TypeError(f"grades must be a sequence of numbers, got {grades!r}")
        grades = list(grades)
        if len(grades) == 0:
            raise ValueError("grades must not be empty: a graded space needs at least one grade")
        out = []
        for i, g in enumerate(grades):
            if isinstance(g, bool) or not isinstance(g, numbers.Real):
                raise TypeError(f"grade {g!r} at index {i} is not a real number")
            if not math.isfinite(g):
                raise ValueError(f"grades must be finite, got {g!r} at index {i}")
            out.append(int(g) if isinstance(g, numbers.Integral) else
                       g if isinstance(g, Fraction) else float(g))
        self._exact = tuple(out)
        self.grades: tuple[float, ...] = tuple(float(g) for g in out)
        self.dim = len(out)
        self.distinct_grades: tuple[float, ...] = tuple(sorted(set(self.grades)))

    def __repr__(self) -> str:
        return f"GradedSpace(grades={self.grades})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GradedSpace) and other.grades == self.grades

    def __hash__(self) -> int:
        return hash(self.grades)

    # -- helpers -------------------------------------------------------------------------------
    @property
    def integer_grades(self) -> bool:
        """True when every grade is an integer."""
        return all(float(g).is_integer() for g in self._exact)

    def grade_tensor(self, like: Tensor) -> Tensor:
        """The grades as a tensor with the dtype and device of ``like``."""
        return torch.tensor(self.grades, dtype=like.dtype, device=like.device)

    def _check(self, x: Tensor, name: str = "x", *, floating: str | None = None) -> None:
        """Shape check; ``floating`` names the operation that needs a floating-point x (the
        grades are cast to x's dtype, so an integer x would truncate fractional grades)."""
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
        if x.ndim == 0 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}: its last dimension must equal the number of "
                f"grades, {self.dim}"
            )
        if floating is not None and not x.is_floating_point():
            raise TypeError(f"{floating} needs a floating-point {name}, got {x.dtype} "
                            f"(convert it with {name}.double() or {name}.float())")

    def _require_positive(self, what: str) -> None:
        for i, g in enumerate(self._exact):
            if g <= 0:
                raise ValueError(f"{what} needs grades q > 0, got grade {g!r} at index {i}")

    def _require_integer(self, what: str) -> None:
        for i, g in enumerate(self._exact):
            if not float(g).is_integer():
                raise ValueError(f"{what} needs integer grades, got grade {g!r} at index {i}")

    # -- the weighted scalar action (000 §2.2) -------------------------------------------------
    def act(self, lam: float | Tensor, x: Tensor) -> Tensor:
        """λ⋆x = (λ^{q_0} x_0, ..., λ^{q_{n-1}} x_{n-1}).

        ``lam`` is a number or a tensor broadcastable to ``x.shape[:-1]`` (one λ per vector);
        a shape that would enlarge the batch (a column (n, 1) for x of shape (n, d)) is an
        error, as is an integer x. λ = 0 is rejected (it is not in F^×); λ < 0 needs integer
        grades.
        """
        self._check(x, floating="the action (λ^q is real)")
        work = at_least_float32(x.dtype)
        lam_t = torch.as_tensor(lam, dtype=work, device=x.device)
        batch = tuple(x.shape[:-1])
        try:
            fits = torch.broadcast_shapes(lam_t.shape, batch) == batch
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"λ has shape {tuple(lam_t.shape)}; the action needs one λ per vector, a shape "
                f"that broadcasts to x.shape[:-1] = {batch} (x has shape {tuple(x.shape)})"
            )
        if bool((lam_t == 0).any()):
            raise ValueError(f"the action needs λ ≠ 0 (λ ∈ F^×), got λ={lam!r}")
        if not bool(torch.isfinite(lam_t).all()):
            raise ValueError(f"the action needs a finite λ, got λ={lam!r}")
        negative = lam_t < 0
        if bool(negative.any()) and not self.integer_grades:
            bad = next(g for g in self._exact if not float(g).is_integer())
            raise ValueError(
                f"λ^q for λ < 0 is real only for integer grades here; got λ={lam!r} with the "
                f"fractional grade {bad!r}"
            )
        q = self.grade_tensor(lam_t)
        lam_b = lam_t.unsqueeze(-1)
        factor = torch.pow(lam_b.abs(), q)
        overflow = torch.isinf(factor) & (x == 0)
        if bool(overflow.any()):
            # λ^{q_i} beyond the dtype's range is inf and inf·0 = NaN: a zero coordinate stays 0
            # (evaluated as λ^0·0, so the gradients are finite); a non-zero one is ±inf, its
            # true value being out of range too
            factor = torch.pow(lam_b.abs(), torch.where(overflow, torch.zeros_like(q), q))
        if bool(negative.any()):
            odd = torch.remainder(q, 2) == 1
            factor = torch.where(negative.unsqueeze(-1) & odd, -factor, factor)
        return (factor * x.to(work)).to(x.dtype)

    # -- homogeneous components (000 §2.1) -----------------------------------------------------
    def component_indices(self, grade: float) -> tuple[int, ...]:
        """Indices of the coordinates of grade ``grade`` (ValueError if the grade is absent)."""
        idx = tuple(i for i, g in enumerate(self.grades) if g == float(grade))
        if not idx:
            raise ValueError(f"grade {grade!r} does not occur in {self.distinct_grades}")
        return idx

    def project(self, x: Tensor, grade: float) -> Tensor:
        """The coordinates of the homogeneous component of grade ``grade``: shape (..., k)."""
        self._check(x)
        idx = torch.tensor(self.component_indices(grade), device=x.device)
        return x.index_select(-1, idx)

    def include(self, y: Tensor, grade: float) -> Tensor:
        """Inverse of :meth:`project`: embed (..., k) coordinates of grade ``grade`` in V_q."""
        idx = self.component_indices(grade)
        if y.ndim == 0 or y.shape[-1] != len(idx):
            raise ValueError(
                f"grade {grade!r} has {len(idx)} coordinates, got input shape {tuple(y.shape)}"
            )
        out = y.new_zeros((*y.shape[:-1], self.dim))
        return out.index_copy(-1, torch.tensor(idx, device=y.device), y)

    def homogeneous_part(self, x: Tensor, grade: float) -> Tensor:
        """x_d: x with every coordinate of grade ≠ d set to zero (the projection onto V_d)."""
        return self.include(self.project(x, grade), grade)

    def components(self, x: Tensor) -> dict[float, Tensor]:
        """{d: project(x, d)} for every distinct grade d, in increasing grade order."""
        return {d: self.project(x, d) for d in self.distinct_grades}

    def is_homogeneous(self, x: Tensor, atol: float = 0.0) -> Tensor:
        """Bool tensor (...,): x is non-zero in at most one grade component (0 counts).

        A coordinate counts as zero when |x_i| <= ``atol``; a NaN one does not (|NaN| > atol
        is False, so (NaN, 1) on grades (1, 2) was called homogeneous)."""
        self._check(x)
        nonzero = [(~(self.project(x, d).abs() <= atol)).any(-1) for d in self.distinct_grades]
        return torch.stack(nonzero, -1).sum(-1) <= 1

    # -- norms ---------------------------------------------------------------------------------
    def graded_norm(self, x: Tensor) -> Tensor:
        """Graded Euclidean norm ‖x‖_q = (Σ q_i x_i²)^{1/2} (000 §3.3 Eq. 3); needs q ≥ 0."""
        self._check(x, floating="the graded norm")
        for i, g in enumerate(self._exact):
            if g < 0:
                raise ValueError(f"the graded norm needs grades q >= 0, got {g!r} at index {i}")
        # (Σ (√q_i |x_i|)²)^{1/2} by power_norm, scaled by the largest term: Σ q_i x_i² itself
        # overflows where the norm does not (float16 at √q_i |x_i| > 256, float32 at 1.8e19);
        # a zero (finite, zero gradient) at the origin, NaN for a NaN coordinate
        xw = x.to(at_least_float32(x.dtype))
        return power_norm(self.grade_tensor(xw).sqrt() * xw.abs(), 2.0).to(x.dtype)

    def default_w(self) -> float:
        """The default homogeneous-norm exponent w = 2·q_max."""
        return 2.0 * max(self.grades)

    def homogeneous_norm(self, x: Tensor, w: float | None = None) -> Tensor:
        """N_w(x) = (Σ_i |x_i|^{w/q_i})^{1/w}, homogeneous of degree 1: N(λ⋆x) = |λ| N(x).

        Needs q_i > 0 and w > 0 (``math.inf`` gives max_i |x_i|^{1/q_i}). Computed by
        :func:`power_norm` of a_i = |x_i|^{1/q_i}, which cannot overflow in the sum (N itself,
        and a_i for q_i < 1, are outside the dtype's range when they are; then N is inf, as
        N ≥ max a_i). A NaN coordinate gives NaN.
        """
        self._check(x, floating="the homogeneous norm")
        w = self._norm_exponent(w)
        xw = x.to(at_least_float32(x.dtype))
        zero = xw == 0
        xs = torch.where(zero, torch.ones_like(xw), xw).abs()
        a = torch.where(zero, torch.zeros_like(xw), xs ** (1.0 / self.grade_tensor(xw)))
        return power_norm(a, w).to(x.dtype)

    def _norm_exponent(self, w: float | None) -> float:
        self._require_positive("the homogeneous norm")
        w = self.default_w() if w is None else float(w)
        if not w > 0:
            raise ValueError(f"the homogeneous norm needs an exponent w > 0, got w={w!r}")
        return w

    # -- weighted projective normal forms (graded.algebra.projective) --------------------------
    def normalize(self, x: Tensor, w: float | None = None) -> Tensor:
        """(1/N(x))⋆x, the point of the ℝ_{>0}-orbit of x with homogeneous norm 1
        (:func:`graded.algebra.projective.normalize`)."""
        from graded.algebra.projective import normalize

        return normalize(self, x, w)

    def normal_form(self, x: Tensor, w: float | None = None, *, closure: bool = False) -> Tensor:
        """Canonical representative of the orbit of x ≠ 0, a point of weighted projective space
        (:func:`graded.algebra.projective.normal_form`)."""
        from graded.algebra.projective import normal_form

        return normal_form(self, x, w, closure=closure)

    def same_point(self, x: Tensor, y: Tensor, w: float | None = None, *, closure: bool = False,
                   rtol: float | None = None, atol: float | None = None) -> Tensor:
        """Bool tensor (...,): x and y are the same point of weighted projective space, within
        the rounding of their dtypes (:func:`graded.algebra.projective.same_point`)."""
        from graded.algebra.projective import same_point

        return same_point(self, x, y, w, closure=closure, rtol=rtol, atol=atol)

    def normal_form_exact(self, x: Sequence[int | Fraction], *,
                          closure: bool = False) -> tuple[int, ...]:
        """Exact canonical representative of a rational point of P_q, positive integer grades
        (:func:`graded.algebra.projective.normal_form_exact`)."""
        from graded.algebra.projective import normal_form_exact

        return normal_form_exact(self, x, closure=closure)

    # -- graded linear maps and invariant subspaces (000 Lemmas 2.3, 2.4) -----------------------
    def degree_of(self, matrix: Tensor, target: GradedSpace, *, atol: float = 0.0,
                  grade_tol: float = 1e-9) -> float | None:
        """Degree d of the linear map V_q → V_r with this ``matrix`` (000 Lemma 2.3), or None."""
        from graded.algebra.maps import homogeneous_degree

        return homogeneous_degree(matrix, self, target, atol=atol, grade_tol=grade_tol)

    def is_invariant(self, vectors: Tensor, *, rtol: float = 1e-9) -> bool:
        """Whether span(vectors) is invariant under λ⋆ for all λ ≠ 0 (000 Lemma 2.4 (i))."""
        from graded.algebra.maps import is_invariant_subspace

        return is_invariant_subspace(self, vectors, rtol=rtol)

    def is_spanned_by_homogeneous(self, vectors: Tensor, *, rtol: float = 1e-9) -> bool:
        """Whether span(vectors) is spanned by homogeneous vectors (000 Lemma 2.4 (ii))."""
        from graded.algebra.maps import spanned_by_homogeneous

        return spanned_by_homogeneous(self, vectors, rtol=rtol)
