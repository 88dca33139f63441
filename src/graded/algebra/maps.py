"""Graded linear maps (000 Lemma 2.3) and grading-invariant subspaces (000 Lemma 2.4).

000 Lemma 2.3 prints the condition as "a_ij ≠ 0 ⟹ r_i = q_i + d"; its proof (and the statement
for d = 0) use r_i = q_j + d, which is what is implemented: the entry a_ij maps the source
coordinate j (grade q_j) to the target coordinate i (grade r_i).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from graded.algebra.space import GradedSpace

__all__ = [
    "degree_mask",
    "entry_degrees",
    "homogeneous_degree",
    "is_homogeneous_map",
    "is_invariant_subspace",
    "spanned_by_homogeneous",
]


def _check_matrix(matrix: Tensor, source: GradedSpace, target: GradedSpace) -> None:
    if not isinstance(matrix, Tensor):
        raise TypeError(f"matrix must be a tensor, got {type(matrix).__name__}")
    if matrix.dtype == torch.bool or matrix.is_complex():
        raise TypeError(f"matrix must be a real tensor (floating or integer), got {matrix.dtype}")
    if matrix.ndim < 2 or matrix.shape[-2:] != (target.dim, source.dim):
        raise ValueError(
            f"a map V_q → V_r needs a matrix of shape (..., {target.dim}, {source.dim}) "
            f"(target dim, source dim), got {tuple(matrix.shape)}"
        )
    bad = ~torch.isfinite(matrix.detach())
    if bool(bad.any()):  # |NaN| > atol is False: a NaN entry would pass as a zero
        index = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"matrix entries must be finite, got {matrix[index].item()!r} at "
                         f"index {index}")


def degree_mask(source: GradedSpace, target: GradedSpace, degree: float, *,
                grade_tol: float = 1e-9, device: torch.device | None = None) -> Tensor:
    """Bool (m, n): entries a_ij allowed in a map of degree d, i.e. r_i = q_j + d."""
    try:
        finite = not isinstance(degree, (bool, str)) and math.isfinite(float(degree))
    except (TypeError, ValueError):
        finite = False
    if not finite:  # a NaN degree allowed no entry: every non-zero map "was not of degree d"
        raise ValueError(f"degree must be a finite real number, got {degree!r}")
    r = torch.tensor(target.grades, dtype=torch.float64, device=device)
    q = torch.tensor(source.grades, dtype=torch.float64, device=device)
    return (r[:, None] - q[None, :] - float(degree)).abs() <= grade_tol


def entry_degrees(matrix: Tensor, source: GradedSpace, target: GradedSpace, *,
                  atol: float = 0.0, grade_tol: float = 1e-9) -> tuple[float, ...]:
    """Sorted distinct values r_i − q_j over the non-zero entries of a (m, n) matrix."""
    _check_matrix(matrix, source, target)
    if matrix.ndim != 2:
        raise ValueError(f"entry_degrees takes one (m, n) matrix, got shape {tuple(matrix.shape)}")
    nz = (matrix.detach().abs() > atol).nonzero().tolist()
    out: list[float] = []
    for i, j in nz:
        d = target.grades[i] - source.grades[j]
        if not any(abs(d - e) <= grade_tol for e in out):
            out.append(d)
    return tuple(sorted(out))


def homogeneous_degree(matrix: Tensor, source: GradedSpace, target: GradedSpace, *,
                       atol: float = 0.0, grade_tol: float = 1e-9) -> float | None:
    """The degree d of the map (000 Lemma 2.3), or None when it is not homogeneous.

    The zero map is homogeneous of every degree; it reports 0.0 (it is also grade-preserving).
    Use :func:`entry_degrees` to tell the cases apart.
    """
    degrees = entry_degrees(matrix, source, target, atol=atol, grade_tol=grade_tol)
    if not degrees:
        return 0.0
    return degrees[0] if len(degrees) == 1 else None


def is_homogeneous_map(matrix: Tensor, source: GradedSpace, target: GradedSpace,
                       degree: float, *, atol: float = 0.0, grade_tol: float = 1e-9) -> Tensor:
    """Bool tensor (...,): each (..., m, n) matrix is homogeneous of degree ``degree``."""
    _check_matrix(matrix, source, target)
    allowed = degree_mask(source, target, degree, grade_tol=grade_tol, device=matrix.device)
    offending = (matrix.abs() > atol) & ~allowed
    return ~offending.flatten(-2).any(-1)


def _basis(vectors: Tensor, rtol: float) -> Tensor:
    """Orthonormal rows spanning the row space of ``vectors`` (k, n), via the SVD.

    Each row is scaled to unit length first (zero rows dropped): the span does not depend on
    the rows' lengths, but a rank cut relative to the largest singular value did, and dropped
    a short row as noise (span{(1, 0, 0), c·(0, 1, 1)} on grades (1, 2, 3) was called
    invariant for c = 1e-10 and not for c = 1).
    """
    v = vectors.detach().to(torch.float64)
    # by the largest entry, then by the length: the squares of 1e200 overflow
    big = v.abs().amax(-1, keepdim=True)  # (k, 1); n >= 1 (checked), so k = 0 is fine
    keep = big.squeeze(-1) > 0
    v = v[keep] / big[keep]
    v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    if v.numel() == 0:
        return v.new_zeros((0, vectors.shape[-1]))
    _u, s, vh = torch.linalg.svd(v, full_matrices=False)
    rank = int((s > rtol * max(float(s.max()), 1e-300)).sum()) if s.numel() else 0
    return vh[:rank]


def _check_vectors(space: GradedSpace, vectors: Tensor) -> None:
    if not isinstance(vectors, Tensor) or vectors.ndim != 2 or vectors.shape[-1] != space.dim:
        shape = tuple(vectors.shape) if isinstance(vectors, Tensor) else type(vectors).__name__
        raise ValueError(f"vectors must be a (k, {space.dim}) tensor of rows, got {shape}")
    bad = ~torch.isfinite(vectors.detach())
    if bool(bad.any()):  # the SVD raised torch's LinAlgError "failed to converge" instead
        index = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"vectors must be finite, got {vectors[index].item()!r} at index "
                         f"{index}")


def is_invariant_subspace(space: GradedSpace, vectors: Tensor, *, rtol: float = 1e-9) -> bool:
    """000 Lemma 2.4 (i): is W = span(rows) invariant under λ⋆ for every λ ≠ 0?

    λ⋆ = Σ_d λ^d P_d with P_d the projection onto V_d, and each P_d is a combination of the
    operators λ⋆ for as many λ as there are distinct grades (a Vandermonde system), so W is
    invariant under every λ⋆ iff P_d W ⊆ W for every grade d. The test is
    rank[B; P_d B for every d] = rank B for an orthonormal basis B of W. Testing with one λ
    instead (say λ = 2) is equivalent in exact arithmetic but fails in floating point when the
    grades are far apart: 2^{30} next to 2^0 makes a non-invariant W look invariant.
    """
    _check_vectors(space, vectors)
    b = _basis(vectors, rtol)
    if b.shape[0] == 0:
        return True
    parts = [b]
    for d in space.distinct_grades:
        keep = torch.tensor([g == d for g in space.grades], dtype=b.dtype, device=b.device)
        parts.append(b * keep)
    stacked = torch.cat(parts, 0)
    s = torch.linalg.svdvals(stacked)
    return int((s > rtol * float(s.max()) * max(stacked.shape)).sum()) == b.shape[0]


def spanned_by_homogeneous(space: GradedSpace, vectors: Tensor, *, rtol: float = 1e-9) -> bool:
    """000 Lemma 2.4 (ii): is W = span(rows) spanned by homogeneous vectors?

    Counts dimensions: W is spanned by homogeneous vectors iff dim W = Σ_d dim(W ∩ V_d), and
    dim(W ∩ V_d) = dim W − rank(B restricted to the coordinates of grade ≠ d) for a basis B.
    """
    _check_vectors(space, vectors)
    b = _basis(vectors, rtol)
    k = b.shape[0]
    if k == 0:
        return True
    total = 0
    for d in space.distinct_grades:
        others = [i for i, g in enumerate(space.grades) if g != d]
        if not others:
            total += k
            continue
        sub = b[:, others]
        s = torch.linalg.svdvals(sub)
        rank = int((s > rtol * max(sub.shape)).sum()) if s.numel() else 0
        total += k - rank
    return total == k
