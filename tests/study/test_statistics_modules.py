"""``graded.study.statistics`` keeps every name it exported before its bootstrap, distribution
and significance functions moved to modules of their own: the same objects, so code written
against the old path computes exactly what the new modules compute."""

import pytest

import graded.study as study
from graded.study import bootstrap, distributions, significance, statistics

HOMES = {
    "bootstrap_interval": bootstrap,
    "cluster_bootstrap": bootstrap,
    "paired_bootstrap": bootstrap,
    "two_stage_bootstrap": bootstrap,
    "t_quantile": distributions,
    "t_interval": distributions,
    "binomial_interval": distributions,
    "paired_t_p_value": significance,
    "holm": significance,
}


def test_statistics_exports_the_same_names_as_before_the_split():
    assert set(statistics.__all__) == {
        "Interval", "binomial_interval", "bootstrap_interval", "cluster_bootstrap", "holm",
        "mean_interval", "paired_bootstrap", "paired_t_p_value", "replicate_values",
        "stratified_interval", "t_interval", "t_quantile", "two_stage_bootstrap"}


@pytest.mark.parametrize("name", sorted(HOMES))
def test_a_moved_function_is_the_same_object_under_every_path(name):
    home = HOMES[name]
    assert name in home.__all__
    assert getattr(statistics, name) is getattr(home, name) is getattr(study, name)
    assert getattr(home, name).__module__ == home.__name__
