"""How a trainer stops and shuts down: its stop-signal handler, ``close``, closing at exit.

:class:`TrainerStopSignal` is the :class:`~graded.train.signals.StopSignals` of
:meth:`Trainer.fit <graded.train.trainer.Trainer.fit>`: the first SIGINT or SIGTERM asks the
loop to finish its step and write a checkpoint (and says so on stderr), a second SIGINT aborts
at once. :class:`ClosesAtExit`, mixed into the trainer, holds :meth:`~ClosesAtExit.close`, which
leaves the process group a trainer joined under torchrun; there a trainer also registers
:func:`close_at_exit` with :mod:`atexit` (through a weak reference, which does not keep it
alive), so a script that never calls ``close`` still leaves its process group.
"""

from __future__ import annotations

import atexit
import functools
import gc
import sys
import weakref
from collections.abc import Callable

import torch

from graded.kinds import TaskKind
from graded.train import distributed as D
from graded.train.signals import StopSignals

__all__ = ["ClosesAtExit", "TrainerStopSignal", "close_at_exit"]


class TrainerStopSignal(StopSignals):
    """Turns SIGINT/SIGTERM into a flag checked between steps; a second SIGINT aborts."""

    def on_signal(self, signum: int, first: bool) -> None:
        if self.aborted:
            raise KeyboardInterrupt
        if first:
            print("\nstopping: finishing the current step and writing a checkpoint "
                  "(Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)


def close_at_exit(trainer: weakref.ref, ctx: D.DistContext) -> None:
    """At interpreter exit: close the trainer if it is alive, else leave its process group."""
    alive = trainer()
    if alive is not None:
        alive.close()
    else:
        D.teardown(ctx)


class ClosesAtExit:
    """``close`` and its registration at interpreter exit, mixed into
    :class:`~graded.train.trainer.Trainer`, which sets the attributes below."""

    model: torch.nn.Module
    step_module: torch.nn.Module  # the model's training module (DDP-wrapped, compiled)
    kind: TaskKind
    ctx: D.DistContext
    _close_at_exit: Callable[[], None] | None

    def _register_close_at_exit(self) -> None:
        """Under torchrun, register :func:`close_at_exit` for this trainer with :mod:`atexit`
        (withdrawn by :meth:`close`); on one process, register nothing."""
        self._close_at_exit = None
        if self.ctx.distributed:  # a script that never calls close() still leaves safely
            self._close_at_exit = functools.partial(close_at_exit, weakref.ref(self), self.ctx)
            atexit.register(self._close_at_exit)

    def close(self) -> None:
        """Leave the process group this trainer joined (under torchrun); call once at the end.

        The DDP wrapper goes first, while the process group is still registered: its C++
        reducer holds the group and is freed with the GIL held, so were it the group's last
        holder, the gloo group's destructor would join its worker threads under the GIL while
        one of them waits for the GIL to free a finished collective's tensors (a hang at exit,
        seen once in about 45 two-process launches before this order, none in some 340 since,
        before and after the process group was really freed by ``teardown``: whether the order
        or that fix removed it is not known, and the order stays). The group is then destroyed by
        ``destroy_process_group``, whose Python binding frees it without the GIL, and its gloo
        threads end here: nothing else holds it (:func:`graded.train.distributed.setup`). Under
        torchrun a trainer that is never closed is closed at interpreter exit (``atexit``),
        before the interpreter frees what is left in an arbitrary order."""
        if self._close_at_exit is not None:
            atexit.unregister(self._close_at_exit)
            self._close_at_exit = None
        if self.step_module is not self.model and self.ctx.distributed:
            self.step_module = self.kind.training_module(self.model)
            gc.collect()  # the wrapper and its reducer, now, not at some later collection
        D.teardown(self.ctx)
