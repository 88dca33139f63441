"""The ``graded`` command line: train, eval, generate, bench, report, demo, study, search.

Every command works on run folders: ``graded train CONFIG`` creates ``output.dir/name/`` with
``config.yaml``, ``metrics.csv``, ``tensorboard/``, ``grades.jsonl``, ``checkpoints/`` and
``metrics.json``; the other commands take such a folder. Under ``torchrun`` use
``torchrun --nproc-per-node N -m graded.cli train CONFIG``. See ``docs/cli.md``.

One module per concept: :mod:`~graded.cli.parser` (the parser, its argument types, and
:func:`main`), :mod:`~graded.cli.command` (running a command: one-line errors and warnings, exit
codes), :mod:`~graded.cli.train`, :mod:`~graded.cli.loading` (a run's config and model with the
weights of one of its checkpoints), :mod:`~graded.cli.evaluate`, :mod:`~graded.cli.generate`,
:mod:`~graded.cli.report`, and :mod:`~graded.cli.delegates` (bench, demo, search).
"""

from graded.cli.command import EXIT_INTERRUPTED, run_command
from graded.cli.generate import DEFAULT_NEW_TOKENS
from graded.cli.parser import build_parser, main

__all__ = ["DEFAULT_NEW_TOKENS", "EXIT_INTERRUPTED", "build_parser", "main", "run_command"]
