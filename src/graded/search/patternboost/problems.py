"""Registry of PatternBoost problems by name, so runs, workers and the CLI can rebuild them.

A problem class is added with :func:`register_problem` (usable as a class decorator), which
refuses a name already taken by another class, a shipped problem's included. :data:`PROBLEMS`
is a read-only view of the registry, so that no assignment can silently replace a problem.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn, TypeVar

from .graphs import C4Free, TriangleFree
from .hypercube import HypercubeDiameter
from .permanent import PatternAvoidingPermanent
from .problem import Problem

__all__ = ["PROBLEMS", "SIZE_ARGUMENT", "make_problem", "problem_arguments",
           "problem_from_size", "register_problem"]

_P = TypeVar("_P", bound=type[Problem])

_REGISTRY: dict[str, type[Problem]] = {}


class _ProblemView(Mapping[str, type[Problem]]):
    """Read-only view of the registered problems: writes are refused, pointing at
    :func:`register_problem`."""

    def __getitem__(self, name: str) -> type[Problem]:
        return _REGISTRY[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return f"PROBLEMS({_REGISTRY!r})"

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("graded.search.patternboost.PROBLEMS is read-only: add a problem class "
                        "with graded.search.patternboost.register_problem(cls), which refuses a "
                        "name already taken")

    __setitem__ = __delitem__ = pop = popitem = setdefault = update = clear = _refuse


PROBLEMS: Mapping[str, type[Problem]] = _ProblemView()

# The constructor argument that the command line's --n sets, per problem.
SIZE_ARGUMENT = {"hypercube": "d"}


def register_problem(cls: _P) -> _P:
    """Registers the `Problem` subclass `cls` under `cls.name` and returns it (so it also works
    as a class decorator). A name already registered to another class, a shipped problem's
    included, is refused naming both classes; registering the same class again (its module
    imported again) is a no-op."""
    if not (isinstance(cls, type) and issubclass(cls, Problem)):
        raise TypeError(f"register_problem expects a Problem subclass, got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"problem class {cls.__qualname__} needs a non-empty string `name`, "
                         f"got {name!r}")
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"problem {name!r} is already registered to "
                         f"{existing.__module__}.{existing.__qualname__}; register "
                         f"{cls.__module__}.{cls.__qualname__} under another `name`")
    _REGISTRY[name] = cls
    return cls


for _shipped in (TriangleFree, C4Free, PatternAvoidingPermanent, HypercubeDiameter):
    register_problem(_shipped)
del _shipped


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
    """Problem `name` of size `n` (vertices, matrix side, or cube dimension for 'hypercube')."""
    params = {SIZE_ARGUMENT.get(name, "n"): n, **options}
    return make_problem(name, params)
