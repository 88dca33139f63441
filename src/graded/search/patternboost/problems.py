"""Registry of PatternBoost problems by name, so runs, workers and the CLI can rebuild them."""

from __future__ import annotations

import inspect
from typing import Any

from .graphs import C4Free, TriangleFree
from .hypercube import HypercubeDiameter
from .permanent import PatternAvoidingPermanent
from .problem import Problem

__all__ = ["PROBLEMS", "SIZE_ARGUMENT", "make_problem", "problem_arguments",
           "problem_from_size"]

PROBLEMS: dict[str, type[Problem]] = {
    TriangleFree.name: TriangleFree,
    C4Free.name: C4Free,
    PatternAvoidingPermanent.name: PatternAvoidingPermanent,
    HypercubeDiameter.name: HypercubeDiameter,
}

# The constructor argument that the command line's --n sets, per problem.
SIZE_ARGUMENT = {"hypercube": "d"}


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
