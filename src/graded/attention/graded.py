"""Graded multi-head attention: 000 Def 5.13, Def 5.22 (LGT) and §6.2 (EGT).

The grading M = diag(m) acts on the head dimension d_k. Each variant is a diagonal scaling of
queries, keys or values, so it is applied to the per-head tensors and the fused
``scaled_dot_product_attention`` kernel (or any backend) does the rest: graded attention costs
what plain attention costs, plus one elementwise product.

========================  ==========================================  =======================
variant                   formula                                     implemented as
========================  ==========================================  =======================
``"scores"``              softmax(Q M Kᵀ/√d_k) V   (Def 5.22 (1))      q ← q·m
``"queries_keys"``        softmax((QM)(KM)ᵀ/√d_k) V  (Def 5.22 (2))  q ← q·m, k ← k·m
``"values"``              softmax(Q Kᵀ/√d_k) (V M)   (Def 5.22 (4))   v ← v·m
``"multi_head"``          per head h: softmax(Q_h M_h K_hᵀ/√d_k) V_h   q ← q·m_h
========================  ==========================================  =======================

``"queries_keys"`` applies M to both sides, so its bilinear form is Q M² Kᵀ: it *squares* the
grading relative to ``"scores"`` (λ^{2q} for EGT, f(q)² for LGT). 000 writes the variant's score
as qᵀ M k, which holds only if one side is left unscaled; we follow the formula Q' = MQ, K' = MK
and document the squaring (notes: seeds_001_004 §A, 001 Thm 4.6). ``"multi_head"`` is the
per-head form of ``"scores"`` (Def 5.22 (3) prints it with M on both Q_h and K_h; the text calls
it "distinct grade tuples per head", the property we keep): grades must have shape
(num_heads, head_dim). Every other variant accepts shared (head_dim,) or per-head grades.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from graded.attention.multihead import MultiheadAttention
from graded.grading import ExponentialGrading, LinearGrading

__all__ = [
    "PER_HEAD_VARIANTS",
    "VARIANTS",
    "GradedMultiheadAttention",
    "grade_heads",
    "make_grading",
]

VARIANTS = ("scores", "queries_keys", "values", "multi_head")
# The variants whose grades are one tuple per head, shape (num_heads, head_dim).
PER_HEAD_VARIANTS = ("multi_head",)


def grade_heads(
    variant: str, grade: Callable[[Tensor], Tensor], q: Tensor, k: Tensor, v: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-head queries, keys and values after the variant's diagonal grading ``grade``
    (x ↦ x·m over head_dim), as in the table above. The one place that says what each
    variant scales: the attention module and the rank diagnostics both call it."""
    if variant in ("scores", "multi_head"):
        return grade(q), k, v
    if variant == "queries_keys":
        return grade(q), grade(k), v
    if variant == "values":
        return q, k, grade(v)
    raise ValueError(f"unknown graded attention variant {variant!r}; expected one of {VARIANTS}")


def make_grading(
    kind: str, dim: int, grades: Any = None, *, base: float = 2.0, f: str = "shift",
    learnable: bool = False, num_heads: int | None = None,
) -> LinearGrading | ExponentialGrading:
    """A LinearGrading (``kind="linear"``) or ExponentialGrading (``"exponential"``)."""
    if kind == "linear":
        return LinearGrading(dim, grades, f=f, learnable=learnable, num_heads=num_heads)
    if kind == "exponential":
        return ExponentialGrading(dim, grades, base=base, learnable=learnable,
                                  num_heads=num_heads)
    raise ValueError(f"grading must be 'linear' or 'exponential', got {kind!r}")


class GradedMultiheadAttention(MultiheadAttention):
    """Graded attention with the interface and parameters of :class:`MultiheadAttention`.

    Args:
        grading: ``"linear"`` (LGT, M = diag(f(q))), ``"exponential"`` (EGT, M = diag(λ^q)),
            or a ready grading module over ``head_dim`` features.
        grades: None (neutral: M = I, so the module equals plain attention), a tensor of shape
            (head_dim,) shared by all heads, or (num_heads, head_dim) for per-head grades.
        base: λ of the exponential grading. ``f``: the linear grading's function.
        learnable_grades: make the grades a Parameter.
        variant: one of ``"scores"``, ``"queries_keys"``, ``"values"``, ``"multi_head"``.
        **mha_kwargs: everything :class:`MultiheadAttention` takes (dropout, bias, kdim, vdim,
            batch_first, backend, ...).

    The state dict holds torch's keys plus ``grading.grades`` (and ``grading.base`` for EGT).
    A ``torch.nn.MultiheadAttention`` state dict loads strictly (the grades keep their current
    values); :meth:`torch_state_dict` gives one that torch's module loads strictly.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        grading: str | nn.Module = "linear",
        grades: Any = None,
        base: float = 2.0,
        f: str = "shift",
        learnable_grades: bool = False,
        variant: str = "scores",
        **mha_kwargs: Any,
    ) -> None:
        super().__init__(embed_dim, num_heads, **mha_kwargs)
        if variant not in VARIANTS:
            raise ValueError(f"unknown graded attention variant {variant!r}; expected one of "
                             f"{VARIANTS}")
        self.variant = variant
        if isinstance(grading, nn.Module):
            module = grading
        else:
            per_head = variant in PER_HEAD_VARIANTS and (grades is None or _ndim(grades) == 1)
            if per_head and grades is not None:
                raise ValueError(
                    f"variant {variant!r} needs per-head grades of shape (num_heads, head_dim) = "
                    f"({num_heads}, {self.head_dim}), got a shared tuple"
                )
            module = make_grading(
                grading, self.head_dim, grades, base=base, f=f, learnable=learnable_grades,
                num_heads=num_heads if per_head else None,
            )
        if getattr(module, "dim", self.head_dim) != self.head_dim:
            raise ValueError(
                f"the grading acts on {module.dim} features but head_dim is {self.head_dim}"
            )
        heads = getattr(module, "num_heads", None)
        if heads is not None and heads != num_heads:
            raise ValueError(f"per-head grades for {heads} heads, but num_heads={num_heads}")
        if variant in PER_HEAD_VARIANTS and heads is None:
            raise ValueError(f"variant {variant!r} needs per-head grades (num_heads, head_dim)")
        if getattr(module, "role", None) is None:
            module.role = "attention"  # see graded.grading.GradingMap.role
        self.grading = module
        self.register_load_state_dict_post_hook(_tolerate_missing_grading)

    def torch_state_dict(self) -> dict[str, Tensor]:
        """The state dict without the grading: loads strictly into torch's module."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("grading.")}

    def transform_heads(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return grade_heads(self.variant, self.grading, q, k, v)

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}"


def _tolerate_missing_grading(module: nn.Module, keys: Any) -> None:
    """A plain attention state dict has no grading: keep the current grades when loading it."""
    missing = [k for k in keys.missing_keys if k.split(".")[-2:-1] == ["grading"]]
    for k in missing:
        keys.missing_keys.remove(k)


def _ndim(grades: Any) -> int:
    if isinstance(grades, Tensor):
        return grades.dim()
    if isinstance(grades, (int, float)):
        return 0
    return 1 + (_ndim(grades[0]) if len(grades) and not isinstance(grades[0], (int, float))
                else 0)
