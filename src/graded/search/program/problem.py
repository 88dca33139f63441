"""What a program-search problem is: a skeleton with evolvable blocks, inputs, a trusted verifier.

A :class:`Problem` is the contract between a user's problem and the search engine
(003 §3.4–3.5). The candidate program, assembled from ``skeleton`` with its evolvable blocks
replaced, runs in a sandboxed child process (:mod:`graded.search.program.sandbox`) that calls
``entry(input)`` for each input and sends back the returned *artefact* as JSON. The parent
then scores each artefact with ``score(input, artefact)``, which checks it from scratch: the
candidate never scores itself. A verifier that finds the artefact wrong raises
:class:`InvalidArtefact` with the reason.

Evolvable regions are the lines between ``# EVOLVE-BLOCK-START`` and ``# EVOLVE-BLOCK-END``
comment lines (AlphaEvolve's markers). FunSearch's setting is one block holding one function,
e.g. ``priority``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "InvalidArtefact",
    "Problem",
    "available_problems",
    "get_problem",
    "problem_spec",
    "register_problem",
]


class InvalidArtefact(Exception):
    """Raised by a verifier when a candidate's artefact is wrong; the message is the reason."""


@dataclass(frozen=True)
class Problem:
    """A problem for program search.

    - ``skeleton``: the full Python source of the program, with evolvable blocks marked; or
      several files {name: source} (AlphaEvolve), ``main.py`` holding ``entry`` and importing
      the others, with blocks in any of them.
    - ``entry``: the function the sandbox calls, ``entry(input) -> artefact`` (JSON-serialisable).
    - ``inputs``: JSON-serialisable inputs evolved on; the score signature has one score per input.
    - ``score``: trusted verifier run in the parent, ``score(input, artefact)`` → a float or a
      dict of named floats; raises :class:`InvalidArtefact` when the artefact is wrong.
    - ``held_out``: inputs reported on, never used for selection.
    - ``prechecks``: cheap inputs evaluated first (cascade evaluation); a failure on any of them
      stops the evaluation before ``inputs`` run.
    - ``primary``: for dict scores, the key used to rank programs (None: the score is a float).
    - ``minimise``: for dict scores, the named scores where smaller is better (the others are
      maximised); Pareto and MAP-Elites selection use these directions.
    - ``time_limit_s`` and ``memory_mb``: the sandbox's wall-clock and address-space limits for
      one sandboxed run, which calls ``entry`` on all the inputs of a stage: the prechecks, the
      inputs and (when asked) the held-out inputs each run once, under limits of their own.
    - ``verify_timeout_s``: the wall-clock limit, in seconds, of the verifier on one stage's
      artefacts (the prechecks', the inputs', the held-out inputs'), or None (the default
      here; the shipped cap-set and matmul problems set limits of their own): no limit. With
      a limit, the verifier runs in a child forked from the evaluating process
      for each stage; a stage that does not finish in time fails the candidate as
      ``verify_timeout``, the child and any process it started are killed, and the search goes
      on. With None the verifier runs in the evaluating process itself, as a call: a verifier
      that hangs then holds the search for ever. The forked child shares nothing back: what
      the verifier changes in its own module state is lost, and it cannot use a CUDA context
      the parent had already opened.
    """

    name: str
    skeleton: str | dict[str, str]
    entry: str
    inputs: tuple
    score: Callable[[Any, Any], float | dict[str, float]]
    held_out: tuple = ()
    prechecks: tuple = ()
    primary: str | None = None
    minimise: tuple[str, ...] = ()
    time_limit_s: float = 30.0
    memory_mb: int = 2048
    description: str = ""
    options: dict = field(default_factory=dict)
    verify_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError(f"a Problem needs a non-empty name, got {self.name!r}")
        if not self.entry.isidentifier():
            raise ValueError(f"entry={self.entry!r} is not a Python function name")
        if not self.inputs:
            raise ValueError(f"problem {self.name!r} has no inputs to evaluate on")
        for group in ("inputs", "held_out", "prechecks"):
            for index, value in enumerate(getattr(self, group)):
                try:  # the sandbox sends them to the child as JSON: a NumPy integer stopped
                    json.dumps(value)  # the search at its first evaluation, naming no input
                except (TypeError, ValueError, RecursionError) as e:
                    raise ValueError(f"problem {self.name!r}: {group}[{index}] = {value!r:.80} "
                                     f"is not JSON ({e}); expected JSON values (int, float, "
                                     "str, bool, None, lists and dicts of them)") from None
        if not callable(self.score):
            raise ValueError(f"problem {self.name!r}: score must be callable, got {self.score!r}")
        # as the sandbox's Limits will check them: inf, True or "30" failed only in evaluate
        limit = self.time_limit_s
        if isinstance(limit, bool) or not (isinstance(limit, (int, float))
                                           and 0 < limit < math.inf):
            raise ValueError(f"time_limit_s={limit!r}; expected a positive number, finite")
        if isinstance(self.memory_mb, bool) or not (isinstance(self.memory_mb, int)
                                                    and self.memory_mb > 0):
            raise ValueError(f"memory_mb={self.memory_mb!r}; expected a positive integer")
        verify = self.verify_timeout_s
        if verify is not None and (isinstance(verify, bool) or not (
                isinstance(verify, (int, float)) and 0 < verify < math.inf)):
            raise ValueError(f"verify_timeout_s={verify!r}; expected a positive number of "
                             "seconds, finite, or None (no limit)")


