"""Diagnostics of graded and ungraded transformers (SPEC C9; 000 §5-6, 001 §3-4).

Functions take a model and inputs and return numbers; the ``plot_*`` functions write PNG
files. See ``docs/analysis.md`` for what each measures and which paper claim it tests.
"""

from graded.analysis.capture import (
    AttentionCall,
    attention_modules,
    call_keys,
    capture_attention,
    embedding_perturbation,
)
from graded.analysis.concentration import (
    FeatureConcentration,
    feature_concentration,
    model_feature_concentration,
)
from graded.analysis.diagnose import DiagnosticsReport, default_alphas, diagnose
from graded.analysis.heads import (
    concatenated_head_rank,
    head_diversity,
    js_divergence,
    pairwise_head_js,
)
from graded.analysis.lipschitz import (
    LipschitzEstimate,
    empirical_lipschitz,
    lipschitz_bound_factors,
    model_lipschitz,
)
from graded.analysis.maps import (
    attention_entropy,
    attention_maps,
    attention_rollout,
    plot_attention_maps,
)
from graded.analysis.plots import plot_head_diversity, plot_rank_comparison, plot_rollout
from graded.analysis.positional import (
    early_attention_mass,
    plot_positional_bias,
    positional_bias_sweep,
    uniform_early_mass,
)
from graded.analysis.rank import (
    CONDITIONS,
    RankComparison,
    RankStats,
    attention_rank,
    compare_attention_rank,
    effective_rank,
    graded_score_matrices,
    numerical_rank,
    random_rank_study,
    singular_values,
)
from graded.analysis.trajectories import (
    GradeTrajectory,
    grade_trajectories,
    load_grade_records,
    plot_grade_trajectories,
)
from graded.analysis.twin import neutral_grade, ungraded_twin

__all__ = [
    "CONDITIONS",
    "AttentionCall",
    "DiagnosticsReport",
    "FeatureConcentration",
    "GradeTrajectory",
    "LipschitzEstimate",
    "RankComparison",
    "RankStats",
    "attention_entropy",
    "attention_maps",
    "attention_modules",
    "attention_rank",
    "attention_rollout",
    "call_keys",
    "capture_attention",
    "compare_attention_rank",
    "concatenated_head_rank",
    "default_alphas",
    "diagnose",
    "early_attention_mass",
    "effective_rank",
    "embedding_perturbation",
    "empirical_lipschitz",
    "feature_concentration",
    "grade_trajectories",
    "graded_score_matrices",
    "head_diversity",
    "js_divergence",
    "lipschitz_bound_factors",
    "load_grade_records",
    "model_feature_concentration",
    "model_lipschitz",
    "neutral_grade",
    "numerical_rank",
    "pairwise_head_js",
    "plot_attention_maps",
    "plot_grade_trajectories",
    "plot_head_diversity",
    "plot_positional_bias",
    "plot_rank_comparison",
    "plot_rollout",
    "positional_bias_sweep",
    "random_rank_study",
    "singular_values",
    "ungraded_twin",
    "uniform_early_mass",
]
