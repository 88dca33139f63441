"""`graded search patternboost`: run PatternBoost or a baseline from the command line.

`add_cli(subparsers)` adds the `patternboost` command to the `search` group's subparsers and
sets `func=run_cli`; `run_cli(args)` runs it and returns an exit status.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from graded.cli.parser import path_argument

from .config import MODES, PatternBoostConfig
from .problems import PROBLEMS

__all__ = ["add_cli", "build_config", "run_cli"]

# CLI option -> PatternBoostConfig field, for the options that map one to one.
_FIELDS = {
    "problem": "problem", "n": "n", "mode": "mode", "rounds": "rounds", "initial": "initial",
    "keep": "keep", "database_size": "database_size", "samples": "samples",
    "train_steps": "train_steps", "batch_size": "batch_size", "lr": "lr",
    "weight_decay": "weight_decay", "temperature": "temperature", "top_k": "top_k",
    "workers": "workers", "chunk_size": "chunk_size", "seed": "seed",
    "time_limit": "time_limit_s", "stop_at": "stop_at",
    "max_local_search_calls": "max_local_search_calls",
}
_MODEL_FIELDS = ("d_model", "n_heads", "n_layers", "d_ff")
_PROBLEM_FIELDS = ("bits_per_token", "pattern")


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add `patternboost` to `subparsers`; options left unset keep the config file's value or
    the `PatternBoostConfig` default."""
    p = subparsers.add_parser(
        "patternboost",
        help="PatternBoost: local search + transformer for extremal constructions (003 §3.3)",
        description="Run PatternBoost (003 §3.3) or its local-only / global-only baseline in a "
        "run folder; rerunning with the same folder resumes after the last finished round.",
    )
    a = p.add_argument
    a("--problem", choices=sorted(PROBLEMS), help="problem to solve (default triangle-free)")
    a("--n", type=int, help="size: vertices (graphs), matrix side (permanent), cube dimension "
      "(hypercube) (default 20)")
    a("--mode", choices=MODES, help="patternboost, or a baseline: local-only (local search "
      "from the empty object only), global-only (samples enter unrepaired) (default "
      "patternboost)")
    a("--out", type=lambda text: Path(path_argument(text)),
      help="run folder (default runs/patternboost/<problem>-n<n>-<mode>)")
    a("--config", type=Path, help="JSON or YAML file of PatternBoostConfig fields; command-line "
      "options override it")
    a("--rounds", type=int, help="rounds after the initial one (default 20)")
    a("--initial", type=int, help="local searches from the empty object that make the first "
      "database (default 2000)")
    a("--keep", type=int, help="K: best distinct objects the transformer trains on (default 500)")
    a("--database-size", type=int, help="distinct objects the database keeps (default 5000)")
    a("--samples", type=int, help="sequences sampled per round (default 1000)")
    a("--train-steps", type=int, help="training steps per round (default 300)")
    a("--batch-size", type=int, help="training batch size (default 64)")
    a("--lr", type=float, help="AdamW learning rate (default 5e-4)")
    a("--weight-decay", type=float, help="AdamW weight decay (default 0.01)")
    a("--d-model", type=int, help="transformer width (default 64)")
    a("--n-heads", type=int, help="attention heads (default 4)")
    a("--n-layers", type=int, help="transformer blocks (default 2)")
    a("--d-ff", type=int, help="feed-forward width (default 256)")
    a("--temperature", type=float, help="sampling temperature (default 1.0)")
    a("--top-k", type=int, help="sample among the k likeliest tokens (default: all)")
    a("--bits-per-token", type=int, help="bits of the object's 0/1 string per token (default 4; "
      "1 gives the raw string of 003 and the public code, four times longer)")
    a("--pattern", help="permanent problem: pattern to avoid, 312 (003) or 123 (public code)")
    a("--workers", type=int, help="processes for local search (default 1: this process)")
    a("--chunk-size", type=int, help="local searches per task (default 64)")
    a("--seed", type=int, help="random seed (default 0)")
    a("--time-limit", type=float, help="stop after the round that passes this many seconds")
    a("--stop-at", type=float, help="stop after the round that reaches this score")
    a("--stop-at-optimum", action="store_true", help="stop when the known optimum is reached")
    a("--max-local-search-calls", type=int, help="stop after this many local-search calls")
    a("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_cli)
    return p


def _read_config_file(path: Path) -> dict[str, Any]:
    """The mapping of PatternBoostConfig fields in a JSON or YAML `--config` file. YAML is read
    as run configs are (:func:`graded.config.files.parse_yaml`: `lr: 1e-3` is a float, where
    PyYAML's own rules made it a string the config refused; a key given twice is refused). A
    file that does not parse is a ValueError naming it (a YAML error was a traceback)."""
    import yaml

    from graded.config.files import _parse_error, parse_yaml

    if path.suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"--config must be a .json, .yaml or .yml file, got {path}")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text) if path.suffix == ".json" else parse_yaml(text)
    except (ValueError, yaml.YAMLError) as exc:  # JSON's errors say where already
        raise ValueError(f"--config {path} does not parse ({_parse_error(exc)}); expected a "
                         "mapping of PatternBoostConfig fields") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of PatternBoostConfig fields")
    return data


