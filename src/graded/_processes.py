"""The worker processes of a process pool, for the loops that must end them at once (an abort
of the program search, an interrupted claims study)."""

from __future__ import annotations

import multiprocessing.process
from concurrent.futures import Executor

__all__ = ["pool_workers"]


def pool_workers(pool: Executor) -> list[multiprocessing.process.BaseProcess]:
    """The live worker processes of ``pool`` (a ``ProcessPoolExecutor``; none for another
    executor). ``ProcessPoolExecutor`` offers no public way to reach or end its workers before
    Python 3.14 (``terminate_workers``): this reads its ``_processes``, in this one place."""
    return list((getattr(pool, "_processes", None) or {}).values())
