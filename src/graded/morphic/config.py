"""``MorphicConfig``: a serialisable description of a ``MorphicTransformer`` (for the trainer/CLI).

A :class:`graded._schema.ConfigModel` like every config of the library: the grades, the layers
(:class:`MorphicLayerSpec`), each layer's router (:class:`RouterOptions`) and block options
(:class:`LinearBlockOptions`, :class:`FFNBlockOptions` or :class:`AttentionBlockOptions`, by
``block``) are typed models, so a typo anywhere is a ``ValueError`` naming the key and the
allowed ones, before any module is built.

Generic models (linear, FFN or grade-typed attention blocks on explicit or banded edges) are
built from the config alone; the 004 §5.3 tasks with fixed or external tools are named presets
(``preset="variable_addition"`` with ``preset_options``: p, shifts, tool, ...).

Defaults are the same whether a config is written in Python or YAML. A layer's ``pre_norm``
defaults to ``"layer"`` (a grade-wise LayerNorm before the blocks, as the YAML configs have
always been built), not to :class:`MorphicLayer`'s own ``None``, which hand-built layers with
fixed tools (the presets) keep.

Example (YAML)::

    vocab_size: 32
    grades: [{label: g0, dim: 16, index: 0}, {label: g1, dim: 16, index: 1}]
    layers:
      - {banded: [0, 1], block: ffn, block_options: {hidden: 32}, router: {rank: 8}}
      - {edges: [[g0, g1, att]], block: attention, block_options: {num_heads: 2, head_dim: 8}}
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import BeforeValidator, Field, SerializeAsAny, model_validator
from torch import nn

from graded._schema import (
    ConfigModel,
    Invalid,
    Strict,
    is_int,
    is_number,
    not_a_key,
    positive_int,
    satisfies,
)
from graded.morphic.attention_block import GradeTypedAttention
from graded.morphic.blocks import FFNBlock, LinearBlock
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import EXECUTIONS, MorphicLayer
from graded.morphic.model import MorphicObjective, MorphicTransformer
from graded.morphic.router import INPUT_TYPES, MODES, NORMALIZATIONS, POOLINGS
from graded.morphic.state import Grade, GradedStateSpace
from graded.morphic.update import UPDATE_MODES

__all__ = [
    "BLOCKS",
    "BLOCK_OPTIONS",
    "PRESETS",
    "AttentionBlockOptions",
    "FFNBlockOptions",
    "GradeSpec",
    "LinearBlockOptions",
    "MorphicConfig",
    "MorphicLayerSpec",
    "RouterOptions",
    "VariableAdditionOptions",
    "build_morphic_model",
]

PositiveInt = Annotated[int, positive_int()]
PositiveFinite = Annotated[float, satisfies(lambda v: is_number(v) and 0 < v < math.inf,
                                            "a finite number > 0")]
NonNegativeFinite = Annotated[float, satisfies(lambda v: is_number(v) and 0 <= v < math.inf,
                                               "a finite number >= 0")]
# a list of ints as written: pydantic's lax list[int] reads True as 1 and 1.0 as 1, which
# ``EdgeSet.banded``, ``Router`` and the adder task refuse when called directly
def _is_int_list(v: Any) -> bool:
    return isinstance(v, list | tuple) and all(is_int(x) for x in v)


IntList = Annotated[list[int], satisfies(_is_int_list, "a list of ints")]


class BlockOptions(Strict):
    """Keyword options of one block kind; :meth:`build` makes the block for one edge."""

    @abc.abstractmethod
    def build(self, d_in: int, d_out: int) -> nn.Module:
        """The block of an edge from a grade of dimension ``d_in`` to one of ``d_out``."""


class LinearBlockOptions(BlockOptions):
    """:class:`graded.morphic.blocks.LinearBlock`'s options."""

    bias: bool = False
    init: str = "default"

    def build(self, d_in: int, d_out: int) -> nn.Module:
        return LinearBlock(d_in, d_out, **self.model_dump())


class FFNBlockOptions(BlockOptions):
    """:class:`graded.morphic.blocks.FFNBlock`'s options; ``hidden`` None is 4·max(d_in, d_out)."""

    hidden: Annotated[int | None, positive_int(optional=True)] = None
    activation: str = "gelu"
    bias: bool = False

    def build(self, d_in: int, d_out: int) -> nn.Module:
        hidden = self.hidden if self.hidden is not None else 4 * max(d_in, d_out)
        return FFNBlock(d_in, d_out, **{**self.model_dump(), "hidden": hidden})


