"""Registry of PatternBoost problems by name, so runs, workers and the CLI can rebuild them.

A problem class is added with :func:`register_problem` (usable as a class decorator), which
refuses a name already taken by another class, a shipped problem's included. :data:`PROBLEMS`
and :data:`SIZE_ARGUMENT` (the constructor argument each problem's size sets, its class's
`size_argument`) are read-only views of the registry, so that no assignment can silently
replace a problem or change what its size sets.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn, TypeVar

from .graphs import C4Free, TriangleFree
from .hypercube import HypercubeDiameter
from .permanent import PatternAvoidingPermanent
from .problem import Problem

__all__ = ["PROBLEMS", "SIZE_ARGUMENT", "make_problem", "problem_arguments",
           "problem_from_size", "register_problem"]

_P = TypeVar("_P", bound=type[Problem])
_V = TypeVar("_V")

_REGISTRY: dict[str, type[Problem]] = {}


class _RegistryView(Mapping[str, _V]):
    """Read-only view of the registered problems, each seen through `see` (the class, or what
    the class declares): writes are refused with `refusal`, which points at
    :func:`register_problem`."""

    def __init__(self, label: str, see: Callable[[type[Problem]], _V], refusal: str) -> None:
        self._label, self._see, self._refusal = label, see, refusal

    def __getitem__(self, name: str) -> _V:
        return self._see(_REGISTRY[name])

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return f"{self._label}({dict(self)!r})"

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(self._refusal)

    __setitem__ = __delitem__ = pop = popitem = setdefault = update = clear = _refuse


PROBLEMS: Mapping[str, type[Problem]] = _RegistryView(
    "PROBLEMS", lambda cls: cls,
    "graded.search.patternboost.PROBLEMS is read-only: add a problem class with "
    "graded.search.patternboost.register_problem(cls), which refuses a name already taken")

#: The constructor argument that the size (`PatternBoostConfig.n`, the command line's --n)
#: sets, per registered problem: the class's `size_argument`, checked by `register_problem`.
SIZE_ARGUMENT: Mapping[str, str] = _RegistryView(
    "SIZE_ARGUMENT", lambda cls: cls.size_argument,
    "graded.search.patternboost.problems.SIZE_ARGUMENT is read-only: a problem class names "
    "the constructor argument its size sets as its `size_argument` (default 'n'), which "
    "graded.search.patternboost.register_problem(cls) checks and records")


def register_problem(cls: _P) -> _P:
    """Registers the `Problem` subclass `cls` under `cls.name` and returns it (so it also works
    as a class decorator). A name already registered to another class, a shipped problem's
    included, is refused naming both classes; registering the same class again (its module
    imported again) is a no-op. `cls.size_argument` must name a constructor argument (it is
    what `n` sets)."""
    if not (isinstance(cls, type) and issubclass(cls, Problem)):
        raise TypeError(f"register_problem expects a Problem subclass, got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"problem class {cls.__qualname__} needs a non-empty string `name`, "
                         f"got {name!r}")
    size, accepted = cls.size_argument, problem_arguments(cls)
    if not isinstance(size, str) or not size or (accepted is not None and size not in accepted):
        expected = "a non-empty string" if accepted is None else f"one of {sorted(accepted)}"
        raise ValueError(f"problem class {cls.__qualname__} has size_argument={size!r}: "
                         f"expected the constructor argument its size sets, {expected}")
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"problem {name!r} is already registered to "
                         f"{existing.__module__}.{existing.__qualname__}; register "
                         f"{cls.__module__}.{cls.__qualname__} under another `name`")
    _REGISTRY[name] = cls
    return cls


def make_problem(name: str, params: dict[str, Any]) -> Problem:
    """Problem `name` built from its `params()` dictionary."""
    if name not in PROBLEMS:
        raise ValueError(f"unknown problem {name!r}; expected one of {sorted(PROBLEMS)}")
    cls = PROBLEMS[name]
    accepted = problem_arguments(cls)
    unknown = sorted(set(params) - accepted) if accepted is not None else []
    if unknown:
        raise ValueError(f"problem {name!r} takes no option {', '.join(map(repr, unknown))}; "
                         f"expected some of {sorted(accepted)}")
    return cls(**params)


def problem_arguments(cls: type[Problem]) -> set[str] | None:
    """Keyword arguments of a problem's constructor (None when it takes any)."""
    parameters = list(inspect.signature(cls).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}


def problem_from_size(name: str, n: int, **options: Any) -> Problem:
    """Problem `name` of size `n` (vertices, matrix side, or cube dimension for 'hypercube':
    the argument its `size_argument` names). An option that names the size argument too is
    refused: it overrode `n` (`problem_from_size("hypercube", 3, d=5)` built d = 5)."""
    size = SIZE_ARGUMENT.get(name, "n")
    if size in options:
        raise ValueError(f"problem {name!r} takes its size {size} from n={n!r}, so the options "
                         f"cannot set it too (got {size}={options[size]!r}); expected options "
                         f"other than {size!r}")
    return make_problem(name, {size: n, **options})


for _shipped in (TriangleFree, C4Free, PatternAvoidingPermanent, HypercubeDiameter):
    register_problem(_shipped)
del _shipped
