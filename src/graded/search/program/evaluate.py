"""One evaluation: run a program in the sandbox, then score its artefacts with the trusted verifier.

:func:`evaluate` is the unit of work the search sends to an executor. It is a plain function of
picklable arguments, so a process pool or a ``dask.distributed`` cluster can run it.

Cascade evaluation: the problem's ``prechecks`` run first in their own sandboxed child; a failure
there stops the evaluation before the (costlier) ``inputs`` run. ``held_out`` inputs are scored
only when asked (``held_out=True``), for reports; they never enter selection. A block that
repeats the skeleton around its code (a language model's whole-program reply) is first trimmed
to that code (:func:`graded.search.program.echo.trim_echo`); the evaluation holds the
trimmed program.
"""

from __future__ import annotations

import atexit
import math
import numbers
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from graded.search.program.echo import trim_echo
from graded.search.program.problem import InvalidArtefact, Problem
from graded.search.program.program import (
    Program,
    Skeleton,
    check_program,
    fixed_definitions,
    fixed_redefinitions,
    parse_skeleton,
)
from graded.search.program.proposers import ProposalError
from graded.search.program.sandbox import Limits, Sandbox
from graded.search.program.sandbox_verifier import VerifyTimeout, call_within

__all__ = ["Evaluation", "evaluate", "mean_score", "scalar_score"]


@dataclass
class Evaluation:
    """The result of evaluating one program.

    ``signature``: one primary score per input (FunSearch's score signature); ``score``: their
    mean (the program's rank); ``scores``: for dict-scored problems, each named score averaged
    over the inputs. ``failure`` is one of :data:`graded.search.program.sandbox.FAILURES` or None.
    """

    program: Program
    score: float | None
    signature: tuple[float, ...] | None
    scores: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    reason: str = ""
    elapsed_s: float = 0.0
    held_out: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["program"] = list(self.program.blocks)
        out["signature"] = list(self.signature) if self.signature is not None else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evaluation:
        data = dict(data)
        data["program"] = Program(tuple(data["program"]))
        if data["signature"] is not None:
            data["signature"] = tuple(data["signature"])
        return cls(**data)


_SANDBOXES: dict[tuple[Limits, str], Sandbox] = {}


def _sandbox(limits: Limits, isolation: str) -> Sandbox:
    """The warm sandbox of the last (limits, isolation) this process evaluated with: each
    evaluation still gets a fresh child, started while the previous evaluation's results are
    being verified. A search evaluates with one pair throughout; when another pair comes,
    the previous sandbox's waiting children are stopped, so a process that evaluates under
    many limits (a notebook, a test session) holds two children, not two per pair ever used."""
    key = (limits, isolation)
    if key not in _SANDBOXES:
        _close_sandboxes()
        _SANDBOXES[key] = Sandbox(limits, isolation=isolation, warm=2)
    return _SANDBOXES[key]


@atexit.register
def _close_sandboxes() -> None:
    """Stop every warm sandbox's waiting children and forget the sandboxes."""
    sandboxes = list(_SANDBOXES.values())
    _SANDBOXES.clear()
    for sandbox in sandboxes:
        sandbox.close()


def scalar_score(problem: Problem, value: Any) -> tuple[float, dict[str, float]]:
    """The primary score of one verifier result and its named scores; raises ``TypeError`` or
    ``ValueError`` (wrong type, non-finite) with the reason."""
    if isinstance(value, dict):
        if problem.primary is None or problem.primary not in value:
            raise TypeError(f"the verifier returned a dict {sorted(value)} but the problem's "
                            f"primary score is {problem.primary!r}")
        named = {k: _finite_score(v, f"score {k!r} is", f"score {k!r} is", "a number")
                 for k, v in value.items()}
        return named[problem.primary], named
    return _finite_score(value, "the verifier returned", "the score is",
                         "a number or a dict"), {}