class AttentionBlockOptions(BlockOptions):
    """:class:`graded.morphic.attention_block.GradeTypedAttention`'s options."""

    num_heads: PositiveInt = 1
    head_dim: PositiveInt = 16
    value_source: str = "dest"
    key_source: str = "dest"
    identity_values: bool = False

    def build(self, d_in: int, d_out: int) -> nn.Module:
        return GradeTypedAttention(d_in, d_out, **self.model_dump())


# The block kinds a layer spec names, each with its options.
BLOCK_OPTIONS: dict[str, type[BlockOptions]] = {
    "linear": LinearBlockOptions, "ffn": FFNBlockOptions, "attention": AttentionBlockOptions,
}
BLOCKS = tuple(BLOCK_OPTIONS)


class RouterOptions(Strict):
    """:class:`graded.morphic.router.Router`'s options (004 §4.2), refused here where the
    router would refuse them: ``temperature`` and ``gumbel_temperature`` finite and > 0 (a
    temperature of 0 or below routes silently wrong), ``init_std`` finite and >= 0."""

    rank: PositiveInt = 16
    pooling: Literal[POOLINGS] = "mean"
    temperature: PositiveFinite = 1.0
    normalization: Literal[NORMALIZATIONS] = "dest"
    mode: Literal[MODES] = "soft"
    affine: bool = True
    init_std: NonNegativeFinite = 0.02
    gumbel_temperature: PositiveFinite = 1.0
    stay: bool = True
    top_k: PositiveInt = 1
    input_type: Literal[INPUT_TYPES] = "context"
    operator_tokens: Annotated[tuple[int, ...], satisfies(_is_int_list, "a list of ints")] = ()

    @model_validator(mode="after")
    def _consistent(self) -> RouterOptions:
        if self.top_k > 1 and (self.mode != "hard" or self.normalization == "logistic"):
            raise Invalid(f"top_k = 1 unless mode is 'hard' with normalization 'global' or "
                          f"'dest' (got mode {self.mode!r}, normalization "
                          f"{self.normalization!r})", "top_k", self.top_k)
        if self.input_type == "context" and self.operator_tokens:
            raise Invalid("no operator_tokens with input_type 'context' (only 'operator' and "
                          "'operator_state' read them)", "operator_tokens", self.operator_tokens)
        if self.input_type != "context":
            tokens = self.operator_tokens
            if not tokens or min(tokens) < 0 or len(set(tokens)) != len(tokens):
                raise Invalid(f"a non-empty list of distinct token ids >= 0 for input_type "
                              f"{self.input_type!r}", "operator_tokens", tokens)
        return self


class GradeSpec(Strict):
    """One grade V_g of the state space: label, dimension d_g and optional integer index."""

    label: str
    dim: PositiveInt
    index: Annotated[int | None, satisfies(is_int, "an int", optional=True)] = None


def _typed_block_options(data: Any) -> Any:
    """Read ``block_options`` as the options model of the layer's ``block``."""
    if not isinstance(data, dict):
        return data
    kind = data.get("block", "linear")
    options = data.get("block_options")
    model = BLOCK_OPTIONS.get(kind)
    if model is None or type(options) is model:
        return data
    options = {} if options is None else options
    if isinstance(options, BlockOptions):
        options = options.model_dump()
    if not isinstance(options, dict):
        raise Invalid(f"a mapping of {kind!r} block options", "block_options", options)
    for key in options:
        if key not in model.model_fields:
            error = not_a_key(key, model.model_fields, f"options of a {kind!r} block")
            raise Invalid(error.expected, "block_options", options)
    return {**data, "block_options": model(**options)}


