"""Figures and feature concentration: the checks no other test reaches, each naming the value,
and the concentration of a grading with a single grade against its definition."""

import math

import pytest
import torch

from graded.analysis.concentration import feature_concentration
from graded.analysis.plots import plot_head_diversity, plot_rank_comparison, plot_rollout
from graded.plotting import pyplot, save_figure


def test_figures_must_be_png_files(tmp_path):
    fig = pyplot().figure()
    with pytest.raises(ValueError, match=r"plots are PNG files: the path must end in '.png', got "
                                         r"'.*plot.svg'"):
        save_figure(fig, tmp_path / "plot.svg")
    pyplot().close(fig)
    assert not (tmp_path / "plot.svg").exists()


def test_plots_need_something_to_draw(tmp_path):
    with pytest.raises(ValueError, match=r"plot_rank_comparison needs at least one layer"):
        plot_rank_comparison({}, tmp_path)
    with pytest.raises(ValueError, match=r"plot_head_diversity needs at least one layer"):
        plot_head_diversity({}, tmp_path)
    with pytest.raises(ValueError, match=r"rollout must be \(B, T, T\) with 0 <= sample < B, got "
                                         r"shape \(2, 3, 3\) and sample=2"):
        plot_rollout(torch.ones(2, 3, 3), tmp_path, sample=2)


def test_feature_concentration_checks_delta():
    with pytest.raises(ValueError, match=r"delta must be >= 0, got -0.5"):
        feature_concentration(torch.ones(2, 3), torch.ones(3), torch.zeros(3), delta=-0.5)


def test_a_single_grade_is_all_top_grade_and_has_no_lemma_fraction():
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    result = feature_concentration(x, torch.full((3,), 2.0), torch.ones(3))
    assert (result.d_eff, result.dim) == (3, 3)
    d = result.to_dict()
    # every coordinate has the top grade: both shares are 1, and no lower grade to bound
    assert d["high_grade_share"] == pytest.approx(1.0)
    assert d["ungraded_share"] == pytest.approx(1.0)
    assert math.isnan(d["lemma_bound_fraction"])
