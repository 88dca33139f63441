"""What comes back from a sandboxed child, and how the parent reads it without trusting it.

:data:`FAILURES` names every way one evaluation can fail; :class:`Outcome` is what one run
gives back. The child's runner (:mod:`graded.search.program.sandbox_runner`) writes
``result.json``, but the candidate runs in the runner's process and may have written that file
itself: :func:`_malformed_result` accepts only the two shapes the runner writes, and
:func:`_non_finite` refuses the NaN and ±Infinity it never writes. :func:`_head` reads back at
most ``Limits.output_bytes`` of the child's stdout or stderr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FAILURES", "Outcome"]

#: Named failure reasons of one evaluation.
FAILURES: dict[str, str] = {
    "syntax": "the program does not parse",
    "redefinition": "the program redefines or alters a function or class of the fixed code",
    "crash": "the program raised an exception or exited abnormally",
    "timeout": "the wall-clock or CPU-time limit was reached",
    "memory": "the address-space limit was reached",
    "output": "the program wrote past the file-size limit (a print flood, a file, an artefact "
              "too large to send back), or its result could not be read back",
    "non_finite": "an artefact or score is NaN or infinite",
    "wrong_type": "an artefact is not JSON-serialisable or a score has the wrong type",
    "invalid": "the verifier rejected the artefact, raised, or its process ended (an exit "
               "status, a signal) before it returned the scores",
    "verify_timeout": "the verifier did not finish within the problem's verify_timeout_s",
}


@dataclass
class Outcome:
    """What came back from one sandboxed run."""

    artefacts: list[Any] | None
    failure: str | None
    reason: str
    elapsed_s: float
    stdout: str = ""
    stderr: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None


class _NonFinite(ValueError):
    """NaN or ±Infinity in the child's result (the runner never writes them)."""


def _non_finite(constant: str) -> Any:
    raise _NonFinite(constant)


def _malformed_result(result: Any, n_inputs: int) -> str | None:
    """Why ``result`` is not what the runner writes (None when it is): either
    ``{"failure": <a name of FAILURES>, "reason": <text>, ...}`` or ``{"artefacts": <a list with
    one artefact per input>}``."""
    if not isinstance(result, dict):
        return f"expected a JSON object, got {type(result).__name__}"
    if "failure" in result:
        failure, reason = result["failure"], result.get("reason")
        if not isinstance(failure, str) or failure not in FAILURES:
            return f"failure {failure!r:.80} is not one of {sorted(FAILURES)}"
        if not isinstance(reason, str):
            return f"the reason of failure {failure!r} is {reason!r:.80}; expected text"
        return None
    artefacts = result.get("artefacts")
    if not isinstance(artefacts, list) or len(artefacts) != n_inputs:
        got = (f"{len(artefacts)} artefacts" if isinstance(artefacts, list)
               else f"artefacts={artefacts!r}"[:100])
        return f"expected a list of {n_inputs} artefacts (one per input), got {got}"
    return None


def _head(path: Path, limit: int) -> str:
    """The first ``limit`` bytes of ``path`` as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""
