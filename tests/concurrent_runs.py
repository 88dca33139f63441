"""Subprocess runs started ahead of the tests that read them, a few at a time.

A test that starts a script and waits for it leaves the machine's other core idle while that
interpreter imports torch and runs single-threaded. :class:`AheadRuns` starts the runs of the
tests a session has selected (no more: ``pytest -k`` one test starts one run) in the order
those tests come, ``workers`` at a time, and each test waits for its own run's result and
asserts on it as before. The processes are those a user starts; only their order in time
changes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

WORKERS = 2


class AheadRuns:
    """``start(key, args, cwd, env)`` submits ``subprocess.run(args)``; ``result(key)`` waits for
    it and returns its :class:`subprocess.CompletedProcess` (stdout and stderr as text)."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ahead-run")
        self._runs: dict[Any, Future[subprocess.CompletedProcess]] = {}

    def start(self, key: Any, args: list[str], cwd: Path, env: dict[str, str] | None = None,
              timeout: float = 600) -> None:
        self._runs[key] = self._pool.submit(subprocess.run, args, cwd=cwd, env=env, text=True,
                                            capture_output=True, timeout=timeout, check=False)

    def result(self, key: Any) -> subprocess.CompletedProcess:
        return self._runs[key].result()

    def close(self) -> None:
        """Wait for the runs started (a test that failed early leaves its run going) and stop
        the threads; runs not started yet are dropped."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def selected_items(request: pytest.FixtureRequest, test: Callable[..., Any]) -> list[Any]:
    """The session's selected items of the test function ``test``, in the order they run."""
    return [item for item in request.session.items if getattr(item, "function", None) is test]


def selected_params(request: pytest.FixtureRequest, test: Callable[..., Any],
                    param: str) -> list[Any]:
    """The values of ``param`` of the session's selected items of the parametrized test
    function ``test``, in the order they run."""
    return [item.callspec.params[param] for item in selected_items(request, test)]