def problem_spec(problem: Problem) -> dict[str, Any]:
    """The problem as built, which a resumed run must share with the run it continues.

    A resume compares this in place of the options that built the problem: two spellings of
    one problem (cap-set's default ``n`` and ``--n 4``) resume, and a problem of the same name
    built otherwise is refused (the Python API records no options, and its scores would mix
    with the saved ones). The skeleton and the inputs enter as SHA-256 digests (16 hex digits),
    the verifier as its qualified name.
    """
    def digest(value: Any) -> str:
        text = json.dumps(value, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    score = problem.score
    return {"skeleton": digest(problem.skeleton), "entry": problem.entry,
            "inputs": digest(problem.inputs), "held_out": digest(problem.held_out),
            "prechecks": digest(problem.prechecks),
            "score": f"{getattr(score, '__module__', None)}."
                     f"{getattr(score, '__qualname__', type(score).__qualname__)}",
            "primary": problem.primary, "minimise": list(problem.minimise),
            "time_limit_s": problem.time_limit_s, "memory_mb": problem.memory_mb,
            "verify_timeout_s": problem.verify_timeout_s}


_REGISTRY: dict[str, Callable[..., Problem]] = {}


def register_problem(name: str, factory: Callable[..., Problem]) -> None:
    """Registers ``factory(**options) -> Problem`` under ``name``. A name already registered
    to another factory (a shipped problem's included) is refused, naming it; registering the
    same factory again (its module imported again) is a no-op."""
    if not isinstance(name, str) or not name or not callable(factory):
        raise ValueError(f"register_problem needs a name and a callable, got {name!r}, "
                         f"{factory!r}")
    _load_shipped()  # so that a shipped name is taken before a user's module registers
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not factory:
        raise ValueError(f"problem {name!r} is already registered to {existing!r}; register "
                         f"{factory!r} under another name")
    _REGISTRY[name] = factory


def _load_shipped() -> None:
    import graded.search.program.problems  # noqa: F401  (registers the shipped problems)


def available_problems() -> list[str]:
    """Names of the registered problems, the shipped ones included."""
    _load_shipped()
    return sorted(_REGISTRY)


def get_problem(name: str, **options: Any) -> Problem:
    """Builds the registered problem ``name`` with ``options``, e.g.
    ``get_problem("cap-set", n=4)``.

    ``verify_timeout_s`` is an option of every problem (``--option verify_timeout_s=60`` on the
    command line, recorded with the run's other options): unless the factory names it (as the
    shipped problems with a default limit do), it is set on the problem the factory builds.
    None, or the text ``"none"`` (``--option verify_timeout_s=none``; JSON's ``null`` reads as
    None already), turns the limit off."""
    _load_shipped()
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown problem {name!r}; known problems: {known}")
    factory = _REGISTRY[name]
    allowed = _option_names(factory)
    options = dict(options)
    text = options.get("verify_timeout_s")
    if isinstance(text, str) and text.lower() == "none":  # the command line's text
        options["verify_timeout_s"] = None
    verify = {}
    if allowed is None or "verify_timeout_s" not in allowed:
        verify = {k: options.pop(k) for k in ("verify_timeout_s",) if k in options}
    unknown = sorted(set(options) - allowed) if allowed is not None else []
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for problem {name!r}; expected some of "
                         f"{sorted({*allowed, 'verify_timeout_s'})}")
    problem = factory(**options)
    return dataclasses.replace(problem, **verify) if verify else problem


def _option_names(factory: Callable[..., Problem]) -> set[str] | None:
    """The keyword options ``factory`` takes; None when it takes any (``**options``) or its
    signature cannot be read."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
