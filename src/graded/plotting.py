"""The one place matplotlib is set up: the non-interactive Agg backend, imported lazily.

Every report and diagnostic (``graded report``, the demo, :mod:`graded.analysis`, the morphic
diagnostics, PatternBoost records, the benchmarks) draws through :func:`pyplot` and writes
PNG files with :func:`save_figure`, so no module picks a backend of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["pyplot", "save_figure"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, *, dpi: int = 100) -> Path:
    """Save ``fig`` as the PNG file ``path`` (parent folders created), close it, return the
    path."""
    path = Path(path)
    if path.suffix != ".png":
        raise ValueError(f"plots are PNG files: the path must end in '.png', got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