class MorphicLayerSpec(Strict):
    """One :class:`MorphicLayer`: its edges (explicit ``[source, dest, name]`` triples or
    ``banded`` index shifts, 004 §4.1; ``dag: true`` refuses them unless they are acyclic apart
    from self-loops, ``EdgeSet.dag``), one block kind for every edge with its options, the
    router (004 §4.2), the update rule and the routing hyperparameters."""

    edges: list[list[str]] | None = None
    banded: Annotated[list[int] | None, satisfies(_is_int_list, "a list of ints",
                                                  optional=True)] = None
    dag: bool = False
    block: Literal[BLOCKS] = "linear"
    block_options: SerializeAsAny[BlockOptions] = Field(default_factory=LinearBlockOptions)
    router: RouterOptions | None = None
    update: Literal[UPDATE_MODES] = "gated_replace"
    pre_norm: str | None = "layer"
    eta: float = 1.0
    beta: Annotated[float, satisfies(lambda v: is_number(v) and v > 0, "a number > 0")] = 5.0
    thresholds: Annotated[
        float | list[float],
        satisfies(lambda v: all(is_number(x) and math.isfinite(x) and x >= 0
                                for x in (v if isinstance(v, list) else [v])),
                  "a number >= 0 or a list of them (004 §3.3: τ_e ≥ 0)")] = 0.0
    execution: Literal[EXECUTIONS] = "auto"
    train_routing: str = "context"

    @model_validator(mode="before")
    @classmethod
    def _typed(cls, data: Any) -> Any:
        return _typed_block_options(data)

    @model_validator(mode="after")
    def _one_edge_source(self) -> MorphicLayerSpec:
        if (self.edges is None) == (self.banded is None):
            raise Invalid("exactly one of 'edges' or 'banded'", "edges", self.edges)
        for edge in self.edges or []:
            if len(edge) != 3:
                raise Invalid("[source, dest, name] triples", "edges", self.edges)
        return self

    def build(self, space: GradedStateSpace) -> MorphicLayer:
        edges = (EdgeSet.banded(space, self.banded) if self.banded is not None
                 else EdgeSet.explicit(space, [tuple(e) for e in self.edges or []]))
        if self.dag:  # the same edges, refused unless acyclic apart from self-loops
            edges = EdgeSet.dag(space, edges)
        blocks = [self.block_options.build(space.dim(e.source), space.dim(e.dest))
                  for e in edges]
        router = self.router.model_dump() if self.router is not None else None
        return MorphicLayer(
            space, edges, blocks, router=router, update=self.update, pre_norm=self.pre_norm,
            eta=self.eta, beta=self.beta, thresholds=self.thresholds,
            execution=self.execution, train_routing=self.train_routing)


class VariableAdditionOptions(Strict):
    """Options of the ``variable_addition`` preset (004 §5.3.1; :mod:`.tasks.adder`)."""

    p: Annotated[int, satisfies(lambda v: isinstance(v, int) and v >= 2, "an int >= 2")] = 11
    shifts: IntList = Field(default_factory=lambda: [1, 2, 3, 4])
    tool: Literal["internal", "external"] = "internal"
    sem_dim: PositiveInt = 16
    rank: PositiveInt = 8
    beta: PositiveFinite = 5.0
    pooling: Literal[POOLINGS] = "mean"
    readout_scale: PositiveFinite = 4.0
    router_input: Literal[INPUT_TYPES] = "context"

    sequence_length: ClassVar[int] = 3  # [x, ADD_k, =]

    def task(self) -> Any:
        from graded.morphic.tasks.adder import VariableAdditionTask

        return VariableAdditionTask(self.p, self.shifts)


PRESETS: dict[str, type[VariableAdditionOptions]] = {"variable_addition": VariableAdditionOptions}


def _objective(v: Any) -> Any:
    """Check the objective's keys and values by building it (:class:`MorphicObjective`)."""
    if not isinstance(v, dict):
        raise Invalid("a mapping of MorphicObjective fields")
    known = [f.name for f in dataclasses.fields(MorphicObjective)]
    for key in v:
        if key not in known:
            raise not_a_key(key, known, "MorphicObjective fields")
    try:
        MorphicObjective(**v)
    except (TypeError, ValueError) as exc:
        raise Invalid(f"MorphicObjective fields ({exc})") from None
    return v


