"""PatternBoost (003 §3.3; Charton, Ellenberg, Wagner, Williamson, arXiv:2411.00566).

Local search polishes objects; a transformer trained on the best objects proposes new ones;
the two alternate. Point it at a new question by writing a `Problem` and registering it with
`register_problem` (see docs/patternboost.md).
"""

from .config import MODES, PatternBoostConfig
from .database import Database
from .engine import PatternBoostResult, run_patternboost
from .graphs import C4_FREE_MAXIMA, C4Free, TriangleFree, count_c4, count_triangles, mantel_bound
from .hypercube import HypercubeDiameter, far_pairs, hypercube_edges
from .permanent import PatternAvoidingPermanent, pattern_counts, permanent
from .problem import DecodeError, Problem, pack_bits, unpack_bits
from .problems import PROBLEMS, make_problem, problem_from_size, register_problem

__all__ = [
    "C4_FREE_MAXIMA",
    "MODES",
    "PROBLEMS",
    "C4Free",
    "Database",
    "DecodeError",
    "HypercubeDiameter",
    "PatternAvoidingPermanent",
    "PatternBoostConfig",
    "PatternBoostResult",
    "Problem",
    "TriangleFree",
    "count_c4",
    "count_triangles",
    "far_pairs",
    "hypercube_edges",
    "make_problem",
    "mantel_bound",
    "pack_bits",
    "pattern_counts",
    "permanent",
    "problem_from_size",
    "register_problem",
    "run_patternboost",
    "unpack_bits",
]
