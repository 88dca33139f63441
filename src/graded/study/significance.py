"""Families of paired comparisons: :func:`paired_t_p_value` (two-sided paired t-test, its tail
from :mod:`graded.study.distributions`) and :func:`holm` (Holm 1979, step-down correction of
the family's p-values).
"""

from __future__ import annotations

import math

import numpy as np

from graded.study.distributions import _check_level, _t_two_sided_tail

__all__ = ["holm", "paired_t_p_value"]


def paired_t_p_value(differences) -> float:
    """Two-sided p-value of the paired t-test of "the mean difference is 0": t = mean/(s/√n)
    with n − 1 degrees of freedom, p = I_{ν/(ν+t²)}(ν/2, 1/2). Needs at least two
    differences; a constant sample gives 1.0 at 0 and 0.0 elsewhere."""
    d = np.asarray(differences, dtype=np.float64).ravel()
    if d.size < 2:
        raise ValueError(f"paired_t_p_value needs at least two differences, got {d.size}")
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return 1.0 if float(d.mean()) == 0.0 else 0.0
    t = float(d.mean()) / (sd / math.sqrt(d.size))
    return _t_two_sided_tail(t, d.size - 1.0)


def holm(p_values, level: float = 0.05) -> list[bool]:
    """Holm's step-down rejections for a family of p-values (True = rejected at ``level``).

    A non-finite p-value (a comparison that could not be tested, e.g. a diverged run) counts
    as 1: it is never rejected and still counts in the family's size. A finite p-value outside
    [0, 1], or a level outside (0, 1), raises."""
    _check_level(level, "holm", example=0.05)
    p = np.asarray(p_values, dtype=np.float64).ravel()
    bad = np.isfinite(p) & ((p < 0.0) | (p > 1.0))
    if bad.any():
        raise ValueError(f"holm needs p-values in [0, 1] (or nan for an untested comparison), "
                         f"got {p[bad].tolist()}")
    p = np.where(np.isfinite(p), p, 1.0)
    order = np.argsort(p)
    reject = [False] * p.size
    for rank, i in enumerate(order):
        if p[i] > level / (p.size - rank):
            break
        reject[int(i)] = True
    return reject

