"""The one place matplotlib is set up: the non-interactive Agg backend, imported lazily.

Every report and diagnostic (``graded report``, the demo, :mod:`graded.analysis`, the morphic
diagnostics, PatternBoost records, the benchmarks) draws through :func:`pyplot` and writes
PNG files with :func:`save_figure`, so no module picks a backend of its own.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

from graded._io import atomic_write_bytes
from graded.checks import check_int

__all__ = ["pyplot", "save_figure"]


def pyplot() -> Any:
    """``matplotlib.pyplot``, on the Agg backend (no display needed) when this is the first
    import of it. A session that imported pyplot already (a notebook, a script showing its own
    figures) keeps its backend and its open figures: switching to Agg would close them all."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, *, dpi: int = 100) -> Path:
    """Save ``fig`` as the PNG file ``path`` (parent folders created), close it, return the
    path. The PNG is drawn in memory and written atomically (:func:`graded._io.
    atomic_write_bytes`): a drawing that fails, or a Ctrl-C, leaves an older file at ``path``
    whole, and the figure is closed either way."""
    path = Path(path)
    if path.suffix != ".png":
        raise ValueError(f"plots are PNG files: the path must end in '.png', got {str(path)!r}")
    check_int("dpi", dpi, minimum=1)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi)
    finally:
        pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path
