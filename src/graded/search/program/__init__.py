"""Program search (SPEC C11; 003 §3.4-3.5): FunSearch and AlphaEvolve-style evolution of marked
program blocks, with a sandboxed evaluator and a trusted verifier. See docs/program_search.md.
"""

from graded.search.program.database import DatabaseConfig, ProgramsDatabase
from graded.search.program.engine import SearchConfig, SearchResult, run_search
from graded.search.program.evaluate import Evaluation, evaluate
from graded.search.program.offline import OfflineProposer
from graded.search.program.problem import (
    InvalidArtefact,
    Problem,
    available_problems,
    get_problem,
    register_problem,
)
from graded.search.program.program import Program, Skeleton, parse_skeleton
from graded.search.program.proposers import EnsembleProposer, OpenAIProposer
from graded.search.program.sandbox import Limits, Sandbox, detect_isolation

__all__ = [
    "DatabaseConfig",
    "EnsembleProposer",
    "Evaluation",
    "InvalidArtefact",
    "Limits",
    "OfflineProposer",
    "OpenAIProposer",
    "Problem",
    "Program",
    "ProgramsDatabase",
    "Sandbox",
    "SearchConfig",
    "SearchResult",
    "Skeleton",
    "available_problems",
    "detect_isolation",
    "evaluate",
    "get_problem",
    "parse_skeleton",
    "register_problem",
    "run_search",
]
