"""``python -m graded.cli``: the command line, as
``torchrun --nproc-per-node N -m graded.cli train CONFIG`` runs it."""

import sys

from graded.cli import main

sys.exit(main())
