"""`graded search program`: FunSearch / AlphaEvolve-style program search from the command line.

`add_cli(subparsers)` adds the `program` method to the `search` group and sets `func=run_cli`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_cli", "run_cli"]

from graded.cli.parser import path_argument


def _problem_option(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _descriptors(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    if len(names) != 2 or not all(names):
        raise argparse.ArgumentTypeError(f"expected two named scores A,B, got {text!r}")
    return names


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "program",
        help="evolve programs with a sandboxed evaluator (FunSearch, AlphaEvolve; 003 §3.4-3.5)",
        description="Evolve the marked blocks of a problem's program: an islands database of "
        "scored programs, a proposer (offline genetic programming, or a language model behind an "
        "OpenAI-compatible endpoint), and a sandbox that runs every candidate in a fresh, limited "
        "child process. The run folder is resumable (--resume). Details: docs/program_search.md.",
    )
    a = p.add_argument
    a("--problem", default="cap-set", help="registered problem (cap-set, bin-packing, matmul)")
    a("--n", type=int, help="size option of the problem (cap-set: dimension; matmul: n)")
    a("--option", action="append", type=_problem_option, default=[], metavar="KEY=VALUE",
      help="another problem option (JSON value), e.g. --option dataset=\"weibull5k\"; every "
      "problem takes verify_timeout_s=SECONDS, the verifier's time limit per stage of a "
      "candidate (defaults: cap-set 5, matmul 30, bin-packing none; verify_timeout_s=none "
      "turns it off)")
    a("--proposer", choices=("offline", "openai", "ensemble"), default="offline",
      help="who writes candidates: offline genetic programming (no network), a language "
      "model at --base-url, or both in turn (default offline)")
    a("--base-url", help="OpenAI-compatible endpoint (openai/ensemble proposers)")
    a("--model", help="model name at the endpoint")
    a("--api-key-env", help="environment variable holding the API key (openai/ensemble "
      "proposers; default OPENAI_API_KEY)")
    a("--max-requests", type=int, help="request budget of the openai/ensemble proposers "
      "(default 1000)")
    a("--islands", type=int, default=4, help="independent program populations (default 4)")
    a("--programs-per-prompt", type=int, default=2,
      help="earlier programs shown to the proposer per request (default 2)")
    a("--reset-period", type=int, default=200, help="evaluations between island resets")
    a("--selection", choices=("clusters", "pareto", "map-elites"), default="clusters",
      help="how parents are drawn: FunSearch's score clusters, the Pareto front of the "
      "problem's named scores, or a MAP-Elites grid over two descriptors (default clusters)")
    a("--descriptors", type=_descriptors, default=(), metavar="A,B",
      help="the two named scores spanning the MAP-Elites grid (with --selection map-elites), "
      "e.g. rank,time for matmul")
    a("--bins", type=int, default=None, help="cells per descriptor of the MAP-Elites grid "
      "(with --selection map-elites; default 8)")
    a("--budget", type=int, default=200, help="evaluations in all")
    a("--workers", type=int, default=2, help="evaluations in parallel")
    a("--seed", type=int, default=0,
      help="seed of the proposer and the database, an integer >= 0 (default 0)")
    a("--isolation", choices=("auto", "require", "none"), default="auto",
      help="network and PID namespaces for candidates: use when available, require, or never")
    a("--dask", metavar="ADDRESS", help="run evaluations on a dask.distributed scheduler "
      "(e.g. tcp://host:8786; 'local' starts a LocalCluster); needs the `dask` extra")
    a("--out", type=lambda text: Path(path_argument(text)),
      help="run folder (default runs/program/<problem>-seed<seed>)")
    a("--resume", action="store_true", help="continue the run in --out")
    p.set_defaults(func=run_cli)
    return p


def build_proposer(args: argparse.Namespace):
    from graded.search.program.offline import OfflineProposer
    from graded.search.program.proposers import EnsembleProposer, OpenAIProposer

    offline = OfflineProposer(seed=args.seed)
    if args.proposer == "offline":
        read_by_a_model = (("--base-url", args.base_url), ("--model", args.model),
                           ("--api-key-env", args.api_key_env),
                           ("--max-requests", args.max_requests))
        ignored = [f"{flag} {value}" for flag, value in read_by_a_model if value is not None]
        if ignored:  # the offline proposer sends no request: these were ignored, silently
            raise ValueError(f"{', '.join(ignored)} set the language model of --proposer "
                             "openai or ensemble; --proposer offline would ignore them")
        return offline
    if not args.base_url or not args.model:
        raise ValueError(f"--proposer {args.proposer} needs --base-url and --model")
    llm = OpenAIProposer(
        base_url=args.base_url, model=args.model,
        api_key_env="OPENAI_API_KEY" if args.api_key_env is None else args.api_key_env,
        max_requests=1000 if args.max_requests is None else args.max_requests)
    if args.proposer == "openai":
        return llm
    return EnsembleProposer([offline, llm], [0.5, 0.5], seed=args.seed)


def run_cli(args: argparse.Namespace) -> int:
    from graded.search.program.database import DatabaseConfig
    from graded.search.program.engine import SearchConfig, SearchRunExists, run_search
    from graded.search.program.problem import get_problem
    from graded.search.program.proposers import ProposalError, ProposerError

    options: dict[str, Any] = {}
    flags: dict[str, str] = {}
    given = [(k, v, f"--option {k}={v!r}") for k, v in args.option]
    if args.n is not None:
        given.append(("n", args.n, f"--n {args.n}"))
    for key, value, flag in given:  # the last of two values won, silently
        if key in options and options[key] != value:
            raise ValueError(f"the problem option {key} is given twice, {flags[key]} and "
                             f"{flag}; expected one value")
        options[key], flags[key] = value, flag
    if args.bins is not None and args.selection != "map-elites":
        raise ValueError(f"--bins {args.bins} sizes the grid of --selection map-elites only; "
                         f"--selection {args.selection} would ignore it")
    problem = get_problem(args.problem, **options)
    config = SearchConfig(
        budget=args.budget, workers=args.workers, seed=args.seed, isolation=args.isolation,
        database=DatabaseConfig(islands=args.islands, programs_per_prompt=args.programs_per_prompt,
                                reset_period=args.reset_period, selection=args.selection,
                                descriptors=args.descriptors,
                                bins=8 if args.bins is None else args.bins),
        problem_options=options)
    out = args.out or Path("runs/program") / f"{args.problem}-seed{args.seed}"
    proposer = build_proposer(args)
    executor = None
    client = None
    if args.dask:
        from graded.search.program.scale import dask_executor

        executor, client = dask_executor(args.dask, args.workers)
    try:
        result = run_search(problem, proposer, config, out=out, resume=args.resume,
                            executor=executor, progress=True)
    except SearchRunExists:  # run_search's refusal, in the flags of the command line
        raise FileExistsError(f"--out {out} already holds a program search run; add --resume "
                              "(with the same options) to continue it, or give another --out"
                              ) from None
    except (ProposerError, ProposalError) as e:
        # the endpoint failed (or is not a chat-completions endpoint): one line, and how to go on
        resume = ("; the folder keeps the last finished round: continue with --resume and the "
                  "same options" if (out / "database.json").exists() else
                  "; no round finished, so there is nothing to resume: run the same command "
                  "again (without --resume)")
        print(f"graded: error: the {args.proposer} proposer stopped the search: {e}{resume}",
              file=sys.stderr)
        return 2  # the endpoint or its settings, as every error a user can cause
    finally:
        if client is not None:
            client.close()
    print(f"best score {result.best.score:.6g} after {result.evaluations} evaluations "
          f"(failures: {result.failures or 'none'})")
    print(f"run folder: {out} (best program: {out / 'best.py'})")
    if result.stopped:
        print(f"stopped; continue with: graded search program --out {out} --resume "
              "(and the same options)")
        return 130
    return 0
