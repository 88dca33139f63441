"""Ctrl-C in a terminal reaches the local-search workers too: they must ignore it (the parent
stops the run), not die with a traceback each."""

import os
import signal

import pytest

from graded.search.patternboost.parallel import make_executor


@pytest.mark.slow  # worker processes and a signal (3 s on 2 cores): `pytest -m slow`
def test_local_search_workers_survive_a_sigint():
    pool = make_executor(2)
    try:
        # what a terminal's Ctrl-C does to every process of the group, here to one worker
        assert pool.submit(signal.raise_signal, signal.SIGINT).result(timeout=60) is None
        pid = pool.submit(os.getpid).result(timeout=60)  # the pool still works
        assert pid != os.getpid()
    finally:
        pool.shutdown(wait=True)
