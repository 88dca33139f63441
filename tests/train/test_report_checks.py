"""Run reports: mean and spread of values with gaps, a log-scale curve plot written as a PNG of
the figure's size, and a folder without metrics named."""

import math
import struct

import pytest

from graded.train.report import mean_std, plot_curves, read_summary


def test_mean_std_skips_missing_values():
    m, s = mean_std([float("nan"), None])
    assert math.isnan(m) and math.isnan(s)
    assert mean_std([2.0, float("nan")]) == (2.0, 0.0)
    assert mean_std([1.0, None, 3.0]) == (2.0, math.sqrt(2.0))  # sample std of 1 and 3


def test_log_scale_curves_are_a_png_of_the_figure_size(tmp_path):
    import matplotlib

    groups = {"a": [[(0, 1.0), (1, 0.1)], [(0, 2.0), (1, 0.2)]], "empty": [[]]}
    out = plot_curves(groups, tmp_path / "sub" / "loss.png", title="t", ylabel="loss",
                      log_y=True)
    assert matplotlib.get_backend().lower() == "agg"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (704, 440)  # 6.4 × 4.0 in at 110 dpi


def test_a_folder_without_metrics_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path} has no metrics.json: is it a "
                                                r"finished run folder\?"):
        read_summary(tmp_path)


@pytest.mark.parametrize(("text", "why"), [("{bad", "not JSON"),
                                           ("[1, 2]", "expected a JSON object, got list")])
def test_a_damaged_metrics_json_is_named(tmp_path, text, why):
    (tmp_path / "metrics.json").write_text(text)
    with pytest.raises(ValueError, match=rf"{tmp_path / 'metrics.json'} is not a run summary: "
                                         f"{why}"):
        read_summary(tmp_path)