def _finite_score(value: Any, returned: str, is_: str, expected: str) -> float:
    """``value`` as a finite float; the errors start with ``returned`` (wrong type) or ``is_``
    (not finite). Every real number is accepted: NumPy's integers and floats too (what a
    verifier's ``array.sum()`` returns), bools not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{returned} {value!r}; expected {expected}")
    try:
        out = float(value)
    except OverflowError:  # an int beyond the float range
        out = math.inf
    if not math.isfinite(out):
        raise ValueError(f"{is_} {value!r}; expected a finite number")
    return out


def mean_score(values: Sequence[float]) -> float:
    """The mean of finite scores, finite whenever they are.

    fsum(values) / n: the correctly rounded sum divided once, two roundings (within
    (1 + 2⁻⁵³)² − 1 of the exact mean, relatively; equal to ``sum(values) / n`` wherever that
    sum was exact). Where the sum
    overflows (n scores near 1e308), the exact mean (Fractions), rounded once: ``sum(values) /
    n`` and ``np.mean`` gave inf there.
    """
    if not values:
        raise ValueError("the mean of no scores; expected at least one score")
    try:
        total = math.fsum(values)
    except OverflowError:  # fsum's partial sums left the float range
        total = math.inf
    if math.isfinite(total):
        return total / len(values)
    # a mean of finite numbers is at most their largest magnitude: float() cannot overflow
    return float(sum(map(Fraction, values)) / len(values))


def _verify(problem: Problem, value: Any, artefact: Any) -> Any:
    """The verifier's result on one artefact. Any exception it raises but ``InvalidArtefact``
    (an ``IndexError`` on an artefact shorter than it expected, a ``TypeError`` on a number
    where it expected a list) is an ``InvalidArtefact`` naming that exception: the candidate
    fails as ``invalid``, not as ``wrong_type`` or ``non_finite`` (which name what the verifier
    returns), and the search goes on instead of stopping at the first such artefact (and again
    at every resume, which would evaluate the same round)."""
    try:
        return problem.score(value, artefact)
    except InvalidArtefact:
        raise
    except Exception as e:
        raise InvalidArtefact(f"the verifier raised {type(e).__name__}: {e}") from e


def _score_inputs(problem: Problem, inputs, artefacts) -> tuple[list[float], list[dict]]:
    primary, named = [], []
    for value, artefact in zip(inputs, artefacts, strict=True):
        p, n = scalar_score(problem, _verify(problem, value, artefact))
        if named and sorted(n) != sorted(named[0]):  # each name is averaged over the inputs
            raise TypeError(f"the verifier named the scores {sorted(n)} on input {len(named)} "
                            f"but {sorted(named[0])} on input 0; expected the same names on "
                            "every input")
        primary.append(p)
        named.append(n)
    return primary, named


def _score_within(problem: Problem, inputs, artefacts) -> tuple[list[float], list[dict]]:
    """:func:`_score_inputs`, in a child forked for it when ``problem.verify_timeout_s`` is set
    (:func:`graded.search.program.sandbox_verifier.call_within`), else in this process."""
    limit = problem.verify_timeout_s
    if limit is None:
        return _score_inputs(problem, inputs, artefacts)
    return call_within(limit, _score_inputs, problem, inputs, artefacts)


def evaluate(problem: Problem, program: Program, *, skeleton: Skeleton | None = None,
             limits: Limits | None = None, isolation: str = "auto",
             held_out: bool = False, names: Iterable[str] | None = None) -> Evaluation:
    """Evaluates ``program`` on ``problem`` (see the module docstring).

    ``names``: the named scores every program must have (the search passes the initial
    program's); a program whose verifier names others fails as ``wrong_type``, as one whose
    names change between inputs does, since selection compares programs name by name.
    """
    if isinstance(names, str):  # "ab" would be read as the two names 'a' and 'b'
        raise TypeError(f"names={names!r}; expected a collection of names of scores")
    skeleton = skeleton or parse_skeleton(problem.skeleton)
    start = time.perf_counter()

    def failed(kind: str, reason: str) -> Evaluation:
        return Evaluation(program, None, None, failure=kind, reason=reason,
                          elapsed_s=time.perf_counter() - start)

    try:  # a reply that repeats the skeleton, trimmed to its block (or refused as below)
        program = trim_echo(skeleton, program)
    except ProposalError as e:
        return failed("redefinition", str(e))
    try:
        source = skeleton.assemble(program)
    except ValueError as e:
        return failed("syntax", str(e))
    reason = check_program(source)
    if reason is not None:
        return failed("syntax", reason)
    reason = fixed_redefinitions(skeleton, program)
    if reason is not None:
        return failed("redefinition", reason)
    fixed = fixed_definitions(skeleton, program)  # checked again in the child, as it runs
    sandbox = _sandbox(limits or Limits(wall_s=problem.time_limit_s, memory_mb=problem.memory_mb),
                       isolation)
    stages = [("precheck", problem.prechecks), ("inputs", problem.inputs)]
    if held_out and problem.held_out:
        stages.append(("held_out", problem.held_out))
    results: dict[str, tuple[list[float], list[dict]]] = {}
    for stage, inputs in stages:
        if not inputs:
            continue
        outcome = sandbox.run(source, problem.entry, list(inputs), fixed=fixed)
        where = "" if stage == "inputs" else f" ({stage})"
        if not outcome.ok:
            return failed(outcome.failure, outcome.reason + where)
        try:
            results[stage] = _score_within(problem, inputs, outcome.artefacts)
        except VerifyTimeout as e:
            return failed("verify_timeout", f"{e}{where}")
        except InvalidArtefact as e:
            return failed("invalid", f"{e}{where}")
        except TypeError as e:
            return failed("wrong_type", f"{e}{where}")
        except ValueError as e:
            return failed("non_finite", f"{e}{where}")
    primary, named = results["inputs"]
    if names is not None and sorted(named[0]) != sorted(names):
        return failed("wrong_type", f"the verifier named the scores {sorted(named[0])} but "
                      f"{sorted(names)} for the initial program; expected the same names for "
                      "every program")
    scores = {k: mean_score([n[k] for n in named]) for k in named[0]}
    out = Evaluation(program, mean_score(primary), tuple(primary), scores,
                     elapsed_s=time.perf_counter() - start)
    if "held_out" in results:
        hp, _ = results["held_out"]
        out.held_out = {"mean": mean_score(hp), **{f"input_{i}": v for i, v in enumerate(hp)}}
    return out