class MorphicConfig(ConfigModel):
    """A morphic transformer (004): vocabulary, grades, layers, length, positions, objective.

    ``vocab_size`` and ``max_len`` are the data's (a run config sets them from its task);
    ``max_len`` None is 256 for a generic model and the preset's own length for a preset. A
    preset fixes its vocabulary: a ``vocab_size`` that differs from it is an error."""

    vocab_size: Annotated[int | None, positive_int(optional=True)] = None
    grades: list[GradeSpec] = Field(default_factory=list)
    layers: list[MorphicLayerSpec] = Field(default_factory=list)
    max_len: Annotated[int | None, positive_int(optional=True)] = None
    positional: Literal["learned", "none"] = "learned"
    objective: Annotated[dict[str, Any], BeforeValidator(_objective)] = Field(
        default_factory=dict)
    preset: Literal[tuple(PRESETS)] | None = None
    preset_options: dict[str, Any] = Field(default_factory=dict)

    default_max_len: ClassVar[int] = 256

    @model_validator(mode="after")
    def _complete(self) -> MorphicConfig:
        if self.preset is None:
            if not self.grades or not self.layers:
                raise Invalid("grades and layers (or a preset)", "layers", ...)
            if self.vocab_size is None:
                raise Invalid("a positive integer (required without a preset)", "vocab_size",
                              None)
            if self.preset_options:
                raise Invalid("{} without a preset", "preset_options", self.preset_options)
            for i, layer in enumerate(self.layers):
                tokens = layer.router.operator_tokens if layer.router is not None else ()
                if tokens and max(tokens) >= self.vocab_size:
                    raise Invalid(f"token ids below vocab_size = {self.vocab_size}",
                                  f"layers.{i}.router.operator_tokens", tokens)
            return self
        if self.grades or self.layers:
            raise Invalid(f"no grades or layers with preset {self.preset!r} (it builds its "
                          "own)", "layers", ...)
        try:
            options = self.preset_options_model()
            vocab = options.task().vocab_size
        except Invalid as exc:
            raise Invalid(exc.expected, "preset_options", self.preset_options) from None
        except ValueError as exc:
            raise Invalid(f"options the preset accepts ({exc})", "preset_options",
                          self.preset_options) from None
        if self.vocab_size is not None and self.vocab_size != vocab:
            raise Invalid(f"the vocabulary of preset {self.preset!r} with these options, "
                          f"{vocab} tokens", "vocab_size", self.vocab_size)
        if self.max_len is not None and self.max_len < options.sequence_length:
            raise Invalid(f"at least the preset's sequence length {options.sequence_length}",
                          "max_len", self.max_len)
        return self

    def preset_options_model(self) -> VariableAdditionOptions:
        """The preset's options, typed (unknown keys raise naming them)."""
        model = PRESETS[str(self.preset)]
        for key in self.preset_options:
            if key not in model.model_fields:
                raise not_a_key(key, model.model_fields, f"options of preset {self.preset!r}")
        return model(**self.preset_options)


def build_morphic_model(config: MorphicConfig | dict[str, Any], *,
                        device: torch.device | str | None = None,
                        dtype: torch.dtype | None = None) -> MorphicTransformer:
    """A ``MorphicTransformer`` from a config (or a preset task model), its parameters and
    buffers on ``device`` and, when given, in the floating-point ``dtype`` (as ``.to``)."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    model = _build(config)
    return model if device is None and dtype is None else model.to(device=device, dtype=dtype)


def _build(config: MorphicConfig | dict[str, Any]) -> MorphicTransformer:
    cfg = config if isinstance(config, MorphicConfig) else MorphicConfig.from_dict(config)
    objective = MorphicObjective(**cfg.objective)
    if cfg.preset is not None:
        from graded.morphic.tasks.adder import build_adder_model

        opts = cfg.preset_options_model()
        extra = {} if cfg.max_len is None else {"max_len": cfg.max_len}
        return build_adder_model(opts.task(), objective=objective, **extra, **opts.model_dump(
            exclude={"p", "shifts"}))
    space = GradedStateSpace([Grade(g.label, g.dim, g.index) for g in cfg.grades])
    layers = []
    for i, spec in enumerate(cfg.layers):
        try:
            layers.append(spec.build(space))
        except ValueError as exc:  # a value only the built layer checks: say which layer
            raise ValueError(f"MorphicConfig.layers.{i}: {exc}") from exc
    return MorphicTransformer(space, layers, int(cfg.vocab_size or 0),
                              max_len=cfg.max_len or cfg.default_max_len,
                              positional=cfg.positional, objective=objective)
