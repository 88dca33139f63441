"""PatternBoost records: plot_comparison writes a PNG and checks its x column."""

import struct

import pytest

from graded.search.patternboost.records import METRIC_FIELDS, plot_comparison, plot_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _rows(bests, calls):
    return [
        {"round": i, "local_search_calls": c, "elapsed_s": 0.5 * (i + 1), "best": b,
         "round_best": b, "round_mean": None if i == 0 else b - 1, "invalid_fraction": 0.1}
        for i, (b, c) in enumerate(zip(bests, calls))
    ]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_comparison_rejects_an_unknown_column(tmp_path):
    with pytest.raises(ValueError, match=r"x must be one of .*'round'.*got 'calls'"):
        plot_comparison(tmp_path / "c.png", {"a": _rows([1], [1])}, x="calls")
    assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("log_x, optimum, x", [(False, None, "local_search_calls"),
                                               (True, 5.0, "elapsed_s")])
def test_plot_comparison_writes_a_png_of_the_figure_size(tmp_path, log_x, optimum, x):
    import matplotlib

    runs = {"pb, seed 0": _rows([1, 3, 4], [10, 100, 1000]),
            "pb, seed 1": _rows([2, 2, 5], [10, 100, 1000]),
            "random": _rows([1, 1, 2], [10, 100, 1000])}
    path = tmp_path / "compare.png"
    plot_comparison(path, runs, x=x, title="t", optimum=optimum, log_x=log_x)
    assert matplotlib.get_backend().lower() == "agg"
    data = path.read_bytes()
    # figsize (7, 4) inches at dpi 110
    assert _png_size(data) == (770, 440)
    assert not (tmp_path / "compare.png.tmp").exists()  # the temporary name was moved away


def test_plot_metrics_with_optimum_writes_a_png(tmp_path):
    path = tmp_path / "m.png"
    plot_metrics(path, _rows([1, 2], [1, 2]), "title", optimum=3.0)
    assert _png_size(path.read_bytes()) == (770, 440)
    assert "local_search_calls" in METRIC_FIELDS
