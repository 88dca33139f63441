"""What a PatternBoost run writes to its folder: state (JSON), weights (safetensors), CSV, PNG.

Every file is written by :func:`graded._io.atomic_write_bytes` (re-exported here): to a
temporary name in the same folder, moved into place with `os.replace`, so an interrupted run
leaves either the old or the new version, never a torn one, and no temporary file. Nothing is
pickled.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from graded._io import atomic_write_bytes

__all__ = [
    "METRIC_FIELDS",
    "atomic_write_bytes",
    "load_weights",
    "plot_comparison",
    "plot_metrics",
    "read_json",
    "save_weights",
    "write_csv",
    "write_json",
]

METRIC_FIELDS = (
    "round",
    "mode",
    "local_search_calls",
    "elapsed_s",
    "samples",
    "invalid_fraction",
    "new_objects",
    "round_best",
    "round_mean",
    "best",
    "train_mean",
    "train_loss",
)


def write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write_bytes(path, json.dumps(data, indent=1).encode())


def read_json(path: str | os.PathLike) -> Any:
    """The JSON document in ``path``; one that does not parse (a file cut short or edited by
    hand) is a ValueError that names the file."""
    with open(path, encoding="utf-8") as fh:
        try:
            return json.load(fh)
        except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
            raise ValueError(f"{path} is not a readable JSON file ({exc}); expected the file "
                             "a PatternBoost run writes") from exc


def save_weights(path: str | os.PathLike, state_dict: dict[str, Any]) -> None:
    """Model weights as safetensors (tied weights stored once each name, as contiguous copies)."""
    from safetensors.torch import save

    tensors = {k: v.detach().contiguous().clone() for k, v in state_dict.items()}
    atomic_write_bytes(path, save(tensors))


def load_weights(path: str | os.PathLike) -> dict[str, Any]:
    """The tensors of a safetensors file; one that does not load (cut short, not safetensors)
    is a ValueError that names the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as exc:
        raise ValueError(f"{path} is not a readable safetensors file ({exc}); expected the "
                         "model weights a PatternBoost run writes") from exc


def write_csv(path: str | os.PathLike, rows: Sequence[dict[str, Any]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(METRIC_FIELDS), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    atomic_write_bytes(path, buf.getvalue().encode())


def _column(rows: Sequence[dict[str, Any]], name: str) -> list[float]:
    """A metric column as floats, with missing values (None) as NaN so that plots skip them."""
    return [math.nan if r[name] is None else float(r[name]) for r in rows]


def _figure_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def plot_metrics(
    path: str | os.PathLike, rows: Sequence[dict[str, Any]], title: str, optimum: float | None
) -> None:
    """Best and mean score per round, with the invalid fraction of samples on a second axis."""
    from graded.plotting import pyplot

    plt = pyplot()
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4))
    rounds = [r["round"] for r in rows]
    ax.plot(rounds, _column(rows, "best"), "o-", label="best so far")
    ax.plot(rounds, _column(rows, "round_best"), "s--", label="round best", alpha=0.7)
    ax.plot(rounds, _column(rows, "round_mean"), ".-", label="round mean")
    if optimum is not None:
        ax.axhline(optimum, color="grey", ls=":", label=f"known optimum {optimum:g}")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("score")
    ax.set_title(title)
    twin = ax.twinx()
    twin.plot(rounds, _column(rows, "invalid_fraction"), "x:", color="tab:red",
              label="invalid fraction")
    twin.set_ylim(0, 1)
    twin.set_ylabel("invalid fraction of samples")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    fig.tight_layout()
    atomic_write_bytes(path, _figure_bytes(fig))
    plt.close(fig)


def plot_comparison(
    path: str | os.PathLike,
    runs: dict[str, Sequence[dict[str, Any]]],
    *,
    x: str = "local_search_calls",
    title: str = "",
    optimum: float | None = None,
    log_x: bool = False,
) -> None:
    """Best score so far against `x` (a metric column such as local_search_calls or elapsed_s)
    for several runs, e.g. PatternBoost beside its baselines. Labels "method, detail" share a
    colour per method."""
    if x not in METRIC_FIELDS:
        raise ValueError(f"x must be one of {METRIC_FIELDS}, got {x!r}")
    from graded.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    methods = list(dict.fromkeys(label.split(",")[0] for label in runs))
    colours = {m: f"C{i}" for i, m in enumerate(methods)}
    styles = ("-", "--", ":", "-.")
    seen: dict[str, int] = {}
    for label, rows in runs.items():
        method = label.split(",")[0]
        k = seen[method] = seen.get(method, -1) + 1
        ax.step(_column(rows, x), _column(rows, "best"), where="post", color=colours[method],
                ls=styles[k % len(styles)], marker="o", ms=3, label=label)
    if log_x:
        ax.set_xscale("log")
    if optimum is not None:
        ax.axhline(optimum, color="grey", ls=":", label=f"known optimum {optimum:g}")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel("best score so far")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    atomic_write_bytes(path, _figure_bytes(fig))
    plt.close(fig)
