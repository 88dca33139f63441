"""Local search from many starts, in parallel across processes (003 §3.3, steps 1 and 4).

Starts are cut into fixed-size chunks and chunk i of round r runs with the numpy generator
seeded by (seed, r, i), so results do not depend on the number of worker processes.
Workers are started with the "spawn" method: the parent holds torch threads, which `fork`
would copy in an unsafe state.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import numpy as np

from .database import key_to_str
from .problems import make_problem

__all__ = ["LocalSearchResult", "chunk_seed", "make_executor", "run_local_searches"]

# (tokens, score, key) of a locally optimised object
LocalSearchResult = tuple[list[int], float, str]

_PROBLEM_CACHE: dict[str, Any] = {}


def _problem(name: str, params: dict[str, Any]):
    cache_key = f"{name}:{sorted(params.items())}"
    if cache_key not in _PROBLEM_CACHE:
        _PROBLEM_CACHE[cache_key] = make_problem(name, params)
    return _PROBLEM_CACHE[cache_key]


def _search_chunk(
    name: str,
    params: dict[str, Any],
    starts: Sequence[Sequence[int] | None],
    entropy: tuple[int, int, int],
) -> list[LocalSearchResult]:
    problem = _problem(name, params)
    rng = np.random.default_rng(chunk_seed(*entropy))
    out = []
    for start in starts:
        obj = problem.empty() if start is None else problem.decode(start)
        found = problem.local_search(obj, rng)
        out.append((problem.encode(found), problem.score(found), key_to_str(problem.key(found))))
    return out


def chunk_seed(seed: int, stage: int, chunk: int) -> np.random.SeedSequence:
    """The numpy seed of local-search chunk `chunk` of round `stage` in a run of `seed`:
    distinct (seed, stage, chunk) get distinct entropy.

    The entropy [seed, stage, chunk] where all three are below 2**32 (a 32-bit word each);
    otherwise `seed` as the entropy and (stage, chunk) as the spawn key, which numpy places
    after the seed padded to its 4-word pool. (The list [seed, stage, chunk] for every seed let
    numpy split a seed from 2**32 on into two words: seed 2**32 + 5's round 7 chunk 0 drew as
    seed 5's round 1 chunk 7.)"""
    if max(seed, stage, chunk) < 2**32:
        return np.random.SeedSequence([seed, stage, chunk])
    return np.random.SeedSequence(seed, spawn_key=(stage, chunk))


def make_executor(workers: int) -> Executor | None:
    """A process pool of `workers` processes, or None to search in this process."""
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    if workers <= 1:
        return None
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_ignore_interrupts)


def _ignore_interrupts() -> None:
    """Ctrl-C reaches the whole process group: the parent stops the run (after saving the last
    finished round); the workers neither stop on their own nor print tracebacks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_local_searches(
    problem: Any,
    starts: Sequence[Sequence[int] | None],
    *,
    seed: int,
    stage: int,
    executor: Executor | None = None,
    chunk_size: int = 64,
    on_chunk: Callable[[int], None] | None = None,
) -> list[LocalSearchResult]:
    """Run `problem.local_search` from each start (tokens, or None for the empty object).

    Returns one (tokens, score, key) per start, in order. `stage` (the round number) enters the
    seeds so that every round draws fresh randomness. `on_chunk(k)` reports k finished searches.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    name, params = problem.name, problem.params()
    chunks = [list(starts[i : i + chunk_size]) for i in range(0, len(starts), chunk_size)]
    entropies = [(int(seed), int(stage), i) for i in range(len(chunks))]
    results: list[LocalSearchResult] = []
    if executor is None:
        for chunk, entropy in zip(chunks, entropies):
            results.extend(_search_chunk(name, params, chunk, entropy))
            if on_chunk is not None:
                on_chunk(len(chunk))
        return results
    futures = [
        executor.submit(_search_chunk, name, params, chunk, entropy)
        for chunk, entropy in zip(chunks, entropies)
    ]
    for future, chunk in zip(futures, chunks):
        results.extend(future.result())
        if on_chunk is not None:
            on_chunk(len(chunk))
    return results
