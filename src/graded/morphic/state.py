"""Graded hidden state H = ⊕_g H_g stored as one tensor with named slices (004 Def 2.1, §4.1).

A state is a tensor ``z`` of shape (..., D) with D = Σ_g d_g; grade ``g`` owns the contiguous
slice ``space.slices[g]``. Projections π_g and inclusions ι_g are slicing and zero padding, so
π_g ι_h = δ_{gh} Id and Σ_g ι_g π_g = Id hold exactly (tested). Grades are labelled; an integer
``index`` is optional and only needed by banded edge sets (h = g + δ) and by ``ConjugatedBlocks``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

# labels key nn.ModuleDicts (``Router.proj_v``, ``GradewiseNorm.norms``), which refuse the names
# of their own attributes ("values", "keys", "type", "training", ...)
_LABEL_HOLDER = nn.ModuleDict()


@dataclass(frozen=True)
class Grade:
    """One homogeneous component V_g: a label, its dimension d_g and an optional integer index."""

    label: str
    dim: int
    index: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label or "." in self.label:
            raise ValueError(f"grade label must be a non-empty string without '.' (labels name "
                             f"the per-grade router and norm modules), got {self.label!r}")
        if hasattr(_LABEL_HOLDER, self.label):  # add_module raises a bare KeyError on these
            raise ValueError(f"grade label {self.label!r} is the name of an attribute of "
                             f"nn.ModuleDict, which holds the per-grade router and norm modules; "
                             f"expected another label (e.g. {self.label + '_'!r})")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim <= 0:
            raise ValueError(f"grade {self.label!r}: dim must be a positive int, got {self.dim!r}")
        if self.index is not None and (isinstance(self.index, bool)
                                       or not isinstance(self.index, int)):
            raise TypeError(
                f"grade {self.label!r}: index must be an int or None, got {self.index!r}")


class GradedStateSpace:
    """The graded space V = ⊕_g V_g with fixed slice layout (004 Def 2.1).

    ``GradedStateSpace({"sem": 16, "num": 11})`` or ``GradedStateSpace([Grade("g0", 8, 0), ...])``.
    """

    def __init__(self, grades: Mapping[str, int] | Sequence[Grade | tuple]) -> None:
        if isinstance(grades, Mapping):
            items = [Grade(label, dim) for label, dim in grades.items()]
        else:
            items = [g if isinstance(g, Grade) else Grade(*g) for g in grades]
        if not items:
            raise ValueError("a graded space needs at least one grade, got none")
        labels = [g.label for g in items]
        if len(set(labels)) != len(labels):
            raise ValueError(f"grade labels must be unique, got {labels}")
        indices = [g.index for g in items if g.index is not None]
        if len(set(indices)) != len(indices):
            raise ValueError(f"grade indices must be unique, got {indices}")
        self.grades: tuple[Grade, ...] = tuple(items)
        self.labels: tuple[str, ...] = tuple(labels)
        self.slices: dict[str, slice] = {}
        offset = 0
        for g in items:
            self.slices[g.label] = slice(offset, offset + g.dim)
            offset += g.dim
        self.total_dim = offset

    # ----------------------------------------------------------------- lookup
    def __len__(self) -> int:
        return len(self.grades)

    def __contains__(self, label: object) -> bool:
        return label in self.slices

    def __repr__(self) -> str:
        parts = ", ".join(f"{g.label}:{g.dim}" for g in self.grades)
        return f"GradedStateSpace({parts})"

    def grade(self, label: str) -> Grade:
        self.check(label)
        return self.grades[self.labels.index(label)]

    def dim(self, label: str) -> int:
        return self.grade(label).dim

    def position(self, label: str) -> int:
        """Position of a grade in the layout (0-based)."""
        self.check(label)
        return self.labels.index(label)

    def index(self, label: str) -> int:
        """Integer index of a grade; raises if the grade has none."""
        g = self.grade(label)
        if g.index is None:
            raise ValueError(f"grade {label!r} has no integer index (needed for banded structure)")
        return g.index

    def label_at_index(self, index: int) -> str | None:
        for g in self.grades:
            if g.index == index:
                return g.label
        return None

    def check(self, label: str) -> None:
        if label not in self.slices:
            raise ValueError(f"unknown grade {label!r}; expected one of {list(self.labels)}")

    def check_state(self, z: Tensor) -> None:
        if not isinstance(z, Tensor):
            raise TypeError(f"state must be a Tensor, got {type(z).__name__}")
        if z.shape[-1] != self.total_dim:
            raise ValueError(
                f"state last dimension is {z.shape[-1]}, expected Σ d_g = {self.total_dim}"
            )

    # ----------------------------------------------------- projections π and ι
    def project(self, z: Tensor, label: str) -> Tensor:
        """π_g z: the component z^{(g)} (a view)."""
        self.check(label)
        return z[..., self.slices[label]]

    def include(self, x: Tensor, label: str) -> Tensor:
        """ι_g x: the element of V with component x in grade g and zeros elsewhere."""
        self.check(label)
        s = self.slices[label]
        if x.shape[-1] != s.stop - s.start:
            raise ValueError(
                f"component for grade {label!r} has size {x.shape[-1]}, expected {s.stop - s.start}"
            )
        out = x.new_zeros(*x.shape[:-1], self.total_dim)
        out[..., s] = x
        return out

    def split(self, z: Tensor) -> dict[str, Tensor]:
        """All components at once. One ``torch.split`` has a single backward (a concatenation);
        separate slices would each build a zero-filled gradient of the full state."""
        self.check_state(z)
        parts = torch.split(z, [g.dim for g in self.grades], dim=-1)
        return dict(zip(self.labels, parts))

    def join(self, parts: Mapping[str, Tensor]) -> Tensor:
        """Σ_g ι_g x_g from a dict holding every grade."""
        missing = [g for g in self.labels if g not in parts]
        if missing:
            raise ValueError(f"missing components for grades {missing}")
        extra = [g for g in parts if g not in self.slices]
        if extra:
            raise ValueError(f"unknown grades {extra}; expected {list(self.labels)}")
        return torch.cat([parts[g] for g in self.labels], dim=-1)

    def replace(self, z: Tensor, label: str, x: Tensor) -> Tensor:
        """z − ι_h z^{(h)} + ι_h x: the replacement update of 004 Prop 3.3 (out of place).

        ``x`` is the new component (…, d_h); its last dimension must be d_h (a narrower one
        would broadcast into the slot)."""
        self.check(label)
        self.check_state(z)
        d = self.dim(label)
        if not isinstance(x, Tensor) or x.dim() == 0 or x.shape[-1] != d:
            raise ValueError(f"component for grade {label!r} has shape "
                             f"{tuple(getattr(x, 'shape', ()))}, expected (..., {d})")
        out = z.clone()
        out[..., self.slices[label]] = x
        return out

    def grade_mask(self, labels: Iterable[str], device: torch.device | None = None) -> Tensor:
        """Boolean (D,) mask that is True on the slices of the given grades."""
        mask = torch.zeros(self.total_dim, dtype=torch.bool, device=device)
        for g in labels:
            self.check(g)
            mask[self.slices[g]] = True
        return mask
