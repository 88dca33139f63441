"""``MorphicConfig``: a serialisable description of a ``MorphicTransformer`` (for the trainer/CLI).

Generic models (linear, FFN or grade-typed attention blocks on explicit or banded edges) are
built from the config alone; the 004 §5.3 tasks with fixed or external tools are named presets
(``preset="variable_addition"`` with ``preset_options``: p, shifts, tool). Unknown keys raise.

Example (YAML)::

    vocab_size: 32
    grades: [{label: g0, dim: 16, index: 0}, {label: g1, dim: 16, index: 1}]
    layers:
      - {banded: [0, 1], block: ffn, block_options: {hidden: 32}, router: {rank: 8}}
      - {edges: [[g0, g1, att]], block: attention, block_options: {num_heads: 2, head_dim: 8}}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from graded.morphic.attention_block import GradeTypedAttention
from graded.morphic.blocks import FFNBlock, LinearBlock
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.model import MorphicObjective, MorphicTransformer
from graded.morphic.state import Grade, GradedStateSpace

_LAYER_KEYS = {"edges", "banded", "block", "block_options", "router", "update", "pre_norm",
               "eta", "beta", "thresholds", "train_routing"}
BLOCKS = ("linear", "ffn", "attention")


@dataclass
class MorphicConfig:
    vocab_size: int = 0
    grades: list[dict[str, Any]] = field(default_factory=list)
    layers: list[dict[str, Any]] = field(default_factory=list)
    max_len: int = 256
    positional: str = "learned"
    objective: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    preset_options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MorphicConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(
                f"unknown MorphicConfig keys {unknown}; expected some of {sorted(names)}")
        cfg = cls(**data)
        for i, layer in enumerate(cfg.layers):
            bad = sorted(set(layer) - _LAYER_KEYS)
            if bad:
                raise ValueError(f"layer {i}: unknown keys {bad}; expected some of "
                                 f"{sorted(_LAYER_KEYS)}")
        return cfg


def _block(kind: str, d_in: int, d_out: int, options: dict[str, Any]):
    if kind == "linear":
        return LinearBlock(d_in, d_out, **options)
    if kind == "ffn":
        return FFNBlock(d_in, d_out, **{"hidden": 4 * max(d_in, d_out), **options})
    if kind == "attention":
        return GradeTypedAttention(d_in, d_out, **options)
    raise ValueError(f"block must be one of {BLOCKS}, got {kind!r}")


def build_morphic_model(config: MorphicConfig | dict[str, Any]) -> MorphicTransformer:
    """A ``MorphicTransformer`` from a config (or a preset task model)."""
    cfg = config if isinstance(config, MorphicConfig) else MorphicConfig.from_dict(config)
    objective = MorphicObjective(**cfg.objective)
    if cfg.preset is not None:
        if cfg.preset != "variable_addition":
            raise ValueError(f"preset must be 'variable_addition' or None, got {cfg.preset!r}")
        from graded.morphic.tasks.adder import VariableAdditionTask, build_adder_model

        opts = dict(cfg.preset_options)
        task = VariableAdditionTask(opts.pop("p", 11), opts.pop("shifts", (1, 2, 3, 4)))
        return build_adder_model(task, objective=objective, **opts)
    if not cfg.grades or not cfg.layers:
        raise ValueError("a config without preset needs grades and layers")
    space = GradedStateSpace([Grade(g["label"], g["dim"], g.get("index")) for g in cfg.grades])
    layers = []
    for spec in cfg.layers:
        if ("edges" in spec) == ("banded" in spec):
            raise ValueError(f"a layer needs exactly one of 'edges' or 'banded', got {spec}")
        edges = (EdgeSet.banded(space, spec["banded"]) if "banded" in spec
                 else EdgeSet.explicit(space, [tuple(e) for e in spec["edges"]]))
        kind, opts = spec.get("block", "linear"), spec.get("block_options", {})
        blocks = [_block(kind, space.dim(e.source), space.dim(e.dest), dict(opts)) for e in edges]
        layers.append(MorphicLayer(
            space, edges, blocks, router=spec.get("router"),
            update=spec.get("update", "gated_replace"), pre_norm=spec.get("pre_norm", "layer"),
            eta=spec.get("eta", 1.0), beta=spec.get("beta", 5.0),
            thresholds=spec.get("thresholds", 0.0),
            train_routing=spec.get("train_routing", "utility")))
    return MorphicTransformer(space, layers, cfg.vocab_size, max_len=cfg.max_len,
                              positional=cfg.positional, objective=objective)
