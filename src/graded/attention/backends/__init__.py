"""Attention backends chosen by name: exact, sparse-pattern and approximate attention.

Every backend is an :class:`AttentionBackend` module with the call
``backend(q, k, v, *, key_padding_mask=None, attn_mask=None, is_causal=False, dropout_p=0.0)``
on per-head tensors (B, H, T, D) before the softmax scaling (see :mod:`.base`). These are the
answers to attention's quadratic cost that 002 §4.3.2 and §7.2 name; their formulas come from
the original papers cited in each class (and in ``docs/efficient_attention.md``).

Grading composes with every backend: graded attention scales q (or v) by the grading diagonal
before calling the backend, so the grading acts before any feature map, hash or projection.

>>> backend = get_backend("sliding_window", window=64)
>>> available_backends()[:3]
['bigbird', 'block_sparse', 'chunked']
"""

from __future__ import annotations

import inspect

from graded.attention.backends.base import (
    FEATURES,
    AttentionBackend,
    Capabilities,
    DecodeState,
    capabilities_of,
    decodes_with_state,
)
from graded.attention.backends.chunked import ChunkedBackend, chunked_attention
from graded.attention.backends.dense import ExplicitBackend, FullBackend
from graded.attention.backends.fixed import SparseFixedBackend
from graded.attention.backends.linear import LinearBackend, elu_feature_map, kernel_attention
from graded.attention.backends.linformer import LinformerBackend
from graded.attention.backends.local import DilatedBackend, SlidingWindowBackend
from graded.attention.backends.lsh import LSHBackend
from graded.attention.backends.performer import (
    PerformerBackend,
    draw_random_features,
    favor_features,
)
from graded.attention.backends.sparse import BigBirdBackend, BlockSparseBackend

__all__ = [
    "FEATURES",
    "AttentionBackend",
    "BigBirdBackend",
    "BlockSparseBackend",
    "Capabilities",
    "ChunkedBackend",
    "DecodeState",
    "DilatedBackend",
    "ExplicitBackend",
    "FullBackend",
    "LSHBackend",
    "LinearBackend",
    "LinformerBackend",
    "PerformerBackend",
    "SlidingWindowBackend",
    "SparseFixedBackend",
    "available_backends",
    "backend_capabilities",
    "backends_supporting",
    "capabilities_of",
    "check_capability",
    "chunked_attention",
    "decodes_with_state",
    "draw_random_features",
    "elu_feature_map",
    "favor_features",
    "get_backend",
    "kernel_attention",
    "register_backend",
]

_REGISTRY: dict[str, type[AttentionBackend]] = {}


def register_backend(cls: type[AttentionBackend]) -> type[AttentionBackend]:
    """Register a backend class under ``cls.name`` (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, AttentionBackend)):
        raise TypeError(f"register_backend expects an AttentionBackend subclass, got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"backend class {cls.__name__} needs a non-empty string `name`")
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(
            f"backend name {name!r} is already registered to {existing.__name__}"
        )
    _REGISTRY[name] = cls
    return cls


def available_backends() -> list[str]:
    """Registered backend names, sorted."""
    return sorted(_REGISTRY)


def backend_capabilities(name: str) -> Capabilities:
    """The declared :class:`Capabilities` of the backend registered as ``name``."""
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown attention backend {name!r}; available: {', '.join(available_backends())}"
        )
    return _REGISTRY[name].capabilities


def backends_supporting(*features: str) -> list[str]:
    """Registered backend names whose declared capabilities include every one of ``features``
    (names of :class:`Capabilities` fields), sorted."""
    unknown = sorted(set(features) - set(FEATURES))
    if unknown:
        raise ValueError(f"unknown backend feature(s) {unknown}; expected names from "
                         f"{sorted(FEATURES)}")
    return [n for n in available_backends()
            if all(getattr(_REGISTRY[n].capabilities, f) for f in features)]


def check_capability(backend: object, name: str, feature: str, where: str = "") -> None:
    """Raise ``ValueError`` if ``backend`` (an instance or class) does not declare ``feature``.

    The message names the backend, the feature (with ``where``, e.g. the config field that
    asked for it) and the registered backends that can serve it."""
    if getattr(capabilities_of(backend), feature):
        return
    able = backends_supporting(feature)
    raise ValueError(
        f"attention backend {name!r} cannot serve {FEATURES[feature]}{where}; backends that "
        f"can: {', '.join(able) if able else '(none)'}"
    )


def get_backend(name: str, **options: object) -> AttentionBackend:
    """Build the backend registered as ``name`` with keyword ``options``.

    Unknown names and unknown options raise ``ValueError`` naming the allowed ones."""
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown attention backend {name!r}; available: {', '.join(available_backends())}"
        )
    cls = _REGISTRY[name]
    params = inspect.signature(cls.__init__).parameters
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = {p: spec for p, spec in params.items() if p != "self" and spec.kind not in variadic}
    takes_any = any(spec.kind is inspect.Parameter.VAR_KEYWORD for spec in params.values())
    unknown = sorted(set(options) - set(named))
    if unknown and not takes_any:
        raise ValueError(
            f"attention backend {name!r} has no option(s) {', '.join(unknown)}; allowed: "
            f"{', '.join(named) if named else '(none)'}"
        )
    missing = [
        p for p, spec in named.items()
        if spec.default is inspect.Parameter.empty and p not in options
    ]
    if missing:
        raise ValueError(
            f"attention backend {name!r} needs option(s) {', '.join(missing)} "
            "(pass them as keyword options, e.g. a config's attn_backend_options)"
        )
    return cls(**options)


for _cls in (
    FullBackend, ExplicitBackend, ChunkedBackend, SlidingWindowBackend, DilatedBackend,
    SparseFixedBackend, BlockSparseBackend, BigBirdBackend, LinearBackend, PerformerBackend,
    LinformerBackend, LSHBackend,
):
    register_backend(_cls)
