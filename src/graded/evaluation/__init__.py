"""Evaluation harness: metrics, the split types of 003 §3.2 and baselines run beside models."""

from graded.evaluation.baselines import (
    classification_baselines,
    features,
    knn_classify,
    knn_regress,
    logistic_regression,
    majority_class,
    mean_predictor,
    regression_baselines,
    ridge_regression,
    sequence_baselines,
)
from graded.evaluation.metrics import (
    HIGHER_IS_BETTER,
    METRICS,
    accuracy,
    compute_metric,
    exact_match,
    mae,
    mse,
    r2,
    token_accuracy,
)
from graded.evaluation.splits import (
    family_split,
    make_split,
    random_split,
    sequence_lengths,
    size_split,
)

__all__ = [
    "HIGHER_IS_BETTER",
    "METRICS",
    "accuracy",
    "classification_baselines",
    "compute_metric",
    "exact_match",
    "family_split",
    "features",
    "knn_classify",
    "knn_regress",
    "logistic_regression",
    "mae",
    "majority_class",
    "make_split",
    "mean_predictor",
    "mse",
    "r2",
    "random_split",
    "regression_baselines",
    "ridge_regression",
    "sequence_baselines",
    "sequence_lengths",
    "size_split",
    "token_accuracy",
]
