"""The claims study (SPEC C13): experiments that measure what the papers claim.

``graded study`` (:func:`graded.study.runner.run_study`) runs the experiments of
:mod:`graded.study.experiments` and writes a report; docs/study.md describes it.
"""

from graded.study.core import (
    CLAIMS,
    RULE,
    Claim,
    Context,
    Experiment,
    Finding,
    JobExperiment,
    atomic_write_text,
    verdict,
)
from graded.study.statistics import (
    Interval,
    binomial_interval,
    bootstrap_interval,
    cluster_bootstrap,
    holm,
    mean_interval,
    paired_bootstrap,
    paired_t_p_value,
    replicate_values,
    stratified_interval,
    t_interval,
    t_quantile,
    two_stage_bootstrap,
)

__all__ = ["CLAIMS", "RULE", "Claim", "Context", "Experiment", "Finding", "Interval",
           "JobExperiment", "atomic_write_text", "binomial_interval", "bootstrap_interval",
           "cluster_bootstrap",
           "holm", "mean_interval", "paired_bootstrap", "paired_t_p_value", "replicate_values",
           "stratified_interval", "t_interval", "t_quantile", "two_stage_bootstrap", "verdict"]
