"""A small graded multilayer perceptron: a graded network ŷ = φ_m ∘ ... ∘ φ_1(x) (000 §3)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from numbers import Integral

import torch
from torch import Tensor, nn

from graded.checks import check_bool
from graded.grading import GradesLike, as_grade_tensor
from graded.nn.activations import GradedExp, GradedReLU
from graded.nn.graded_layers import GradedLinear, InputGradedLinear

__all__ = ["GradedMLP"]

LAYERS = ("additive", "input")
ACTIVATIONS = ("graded_relu", "graded_relu_threshold", "graded_exp", "relu", "gelu", "tanh")


class GradedMLP(nn.Module):
    """Graded layers with activations between them, usable as a model for regression or
    classification heads.

    Layer l maps ``dims[l] → dims[l+1]`` with ``dims = [in_features, *hidden_features,
    out_features]`` and reads its input with grades ``g[l]``: ``g[0] = grades`` (length
    ``in_features``), ``g[l] = hidden_grades[l-1]`` for the hidden widths (a number or one grade
    tuple per hidden layer; default 1.0). ``layer`` picks the graded layer: ``"additive"``
    (:class:`GradedLinear`, 000 §3: grades in the weights' exponents) or ``"input"``
    (:class:`InputGradedLinear`, 001 Def 2.6: σ(W diag(λ^q) x + b) with λ = ``base``).
    The activation after each hidden layer is graded by the grades of that layer's outputs
    (``graded_relu``: 000 §3.1; ``graded_relu_threshold``: Remark 3.2; ``graded_exp``: Eq. 1),
    or a plain ``relu``/``gelu``/``tanh``. The last layer has no activation.

    A graded network has one grading per hidden space (000 §3): the activation after layer l
    and layer l+1 read the same grades. With ``learnable_grades`` and a graded activation they
    are one Parameter (:meth:`hidden_grade_parameters`), held by the activation and by the
    next layer, so its gradient is the sum of both uses and an optimizer step moves both.
    ``parameters()`` lists it once; ``state_dict()`` holds it under both names (PyTorch's rule
    for shared parameters), and ``load_state_dict`` refuses a checkpoint whose two entries
    differ (one saved before the grades were shared) rather than keep one of them silently.
    ``learnable_grades`` and ``bias`` take True or False only, as the graded layers' do.
    """

    def __init__(self, in_features: int, hidden_features: int | Sequence[int], out_features: int,
                 grades: GradesLike = 1.0, *, layer: str = "additive",
                 activation: str = "graded_relu",
                 hidden_grades: GradesLike | Sequence[GradesLike] = 1.0, base: float = 2.0,
                 learnable_grades: bool = False, bias: bool = True,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        learnable_grades = check_bool("learnable_grades", learnable_grades)
        bias = check_bool("bias", bias)
        if layer not in LAYERS:
            raise ValueError(f"layer must be one of {LAYERS}, got {layer!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        hidden = _hidden_widths(hidden_features)
        dims = [in_features, *hidden, out_features]
        if isinstance(hidden_grades, (int, float)) or (
                isinstance(hidden_grades, Tensor) and hidden_grades.ndim == 0):
            hgrades: list[GradesLike] = [float(hidden_grades)] * len(hidden)
        else:
            # a 0-d tensor (an entry of a 1-d tensor) is one grade for the whole layer
            hgrades = [float(g) if isinstance(g, Tensor) and g.ndim == 0 else g
                       for g in hidden_grades]
            if len(hgrades) != len(hidden):
                raise ValueError(f"hidden_grades has {len(hgrades)} entries but there are "
                                 f"{len(hidden)} hidden layers (one number or grade tuple "
                                 f"per hidden layer: [[q_1, ..., q_n]] for a single one)")
            for i, (g, width) in enumerate(zip(hgrades, hidden)):
                # checked here so that the error names the entry, not a layer's "grades"
                if not isinstance(g, (int, float)):
                    as_grade_tensor(g, dim=width, name=f"hidden_grades[{i}]", allow_heads=False)
        layer_grades = [grades, *hgrades]
        kw = {"device": device, "dtype": dtype}
        mods: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(pairwise(dims)):
            if layer == "additive":
                mods.append(GradedLinear(d_in, d_out, layer_grades[i], bias=bias,
                                         learnable_grades=learnable_grades, **kw))
            else:
                mods.append(InputGradedLinear(d_in, d_out, layer_grades[i], base,
                                              activation="identity", bias=bias,
                                              learnable_grades=learnable_grades, **kw))
            if i < len(dims) - 2:
                mods.append(self._make_activation(activation, layer_grades[i + 1], d_out,
                                                  learnable_grades, kw))
        self.layers = nn.Sequential(*mods)
        self.in_features, self.out_features = in_features, out_features
        # (activation index, next layer index) of each hidden space whose grades are shared
        self._tied: list[tuple[int, int]] = []
        if learnable_grades and activation.startswith("graded"):
            self._tied = [(a, a + 1) for a in range(1, len(mods) - 1, 2)]
        self._tie_grades()
        self.register_load_state_dict_pre_hook(GradedMLP._check_tied_grades)

    def _tie_grades(self) -> None:
        for a, b in self._tied:
            _set_input_grades(self.layers[b], self.layers[a].grades)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> GradedMLP:
        # .to()/.double() keep a shared Parameter shared when they convert in place; a
        # conversion that makes new Parameters (to "meta", or with torch.__future__'s
        # overwrite_module_params_on_conversion) would make one per holder: tie them again
        super()._apply(fn, recurse)
        self._tie_grades()
        return self

    def hidden_grade_parameters(self) -> list[nn.Parameter]:
        """The learnable grades of the hidden spaces, one Parameter per hidden layer (empty
        when the grades are fixed or the activation is not graded)."""
        return [self.layers[a].grades for a, _ in self._tied]

    def _check_tied_grades(self, state_dict: dict, prefix: str, *args: object) -> None:
        """A state dict holds a shared grade vector twice: refuse two different values (a
        checkpoint of untied grades); fill in one that is missing from the other."""
        error_msgs = args[-1]
        for a, b in self._tied:
            key_a = f"{prefix}layers.{a}.grades"
            key_b = f"{prefix}layers.{b}.{_input_grades_name(self.layers[b])}"
            if key_a in state_dict and key_b in state_dict:
                va, vb = state_dict[key_a], state_dict[key_b]
                if va.shape == vb.shape and not torch.equal(va, vb):
                    diff = float((va.double() - vb.double().to(va.device)).abs().max())
                    error_msgs.append(
                        f"{key_a!r} and {key_b!r} are the grades of one hidden space, shared "
                        f"by the activation and the next layer, but the checkpoint holds "
                        f"different values (max difference {diff:.3g}): it was saved with "
                        f"separate copies; copy one entry onto the other to load it")
            elif key_a in state_dict:
                state_dict[key_b] = state_dict[key_a]
            elif key_b in state_dict:
                state_dict[key_a] = state_dict[key_b]

    @staticmethod
    def _make_activation(name: str, grades: GradesLike, features: int, learnable: bool,
                         kw) -> nn.Module:
        if name == "graded_relu":
            return GradedReLU(grades, "abs", learnable, features=features, **kw)
        if name == "graded_relu_threshold":
            return GradedReLU(grades, "threshold", learnable, features=features, **kw)
        if name == "graded_exp":
            return GradedExp(grades, learnable, features=features, **kw)
        return {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}[name]()

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


def _hidden_widths(hidden_features: int | Sequence[int]) -> list[int]:
    """``hidden_features`` as a list of widths, each a positive int (``ValueError`` naming the
    entry otherwise: the layers' own check named it ``out_features``)."""
    if isinstance(hidden_features, Integral) and not isinstance(hidden_features, bool):
        widths, names = [hidden_features], ["hidden_features"]
    elif isinstance(hidden_features, (str, bytes)) or not isinstance(hidden_features, Iterable):
        raise TypeError(f"hidden_features must be an int or a sequence of ints (one width per "
                        f"hidden layer), got {hidden_features!r}")
    else:
        widths = list(hidden_features)
        names = [f"hidden_features[{i}]" for i in range(len(widths))]
    for name, w in zip(names, widths):
        if isinstance(w, bool) or not isinstance(w, Integral) or w < 1:
            raise ValueError(f"{name} must be a positive int (a hidden width), got {w!r}")
    return [int(w) for w in widths]


def _input_grades_name(layer: nn.Module) -> str:
    """Where a graded layer keeps the grades of its input: ``grades`` (GradedLinear) or
    ``grading.grades`` (InputGradedLinear)."""
    return "grading.grades" if isinstance(layer, InputGradedLinear) else "grades"


def _set_input_grades(layer: nn.Module, grades: nn.Parameter) -> None:
    """Make ``grades`` (same shape and dtype) the learnable input grades of ``layer``."""
    owner = layer.grading if isinstance(layer, InputGradedLinear) else layer
    if owner.grades.shape != grades.shape or owner.grades.dtype != grades.dtype:
        raise ValueError(f"cannot share grades of shape {tuple(grades.shape)} with a layer "
                         f"whose input grades have shape {tuple(owner.grades.shape)}")
    owner.grades = grades
