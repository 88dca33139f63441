"""The parser of the ``graded`` command line, its argument types and help formatter, and
:func:`main`, which parses the arguments and runs the command through
:func:`~graded.cli.command.run_command`."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from graded.checks import SEED_RANGE
from graded.cli.command import EXIT_BROKEN_PIPE, _quiet_stdout, run_command
from graded.cli.delegates import cmd_bench, cmd_demo, cmd_search
from graded.cli.evaluate import cmd_eval
from graded.cli.generate import DEFAULT_NEW_TOKENS, cmd_generate
from graded.cli.report import cmd_report
from graded.cli.train import cmd_train

#: The largest seed a ``torch.Generator`` takes (64 bits).
MAX_SEED = SEED_RANGE[1]


def _at_least(minimum: int, maximum: int | None = None):
    """An argparse type: an int >= ``minimum`` (and <= ``maximum`` when given); argparse turns
    the error into exit code 2."""
    expected = f"an integer >= {minimum}" if maximum is None else (
        f"an integer from {minimum} to {maximum}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    parse.__name__ = expected
    return parse


def _float_in(text: str, ok: Any, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def path_argument(text: str) -> str:
    """A path argument that names something: an empty one (``"$UNSET"``) is the current folder
    to ``Path``, so ``graded report ""`` reported the runs there, into ``./report`` (the type of
    every path argument of the ``graded`` commands)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r}")
    return text


def _positive_float(text: str) -> float:
    return _float_in(text, lambda v: v > 0 and v != float("inf"), "a finite number > 0")


