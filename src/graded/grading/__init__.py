"""Grading maps: the diagonal feature scalings of the linearly and exponentially graded models.

- :class:`LinearGrading` is the LGT map M_q = diag(f(q)) (000 Def 5.1, Lemma 5.5, Def 5.37 iv).
- :class:`ExponentialGrading` is the EGT map M_{q,λ} = diag(λ^q) (000 Def 6.1, Prop 6.5;
  001 Def 2.3, where it is called φ_{q,λ}), computed as exp(q·ln λ).

Both hold grades of shape ``(dim,)`` (one grade per feature) or ``(num_heads, dim)`` (one grade
tuple per attention head, 000 Def 5.22 (3)), fixed (a buffer) or learnable (a Parameter).

Rules where the papers are silent (documented once here, tested in ``tests/test_grading.py``):

- *Floors for learnable grades.* Fixed grades are validated once: ``f(q) > 0`` for the linear map,
  ``q >= 0`` for the exponential map. Learnable grades can leave that domain during training, so
  ``scales()`` evaluates them at a floor instead: ``max(f(q), floor)`` for ``f`` in
  {"shift", "identity"} (the two ``f`` that can reach zero) and ``max(q, 0)`` for the
  exponential map. A floor below the least positive value of the scales' dtype is raised to
  it, and learnable "softplus" grades are floored there too (softplus(−30) rounds to 0 in
  float16, softplus(−200) in float32): every scale of learnable grades is positive. The
  clamp is straight-through: the forward value is clamped but the gradient passes as if
  unclamped, so the loss can pull a grade back into the domain (a plain clamp would freeze it
  there for good).
- *Overflow guard (exponential).* The exponent q·ln λ is clamped at ``max_log_scale`` (default:
  half the log of the dtype's largest finite value, minus 1, so that even the squared grading
  of the "queries_keys" attention variant stays finite). The dtype is the compute dtype: the
  grades', or the autocast dtype when narrower. A ``max_log_scale`` may exceed the default
  (where a product of two scales may then overflow), but not the largest exponent whose exp
  is finite in that dtype (ln 65504 ≈ 11.09 in float16, ≈ 88.7 in bfloat16 and float32): a
  larger one is lowered to it, so every scale is finite (``scale_of``: in q's dtype), also as
  rounded to the grades' dtype (bfloat16 grades under a float16 autocast: at most 65280). A clamp
  emits a ``RuntimeWarning``, which says when the cap is a lowered ``max_log_scale``.
  The check that warns needs the exponent's value on the host; it runs at construction, in
  ``set_grades``, ``max_grade``/``max_scale``, and, for tensors on the CPU, in ``set_base``
  (which annealing calls every step) and in ``scales()`` each time it computes them (fixed
  grades: once per change of grades, base or compute dtype).
  On an accelerator ``scales()`` clamps without synchronising, so it never returns inf or NaN.
  ``scales_at`` (the per-token grades s·q, :class:`graded.transformer.graded_stages.TokenGrading`)
  clamps the same way without the check: a clamp there does not warn.
- *Fixed grades are computed once.* ``scales()`` of a grading with fixed grades is kept and
  returned again until the grades, the base, an option (``f``, ``floor``, ``max_log_scale``,
  each checked when set) or the autocast dtype change (seen through the
  tensors' version counters: ``set_grades``, ``set_base``, ``load_state_dict``, any in-place
  operation; writing through ``.data`` is not seen). A returned tensor that its receiver
  changes in place is not returned again: the scales are computed afresh. Learnable grades are
  computed afresh each call, once per forward pass of a model.
- *Narrow grades.* Grades in bfloat16 or float16 give scales in that dtype, but every scale
  (``scales``, ``scales_at``, ``inverse_scales``, the rows of ``stacked_scales``; EGT's
  ``scale_of`` too) is computed in float32 and rounded once at the end: computed in the half
  dtype, EGT's 2^10 came out as 1000 in bfloat16 and 2^3 as 8.0078 in float16. Gradients reach
  the grades in their own dtype. LGT's f(q) is finite in q's dtype (|f(q)| ≤ |q| + 1), but the
  per-token s·q of ``scales_at`` need not be: there a scale beyond the dtype's largest finite
  value saturates at it.
- *λ = 1.* The constructor requires λ > 1 (000 Def 6.1). ``set_base`` also accepts λ = 1 because
  the annealing schedule λ_t = 1 + (λ_max − 1)t/T of 000 §7.2 (iii) starts there (M = I).

A diagonal grading next to a linear map is folded into the map's weights by the graded models
(:mod:`graded.folding`); :func:`is_diagonal` says which gradings can be, and
:func:`graded.folding.activation_grading` (importable from here too) switches folding off for a
while.

The package's modules: :mod:`~graded.grading.grades` (grade tensors and their validation),
:mod:`~graded.grading.base` (:class:`GradingMap`), :mod:`~graded.grading.batching` (the scales
of several gradings at once),
:mod:`~graded.grading.linear` and :mod:`~graded.grading.exponential` (the two maps). Import
from ``graded.grading``.
"""

# activation_grading is re-exported: user code has it from here (docs/models.md before folding.py)
from graded.folding import activation_grading
from graded.grading.base import (
    GradingMap,
    _is_parameter,  # noqa: F401  (imported from here by tests/test_grading_kept_scales.py)
    is_diagonal,
)
from graded.grading.batching import batched_scales, shared_scales, stacked_scales
from graded.grading.exponential import ExponentialGrading
from graded.grading.grades import GradesLike, as_grade_tensor, straight_through_floor
from graded.grading.linear import LINEAR_FUNCTIONS, LinearGrading

__all__ = [
    "GRADINGS",
    "LINEAR_FUNCTIONS",
    "ExponentialGrading",
    "GradesLike",
    "GradingMap",
    "LinearGrading",
    "activation_grading",
    "as_grade_tensor",
    "batched_scales",
    "is_diagonal",
    "shared_scales",
    "stacked_scales",
    "straight_through_floor",
]

# The grading kinds: LinearGrading (LGT, 000 §5) and ExponentialGrading (EGT, 000 §6).
GRADINGS = ("linear", "exponential")