def _merged(section: Any, args: argparse.Namespace, options: tuple[str, ...]) -> Any:
    """The config file's `section` with the command-line `options` that are set over it; a
    section that is not a mapping is left as it is, for the config to refuse naming it (it was
    a TypeError traceback, `model: 64`, or a message naming no field, `problem_options: abc`)."""
    given = {k: getattr(args, k) for k in options if getattr(args, k, None) is not None}
    return {**section, **given} if isinstance(section, dict) else section


def build_config(args: argparse.Namespace) -> PatternBoostConfig:
    """The run's config: defaults, then the --config file, then the command-line options."""
    data: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        data = _read_config_file(args.config)
    for option, name in _FIELDS.items():
        value = getattr(args, option, None)
        if value is not None:
            data[name] = value
    data["model"] = _merged(data.get("model", PatternBoostConfig().model), args, _MODEL_FIELDS)
    data["problem_options"] = _merged(data.get("problem_options", {}), args, _PROBLEM_FIELDS)
    if getattr(args, "no_progress", False):
        data["progress"] = False
    config = PatternBoostConfig.from_dict(data)
    config.check_runnable()
    if getattr(args, "stop_at_optimum", False):
        from .problems import problem_from_size

        optimum = problem_from_size(config.problem, config.n, **config.problem_options).optimum()
        if optimum is None:
            raise ValueError(f"--stop-at-optimum: no known optimum for {config.problem} "
                             f"with n={config.n}")
        config.stop_at = optimum
    return config


def run_cli(args: argparse.Namespace) -> int:
    """Run the command; prints the best object found and where the run folder is."""
    from .engine import run_patternboost

    config = build_config(args)
    out = args.out or Path("runs/patternboost") / f"{config.problem}-n{config.n}-{config.mode}"
    result = run_patternboost(config, out)
    best = result.best_object
    optimum = result.problem.optimum()
    known = "" if optimum is None else f" (known optimum {optimum:g})"
    if best is None:  # stopped before the first round finished
        print(f"{config.mode} {config.problem} n={config.n}: no valid object yet{known}")
    else:
        rounds = f"{result.rounds_done} round{'' if result.rounds_done == 1 else 's'}"
        print(f"{config.mode} {config.problem} n={config.n}: best score {result.best_score:g}"
              f"{known} after {rounds}; {result.problem.describe(best)}")
    print(f"run folder: {out} (metrics.csv, metrics.png, state.json)")
    if result.interrupted:
        print("interrupted: rerun the same command to resume")
        return 130
    return 0