def _probability(text: str) -> float:
    return _float_in(text, lambda v: 0 < v <= 1, "a number in (0, 1]")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Option defaults shown; descriptions and epilogs kept line by line as written, each line
    wrapped to the terminal's width.

    A default is added once, and only where it says something: not after a help text that
    states its own default (``--max-new-tokens``: "default: 32, or fewer ..."), and not for
    None, False or an empty list (an option that is off unless given)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Each line of ``text`` wrapped to ``width`` (a description written as one long line
        ran past the terminal's edge); a wrapped line of an indented list (the config keys of
        ``graded train --help``) goes on two spaces further in. Words (a path, an option)
        are not broken."""
        lines = []
        for line in text.splitlines():
            lead = indent + line[:len(line) - len(line.lstrip())]
            lines.append(textwrap.fill(
                line.strip(), width, initial_indent=lead,
                subsequent_indent=lead + "  " if line[:1].isspace() else lead,
                break_long_words=False, break_on_hyphens=False) or lead.rstrip())
        return "\n".join(lines)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text or action.default is None or action.default is False or (
                action.default == []):
            return action.help
        return super()._get_help_string(action)


def _train_epilog() -> str:
    from graded.config import describe_schema
    from graded.tasks import available_tasks

    return (describe_schema() + "\n\ntasks: " + ", ".join(available_tasks())
            + "\nexamples: configs/*.yaml, configs/*.toml; details: docs/cli.md")


class _VersionAction(argparse.Action):
    """``--version``: graded's version and the torch build it runs on, read only when asked (torch
    is not imported to build the parser)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        import torch

        from graded import __version__

        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
        try:
            print(f"graded {__version__} (torch {torch.__version__}, {build})", flush=True)
        except BrokenPipeError:  # its reader went away (graded --version | head -0)
            _quiet_stdout()
            parser.exit(EXIT_BROKEN_PIPE)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    fmt = _Formatter
    parser = argparse.ArgumentParser(
        prog="graded", formatter_class=fmt,
        description="Graded transformers (LGT, EGT) and their baselines: train from config "
        "files, evaluate, generate, benchmark, report, and run the demo, the claims study and "
        "the searches.",
    )
    parser.add_argument("--version", action=_VersionAction,
                        help="print the versions of graded and torch, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("train", help="train a model from a YAML/TOML run config",
                       formatter_class=fmt, epilog=_train_epilog(),
                       description="Validate CONFIG, then train in its run folder "
                       "(output.dir/name).\nCtrl-C writes a checkpoint and prints the resume "
                       "command.\nUnder torchrun: torchrun --nproc-per-node N -m graded.cli "
                       "train CONFIG")
    p.add_argument("config", nargs="?", type=path_argument, help="run config (.yaml/.yml/.toml); "
                   "optional with --resume, which reads RUN/config.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=3e-4 (YAML scalar rules; "
                   "repeatable)")
    p.add_argument("--resume", metavar="RUN", help="continue the run folder RUN from its latest "
                   "checkpoint (identical to an uninterrupted run)")
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser("eval", help="evaluate a run's checkpoint on its evaluation split",
                       formatter_class=fmt)
    p.add_argument("run", type=path_argument, help="run folder")
    p.add_argument("--checkpoint", default="best",
                   help="'best', 'latest' or a checkpoint folder (a path, or a name in "
                   "RUN/checkpoints/)")
    p.add_argument("--baselines", action="store_true",
                   help="also run the simple baselines (graded.evaluation) on the same split")
    p.add_argument("--out", metavar="PATH", type=path_argument, default=None,
                   help="write the result (JSON) to PATH instead of RUN/eval.json; without it, "
                   "a run in use by another process (training) is evaluated and the result "
                   "printed only")
    p.set_defaults(handler=cmd_eval)

    p = sub.add_parser("generate", help="continue a prompt with a trained LM (or classify it)",
                       formatter_class=fmt)
    p.add_argument("run", type=path_argument, help="run folder")
    p.add_argument("--prompt", required=True, help="space-separated tokens of the task vocabulary")
    p.add_argument("--checkpoint", default="best", help="'best', 'latest' or a checkpoint "
                   "folder (a path, or a name in RUN/checkpoints/)")
    # the decoding options: a classifier, which generates nothing, refuses them when given
    decoding = [
        p.add_argument("--max-new-tokens", type=_at_least(1), default=None,
                       help=f"tokens to add (default: {DEFAULT_NEW_TOKENS}, or fewer where the "
                       "model's max_len leaves less room)"),
        p.add_argument("--sample", action="store_true",
                       help="sample instead of greedy decoding (what --temperature, --top-k, "
                       "--top-p and --seed shape; they are refused without it)"),
        p.add_argument("--temperature", type=_positive_float, default=1.0,
                       help="sampling temperature (> 0)"),
        p.add_argument("--top-k", type=_at_least(1), default=None,
                       help="sample from the k likeliest tokens"),
        p.add_argument("--top-p", type=_probability, default=None,
                       help="nucleus sampling mass, in (0, 1]"),
        p.add_argument("--num-beams", type=_at_least(1), default=1,
                       help="beam search width (1 = off)"),
        p.add_argument("--repetition-penalty", type=_positive_float, default=1.0,
                       help="divide the scores of tokens the sequence holds (> 1 repeats less)"),
        p.add_argument("--no-repeat-ngram-size", type=_at_least(0), default=0,
                       help="never repeat an n-gram of this size (0 = off)"),
        p.add_argument("--min-new-tokens", type=_at_least(0), default=0,
                       help="no end token before this many new tokens (tasks with one)"),
        p.add_argument("--seed", type=_at_least(0, MAX_SEED), default=None,  # None: seed 0
                       help="sampling seed (default: 0)"),
    ]
    p.set_defaults(handler=cmd_generate,
                   decoding_defaults={a.dest: a.default for a in decoding})

    p = sub.add_parser("bench", help="run scripts of benchmarks/ by name", formatter_class=fmt)
    p.add_argument("names", nargs="*", help="benchmark names (file stems), run in turn; none "
                   "= list them all")
    p.add_argument("--list", action="store_true", help="list the benchmarks instead of running "
                   "them: the named ones (an unknown name is refused), or all")
    p.add_argument("--args", nargs=argparse.REMAINDER, default=[],
                   help="arguments passed to every benchmark script run (refused where "
                   "none runs)")
    p.set_defaults(handler=cmd_bench)

    p = sub.add_parser("report", help="Markdown + PNG summary of finished runs",
                       formatter_class=fmt)
    p.add_argument("runs", nargs="+", type=path_argument,
                   help="run folders, or folders holding run folders (e.g. runs: every "
                   "finished run directly inside)")
    p.add_argument("--out", type=path_argument,
                   help="output folder (default: FIRST_RUN/report, or "
                   "FOLDER/report when the first argument is a folder of runs)")
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser("demo", help="baseline vs LGT vs EGT on two graded tasks",
                       formatter_class=fmt, description="Train a baseline transformer, an LGT "
                       "and an EGT (learnable grades, 000 Alg. 5.1/7.1) on two graded tasks "
                       "with several seeds, next to simple baselines; write OUT/report.md.")
    p.add_argument("--out", type=path_argument, default="runs/demo", help="output folder")
    p.add_argument("--seeds", type=_at_least(1), default=3, help="seeds per model and task")
    p.add_argument("--workers", type=_at_least(1), default=2,
                   help="runs trained in parallel processes")
    p.add_argument("--quick", action="store_true", help="a much smaller smoke-test budget")
    p.set_defaults(handler=cmd_demo)

    from graded.study.cli import add_study_parser

    add_study_parser(sub, fmt)

    p = sub.add_parser("search", help="search loops for mathematical constructions",
                       formatter_class=fmt)
    search_sub = p.add_subparsers(dest="search_command", metavar="METHOD")
    try:
        from graded.search.patternboost.cli import add_cli
    except ImportError:
        add_cli = None
    if add_cli is not None:
        add_cli(search_sub)
    from graded.search.program.cli import add_cli as add_program_cli

    add_program_cli(search_sub)
    p.set_defaults(handler=cmd_search, search_methods=sorted(search_sub.choices))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        parser.error(_unrecognized(args, extras))
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    return run_command(args.handler, args)


def _unrecognized(args: argparse.Namespace, extras: list[str]) -> str:
    """argparse's error for arguments no option takes; a ``KEY=VALUE`` left after a ``--set``
    (``--set a=1 b=2``) is told that each ``--set`` takes one."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    stray = [a for a in extras if "=" in a and not a.startswith("-")]
    if getattr(args, "command", None) == "train" and stray:
        message += (" (each --set takes one KEY=VALUE; repeat --set for more: "
                    f"--set {stray[0]})")
    return message
