"""Stopping cleanly on SIGINT and SIGTERM: one handler install for the trainer and the demo.

A :class:`StopSignals` context installs a handler for both signals (in the main thread only;
elsewhere Python cannot) and restores the previous handlers on exit. The first signal sets
``flag``, which the owner checks at a safe point (between training steps, between runs); a
second SIGINT sets ``aborted`` too. What else happens is the subclass's :meth:`on_signal`.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["StopSignals"]


class StopSignals:
    """SIGINT/SIGTERM to a flag checked at safe points; a second SIGINT marks an abort."""

    def __init__(self) -> None:
        self.flag = False
        self.aborted = False
        self._old: dict[int, Any] = {}

    def on_signal(self, signum: int, first: bool) -> None:
        """Called after the flags are set; ``first`` is True for the first signal."""

    def _handler(self, signum: int, frame: Any) -> None:
        first = not self.flag
        if not first and signum == signal.SIGINT:
            self.aborted = True
        self.flag = True
        self.on_signal(signum, first)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
