"""The ``graded`` command line: train, eval, generate, bench, report, demo, study, search.

Every command works on run folders: ``graded train CONFIG`` creates ``output.dir/name/`` with
``config.yaml``, ``metrics.csv``, ``tensorboard/``, ``grades.jsonl``, ``checkpoints/`` and
``metrics.json``; the other commands take such a folder. Under ``torchrun`` use
``torchrun --nproc-per-node N -m graded.cli train CONFIG``. See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_INTERRUPTED = 130


def _fail(message: str, code: int = 2) -> int:
    print(f"graded: error: {message}", file=sys.stderr)
    return code


# --------------------------------------------------------------------------- train


def cmd_train(args: argparse.Namespace) -> int:
    """Train a new run, or continue one with ``--resume``.

    Nothing is written before everything has been checked: the config (a dry build of task,
    model and recipe), the run folder's lock (a second writer is refused), and for a resume
    the changes against the run's own config (keys that cannot change mid-run are refused,
    the others recorded in ``history.jsonl``) and the checkpoint's weights and optimizer state
    (a damaged newest checkpoint falls back to the newest intact one). See
    :mod:`graded.train.runs`.
    """
    from graded.config import build_run, load_config
    from graded.train.checkpoint import CheckpointManager
    from graded.train.runs import refuse_search_run

    resume_dir = Path(args.resume) if args.resume else None
    if args.config is None and resume_dir is None:
        return _fail("train needs a CONFIG file, or --resume RUN")
    if resume_dir is not None and not resume_dir.exists():
        return _fail(f"--resume {resume_dir}: no such folder; expected a run folder of "
                     "graded train")
    if resume_dir is not None and not (resume_dir / "config.yaml").is_file():
        return _fail(f"--resume {resume_dir}: not a run folder (no config.yaml)")
    if resume_dir is not None and args.config is None and not _is_run_config(resume_dir):
        from graded.config import read_config_file
        from graded.config.schema import python_run_message

        return _fail(python_run_message(resume_dir, read_config_file(resume_dir / "config.yaml")))
    config_path = Path(args.config) if args.config else resume_dir / "config.yaml"
    cfg = load_config(config_path, args.set)
    run_dir = resume_dir or cfg.run_dir()
    refuse_search_run(run_dir)  # before the dry build, and before the lock file is written
    if resume_dir is None and CheckpointManager(run_dir / "checkpoints").folders() \
            and not cfg.output.overwrite:
        return _fail(
            f"run folder {run_dir} already has checkpoints; resume it with "
            f"`graded train --resume {run_dir}`, or pass --set output.overwrite=true (which "
            "removes only what graded wrote there) or --set name=<new name>"
        )
    parts = build_run(cfg, run_dir, resume_command=f"graded train --resume {run_dir}")
    trainer, task, model = parts.trainer, parts.task, parts.model
    try:
        with trainer.run.lock():
            if resume_dir is not None:
                trainer.prepare_resume(resume_dir)  # checks everything, writes nothing
            if trainer.ctx.is_main:
                n_params = sum(p.numel() for p in model.parameters())
                print(f"run {run_dir}: task {task.name} ({task.kind}), {n_params:,} "
                      f"parameters, recipe {cfg.recipe_name()}, {cfg.train.steps} steps",
                      file=sys.stderr)
            result = trainer.fit(resume_from=resume_dir)
    finally:
        trainer.close()
    if trainer.ctx.is_main and not result.interrupted and not result.losses:
        if result.early_stopped:
            patience = cfg.train.early_stopping.patience
            print(f"nothing to do: {run_dir} stopped early at step {result.step} (no "
                  f"improvement of {cfg.train.monitor} in {patience} evaluations); continue it "
                  f"with `graded train --resume {run_dir} --set "
                  "train.early_stopping.patience=<more>` (or =null)")
        else:
            print(f"nothing to do: {run_dir} is at step {result.step} of {cfg.train.steps}; "
                  f"continue it with `graded train --resume {run_dir} --set train.steps=<more>`")
    elif trainer.ctx.is_main and not result.interrupted:
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in result.final_eval.items())
        print(f"done: step {result.step}; eval {metrics}\nrun folder: {run_dir}")
        if cfg.output.plots:
            print(f"plots: {_run_plots(run_dir).parent}")
    return EXIT_INTERRUPTED if result.interrupted else 0


def _run_plots(run_dir: Path) -> Path:
    """The report of one finished run in ``RUN/report/`` (``graded report RUN`` without the
    morphic diagnostics): report.md with its final metrics, learning curves and grade plots."""
    from graded.train.report import write_runs_report
    from graded.train.runs import RunFolder

    RunFolder(run_dir, purpose="report").record("report")
    return write_runs_report([run_dir], run_dir / "report")


# --------------------------------------------------------------------------- eval / generate


def _load_run(run_dir: Path, which: str):
    """Config, task, model (weights loaded from the ``which`` checkpoint) of a run folder.

    Only the weights are read (``optimizer.safetensors`` may be absent). ``latest`` falls back to
    the newest intact checkpoint, saying which it skipped and why; ``best`` or a named folder
    that does not load is an error naming the file. The run may be training meanwhile (an
    evaluation takes no lock): a checkpoint its trainer rotates away between the lookup and the
    load is looked up again (:func:`_load_checkpoint_of_run`).
    """
    import torch

    from graded.config import build_model, build_task, load_run_config
    from graded.train.checkpoint import CheckpointManager

    cfg = load_run_config(run_dir)
    task = build_task(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task)
    manager = CheckpointManager(run_dir / "checkpoints")
    ckpt, meta = _load_checkpoint_of_run(run_dir, manager, model, which)
    _check_checkpoint_config(run_dir, ckpt, meta, own=which in ("best", "latest") or (
        Path(ckpt).resolve().parent == manager.root.resolve()))
    model.eval()
    return cfg, task, model, ckpt, meta


def _load_checkpoint_of_run(run_dir: Path, manager: Any, model: Any,
                            which: str) -> tuple[Path, dict[str, Any]]:
    """Load the ``which`` checkpoint of ``run_dir`` into ``model``: its folder and JSON state.

    A run training meanwhile saves newer checkpoints and removes older ones (``keep_last``,
    and a best that is no longer the best). A checkpoint that fails to load while the lookup
    has moved on (its folder is gone, or ``best.json`` names another now) is looked up again,
    :data:`~graded.train.checkpoint.CHECKPOINT_LOOKUPS` times at most; a named folder removed
    so, and a run whose checkpoints kept vanishing, are a RunError saying the run is being
    written. A checkpoint that fails to load while the lookup stands still is damaged (or
    gone): that error is raised as it is.
    """
    from graded.train.checkpoint import (
        CHECKPOINT_LOOKUPS,
        CheckpointRemovedError,
        load_checkpoint,
    )
    from graded.train.runs import RunError

    being_written = f"run {run_dir} is being written"
    if which == "latest":
        try:
            found = manager.find_intact(model)
        except CheckpointRemovedError as exc:  # its message says why
            raise RunError(f"{being_written}: {exc}") from None
        for path, reason in found.skipped:
            print(f"graded: warning: skipped damaged checkpoint {path}: {reason}", file=sys.stderr)
        return found.path, found.meta
    being_written += " (a process training it rotates its checkpoints away)"
    tried: list[Path] = []
    failure: Exception | None = None
    while True:
        ckpt = _best_lookup(manager) if which == "best" else _checkpoint_folder(manager, which)
        if ckpt is None:
            raise FileNotFoundError(f"{run_dir} has no checkpoint")
        if failure is not None and ckpt == tried[-1]:  # the lookup stands still
            raise failure
        if len(tried) == CHECKPOINT_LOOKUPS:
            raise RunError(f"{being_written}: each of the {len(tried)} checkpoints picked "
                           f"({', '.join(p.name for p in tried)}) was removed before it "
                           "loaded; evaluate it again, or once it stops")
        tried.append(ckpt)
        try:
            if which == "best":
                _check_best_present(manager, ckpt)
            return ckpt, load_checkpoint(ckpt, model, restore_rng=False)
        except ValueError as exc:  # a CheckpointError, or the folder best.json names is gone
            failure = exc
        if which != "best":  # a named folder has no successor to look up
            if not Path(ckpt).is_dir():
                raise RunError(f"{being_written}: checkpoint {ckpt} was removed while it was "
                               "read; evaluate a newer one (--checkpoint latest or best)")
            raise failure


def _best_lookup(manager: Any) -> Path | None:
    """``--checkpoint best``: the folder ``best.json`` names (present or not), or the latest
    checkpoint of a run that never evaluated (no ``best.json``)."""
    named = manager.best_named()
    return manager.latest() if named is None else named


def _check_best_present(manager: Any, named: Path) -> None:
    """ValueError when the folder ``best.json`` names is gone, rather than another
    checkpoint's figures under the name of the best."""
    if not named.is_dir():
        found = ", ".join(p.name for p in manager.folders()) or "none"
        raise ValueError(f"{manager.root / 'best.json'} names {named.name}, which is gone from "
                         f"{manager.root} (there: {found}); evaluate another with --checkpoint "
                         "latest or --checkpoint <folder>")


def _check_checkpoint_config(run_dir: Path, ckpt: Path, meta: dict[str, Any], *,
                             own: bool) -> None:
    """The model and data rebuilt from ``RUN/config.yaml`` are those the checkpoint's weights
    were trained with: every key a resume may not change (task, model, seed, ...) equals the
    checkpoint's recorded config. A ``config.yaml`` edited since (another seed, task option or
    grading base builds another split or model, into which the weights may still load) is
    refused, naming each key, for the run's own checkpoints; a checkpoint of another folder,
    given by path, is evaluated with this run's config, with a warning naming the keys."""
    from graded.config import read_config_file
    from graded.train.runs import resume_changes

    recorded = meta.get("config")
    if not isinstance(recorded, dict):  # a checkpoint that records no config: nothing to check
        return
    _, refused = resume_changes(recorded, read_config_file(run_dir / "config.yaml"))
    if not refused:
        return
    changes = "; ".join(f"{k} was {json.dumps(o)}, now {json.dumps(n)}"
                        for k, (o, n) in refused.items())
    if own:
        raise ValueError(f"{run_dir / 'config.yaml'} does not match the config checkpoint "
                         f"{ckpt} was trained with: {changes}; restore those keys (the weights "
                         "belong to the recorded model and data), or train a new run")
    print(f"graded: warning: checkpoint {ckpt} was trained with another config than "
          f"{run_dir / 'config.yaml'}: {changes}; evaluating it with {run_dir}'s",
          file=sys.stderr)


def _checkpoint_folder(manager: Any, which: str) -> Path:
    """``--checkpoint PATH``: a folder, as given or inside the run's ``checkpoints/`` (e.g.
    ``step_000000400``); ValueError naming what there is otherwise."""
    for path in (Path(which), manager.root / which):
        if path.is_dir():
            return path
    found = ", ".join(p.name for p in manager.folders()) or "none"
    raise ValueError(f"--checkpoint {which!r}: no such folder; expected 'best', 'latest', a "
                     f"checkpoint folder of {manager.root} ({found}) or a path to one")


def cmd_eval(args: argparse.Namespace) -> int:
    from graded.config import build_data
    from graded.train.objectives import evaluate

    run_dir = Path(args.run)
    if args.out is not None and Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a folder; expected the path of a JSON file to "
                         f"write, e.g. {Path(args.out) / 'eval.json'}")
    if args.out is not None:
        _refuse_run_file(run_dir, Path(args.out))
    cfg, task, model, ckpt, meta = _load_run(run_dir, args.checkpoint)
    train, test = build_data(cfg, task)
    metrics = evaluate(model, test.tensors, task.kind, batch_size=cfg.train.eval_batch_size)
    out: dict[str, Any] = {"checkpoint": str(ckpt), "step": meta["step"], "metrics": metrics}
    if args.baselines:  # scored by the same metrics as the model, side by side
        from graded.kinds import baseline_report

        out["baselines"] = baseline_report(train, test)
    text = json.dumps(out, indent=2, default=str)
    _keep_evaluation(run_dir, None if args.out is None else Path(args.out), text)
    print(text)
    return 0


def _refuse_run_file(run_dir: Path, out: Path) -> None:
    """ValueError when ``--out`` names a file of the run itself, or one inside such an entry
    (``RUN/config.yaml``, ``RUN/checkpoints/...``): the evaluation would replace what training
    wrote (``--out RUN/config.yaml`` left a run whose config was the evaluation's JSON).
    ``RUN/eval.json``, the default, and the user's own names inside the run are allowed."""
    from graded.train.runs import LIBRARY_ENTRIES, LOCK_FILE, MANIFEST_FILE

    target, run = out.resolve(), run_dir.resolve()
    if not target.is_relative_to(run) or target == run:
        return
    entry = target.relative_to(run).parts[0]
    if entry in (*LIBRARY_ENTRIES, LOCK_FILE, MANIFEST_FILE) and entry != "eval.json":
        raise ValueError(f"--out {out} is {'' if target.name == entry else 'inside '}the run's "
                         f"own {entry}, which graded wrote there and the evaluation would "
                         f"replace; give another path, e.g. {run_dir / 'eval.json'} (the "
                         "default) or a name of yours")


def _keep_evaluation(run_dir: Path, out: Path | None, text: str) -> None:
    """Write an evaluation to ``out``, or to ``RUN/eval.json`` by default. A file inside the
    run folder is written under the run's lock (and entered in its manifest when directly
    inside it, as ``eval.json`` is). While another process holds the lock (the run is
    training) the default is not written: the result is printed only, which one line on
    stderr says; an ``out`` inside the folder is refused then, naming the holder."""
    from graded.train.checkpoint import atomic_write_text
    from graded.train.runs import RunError, RunFolder, RunLockedError

    target = run_dir / "eval.json" if out is None else out
    if not target.resolve().is_relative_to(run_dir.resolve()):
        atomic_write_text(target, text)
        return
    folder = RunFolder(run_dir, purpose="evaluation")
    try:
        with folder.lock():
            if target.resolve().parent == run_dir.resolve():
                folder.record(target.name)
            atomic_write_text(target, text)
    except RunLockedError as exc:
        if out is not None:
            raise RunError(f"--out {out} is inside run folder {run_dir}, which is in use by "
                           f"process {exc.holder} for {exc.purpose}; give a path outside it"
                           ) from None
        print(f"graded: run folder {run_dir} is in use by process {exc.holder} for "
              f"{exc.purpose}: the evaluation is printed, not written to its eval.json (--out "
              "PATH writes it elsewhere)", file=sys.stderr)


DEFAULT_NEW_TOKENS = 32


def _new_token_budget(model: Any, kind: Any, prompt_len: int, requested: int | None) -> int:
    """Tokens to generate: ``requested``, or :data:`DEFAULT_NEW_TOKENS` cut to what fits in the
    model's ``max_len`` (models with position tables cannot go past it); 0 for a kind that
    answers from the prompt alone (classification, regression), whose prompt may fill
    ``max_len``. ValueError naming the numbers when the prompt (a seq2seq source, a
    classifier's input) or ``requested`` does not fit, or a continued prompt leaves no room."""
    from graded.transformer.generation import position_limit

    limit = position_limit(getattr(model, "config", model))
    seq2seq = kind.name == "seq2seq"
    if limit is not None and prompt_len > limit and (seq2seq or not kind.generates_tokens):
        what = "source" if seq2seq else "input"
        raise ValueError(f"--prompt: the {what}'s {prompt_len} tokens do not fit the model's "
                         f"max_len={limit}; use a prompt of at most {limit} tokens")
    if not kind.generates_tokens:
        return 0
    if limit is None:
        return DEFAULT_NEW_TOKENS if requested is None else requested
    used = 1 if seq2seq else prompt_len  # a decoder starts at BOS, an LM after the prompt
    room = limit - used
    what = "the start token" if seq2seq else f"the prompt's {prompt_len} tokens"
    if room < 1:
        raise ValueError(f"--prompt: {what} leave no room in the model's max_len={limit}; "
                         f"use a prompt of at most {limit - 1} tokens")
    if requested is None:
        return min(DEFAULT_NEW_TOKENS, room)
    if requested > room:
        raise ValueError(f"--max-new-tokens {requested} does not fit: {what} leave room for "
                         f"{room} in the model's max_len={limit}")
    return requested


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from graded.kinds import as_kind

    run_dir = Path(args.run)
    if args.sample and args.num_beams > 1:  # the flags of generate()'s own refusal
        return _fail(f"--sample and --num-beams {args.num_beams} cannot go together: beam "
                     "search does not sample; choose one (--num-beams 1 samples)")
    _, task, model, _, _ = _load_run(run_dir, args.checkpoint)
    if task.vocab is None:
        return _fail(f"task {task.name} has real-valued inputs; generate needs a token task")
    try:
        ids = torch.tensor([task.vocab.encode(args.prompt)])
    except ValueError as exc:
        return _fail(f"--prompt {args.prompt!r}: {exc} (a prompt is tokens separated by "
                     "spaces)")
    if ids.shape[1] == 0:
        return _fail("--prompt is empty: give at least one token of the task's vocabulary")
    if bool((ids == task.vocab.pad_id).any()):
        return _fail(f"--prompt {args.prompt!r}: {task.vocab.pad!r} is the padding token, which "
                     "the model never reads as input; give the prompt without it")
    kind = as_kind(task.kind, model)
    unused = [flag for flag, given in (("--temperature", args.temperature != 1.0),
                                       ("--top-k", args.top_k is not None),
                                       ("--top-p", args.top_p is not None),
                                       ("--seed", args.seed is not None)) if given]
    # greedy decoding and beam search would drop them: they draw nothing, so the seed too
    if kind.generates_tokens and unused and not args.sample:
        flags = " and ".join(unused) if len(unused) < 3 else (
            f"{', '.join(unused[:-1])} and {unused[-1]}")
        return _fail(f"{flags} {'is' if len(unused) == 1 else 'are'} used only when "
                     f"sampling, which is off: add --sample, or leave "
                     f"{'it' if len(unused) == 1 else 'them'} out for greedy decoding or beam "
                     "search")
    new_tokens = _new_token_budget(model, kind, ids.shape[1], args.max_new_tokens)
    seed = 0 if args.seed is None else args.seed
    sampling = {"do_sample": args.sample, "temperature": args.temperature, "top_k": args.top_k,
                "top_p": args.top_p, "num_beams": args.num_beams,
                "generator": torch.Generator().manual_seed(seed)}
    processors = {"repetition_penalty": (args.repetition_penalty, 1.0),
                  "no_repeat_ngram_size": (args.no_repeat_ngram_size, 0),
                  "min_new_tokens": (args.min_new_tokens, 0)}
    # Hugging Face's logits processors (graded.transformer.logits), passed only when set
    sampling.update({k: v for k, (v, off) in processors.items() if v != off})
    if args.min_new_tokens and task.info().get("eos_id") is None:
        return _fail(f"--min-new-tokens {args.min_new_tokens}: task {task.name} has no end "
                     "token to hold back")
    with torch.no_grad():
        out = kind.generate(model, task, ids, new_tokens, **sampling)
    print(out if isinstance(out, str) else json.dumps(out))
    return 0


# --------------------------------------------------------------------------- bench / report


def _benchmarks_dir() -> Path:
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (base / "benchmarks").is_dir():
            return base / "benchmarks"
    raise FileNotFoundError("no benchmarks/ folder here or in the source checkout")


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        folder = _benchmarks_dir()
    except FileNotFoundError as exc:
        return _fail(str(exc))
    available = sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))
    if args.list or not args.names:
        print("benchmarks in", folder)
        for name in available:
            print(" ", name)
        return 0
    unknown = [n for n in args.names if n not in available]
    if unknown:
        return _fail(f"unknown benchmark(s) {unknown}; available: {available}")
    for name in args.names:
        print(f"== {name}", flush=True)
        code = subprocess.call([sys.executable, str(folder / f"{name}.py"), *args.args])
        if code:
            return code
    return 0


def _morphic_diagnostics(run_dir: Path) -> Callable[[Path], Any]:
    """004 §5.4 diagnostics (utilities, routing, calibration, ablation) of a morphic run, through
    ``graded.morphic.diagnostics.write_report``: loads the best checkpoint, the initial weights
    and up to 256 evaluation examples now (a checkpoint that does not load is an error before
    anything is written) and returns the function that writes them into a folder."""
    import torch

    from graded.config import build_data, build_model
    from graded.morphic.diagnostics import write_report

    cfg, task, model, _, _ = _load_run(run_dir, "best")
    torch.manual_seed(cfg.seed)  # the run's initial weights, built as config.build_run builds them
    before = build_model(cfg, task)
    _, test = build_data(cfg, task)
    n = min(len(test), 256)
    batches = [(test.inputs[:n], test.targets[:n])]
    return lambda target: write_report(model, batches, target, before=before)


def cmd_report(args: argparse.Namespace) -> int:
    from graded.config import load_run_config
    from graded.train.report import file_label, run_labels, write_runs_report
    from graded.train.runs import LockHolder, RunFolder, RunLockedError

    given = [Path(r) for r in args.runs]
    absent = [str(path) for path in given if not path.exists()]
    if absent:
        return _fail(f"no such folder: {', '.join(absent)}; expected run folders, or folders "
                     "holding run folders")
    runs, missing = [], []
    for path in given:
        inside = [path] if (path / "metrics.json").exists() else _finished_runs_in(path)
        runs.extend(inside)
        if not inside:
            missing.append(str(path))
    if missing:
        return _fail(f"not finished run folders (no metrics.json), nor folders holding "
                     f"finished runs: {missing}")
    runs = list(run_labels(runs))  # a run given twice, by two spellings, is one run
    # every check before the first write: a report is written whole or not at all
    first_is_run = runs[0] == given[0]
    out = Path(args.out) if args.out else (runs[0] if first_is_run else given[0]) / "report"
    for run in runs:  # a run in training is read, but nothing is written into it
        holder = RunFolder(run).holder()
        if holder is not None and out.resolve().is_relative_to(run.resolve()):
            return _fail(_report_in_use(run, holder, args.out))
    if out.exists() and not out.is_dir():  # before the run's manifest names it as its report
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(out))
    _read_reported(runs)
    morphic = {r: _morphic_diagnostics(r) for r in runs if (r / "config.yaml").is_file()
               and _is_run_config(r) and load_run_config(r).model.architecture == "morphic"}
    if args.out is None and first_is_run:
        try:
            RunFolder(runs[0], purpose="report").record("report")
        except RunLockedError as exc:  # another process took it since the check
            return _fail(_report_in_use(runs[0], LockHolder(exc.holder, exc.purpose), None))
    report = write_runs_report(runs, out)
    labels = run_labels(runs)
    extra = []
    for r, write_diagnostics in morphic.items():
        morphic_dir = out / f"morphic_{file_label(labels[r])}"
        write_diagnostics(morphic_dir)
        link = f"{morphic_dir.name}/report.json"
        extra.append(f"- {labels[r]}: [{link}]({link}), utility histograms, calibration and "
                     "edge ablation PNGs")
    if extra:
        with report.open("a", encoding="utf-8") as fh:
            fh.write("\n## Morphic diagnostics (004 §5.4)\n\n" + "\n".join(extra) + "\n")
    print(f"report: {report}")
    return 0


def _read_reported(runs: list[Path]) -> None:
    """Read every file of ``runs`` that :func:`~graded.train.report.write_runs_report` reads
    (``metrics.json``, ``metrics.csv``, ``grades.jsonl``), so that a damaged or missing one is
    refused before the report folder is made and the first run's manifest records it (it was
    refused after both: ``graded report RUN DAMAGED`` left an empty ``RUN/report/``)."""
    from graded.train.logging import read_grades, read_metrics
    from graded.train.report import read_summary

    for run in runs:
        read_summary(run)
        read_metrics(run)
        read_grades(run)


def _report_in_use(run: Path, holder: Any, out: str | None) -> str:
    """The refusal of a report written into ``run`` while another process (``holder``, a
    :class:`~graded.train.runs.LockHolder`) holds it: how to write it elsewhere (``--out``),
    as ``graded eval`` of a run in use does."""
    base = run if run.name not in ("", "..") else run.resolve()  # "." names no folder
    example = f"graded report {run} --out {base.parent / (base.name + '-report')}"
    if out is not None:
        return (f"--out {out} is inside run folder {run}, which is in use by {holder}; give "
                f"--out DIR outside it, e.g. {example}")
    return (f"run folder {run} is in use by {holder}: its report is read from it but not "
            f"written into it meanwhile; give --out DIR outside it, e.g. {example}")


def _finished_runs_in(folder: Path) -> list[Path]:
    """The finished run folders (with metrics.json) directly inside ``folder``, by name."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if (p / "metrics.json").is_file())


def _is_run_config(run_dir: Path) -> bool:
    """Whether the run was started from a run config (``graded train``, the demo), whose task
    can be rebuilt, rather than from the Python ``Trainer`` with tensors of the user's."""
    from graded.config import read_config_file

    return "task" in read_config_file(run_dir / "config.yaml")


def cmd_demo(args: argparse.Namespace) -> int:
    from graded.demo import DemoInterrupted, run_demo

    try:
        report = run_demo(out_dir=Path(args.out), seeds=args.seeds, quick=args.quick,
                          workers=args.workers)
    except DemoInterrupted as exc:
        print(f"graded demo: {exc}; their run folders are under {args.out}/<task>/; "
              "run `graded demo` again for the report", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"report: {report}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    func = getattr(args, "func", None)
    if func is None:
        return _fail("choose a search method, e.g. `graded search patternboost --help`")
    return int(func(args) or 0)


# --------------------------------------------------------------------------- parser


def _at_least(minimum: int):
    """An argparse type: an int >= ``minimum`` (argparse turns the error into exit code 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _float_in(text: str, ok: Any, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def _positive_float(text: str) -> float:
    return _float_in(text, lambda v: v > 0 and v != float("inf"), "a finite number > 0")


def _probability(text: str) -> float:
    return _float_in(text, lambda v: 0 < v <= 1, "a number in (0, 1]")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Option defaults shown; descriptions and epilogs kept as written.

    A default is added once, and only where it says something: not after a help text that
    states its own default (``--max-new-tokens``: "default: 32, or fewer ..."), and not for
    None, False or an empty list (an option that is off unless given)."""

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
        print(f"graded {__version__} (torch {torch.__version__}, {build})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    fmt = _Formatter
    parser = argparse.ArgumentParser(
        prog="graded", formatter_class=fmt,
        description="Graded transformers (LGT, EGT) and their baselines: train from config "
        "files, evaluate, generate, benchmark, report, and run the demo.",
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
    p.add_argument("config", nargs="?", help="run config (.yaml/.yml/.toml); optional with "
                   "--resume, which reads RUN/config.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=3e-4 (YAML scalar rules; "
                   "repeatable)")
    p.add_argument("--resume", metavar="RUN", help="continue the run folder RUN from its latest "
                   "checkpoint (identical to an uninterrupted run)")
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser("eval", help="evaluate a run's checkpoint on its evaluation split",
                       formatter_class=fmt)
    p.add_argument("run", help="run folder")
    p.add_argument("--checkpoint", default="best",
                   help="'best', 'latest' or a checkpoint folder (a path, or a name in "
                   "RUN/checkpoints/)")
    p.add_argument("--baselines", action="store_true",
                   help="also run the simple baselines (graded.evaluation) on the same split")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="write the result (JSON) to PATH instead of RUN/eval.json; without it, "
                   "a run in use by another process (training) is evaluated and the result "
                   "printed only")
    p.set_defaults(handler=cmd_eval)

    p = sub.add_parser("generate", help="continue a prompt with a trained LM (or classify it)",
                       formatter_class=fmt)
    p.add_argument("run", help="run folder")
    p.add_argument("--prompt", required=True, help="space-separated tokens of the task vocabulary")
    p.add_argument("--checkpoint", default="best", help="'best', 'latest' or a checkpoint "
                   "folder (a path, or a name in RUN/checkpoints/)")
    p.add_argument("--max-new-tokens", type=_at_least(1), default=None,
                   help=f"tokens to add (default: {DEFAULT_NEW_TOKENS}, or fewer where the "
                   "model's max_len leaves less room)")
    p.add_argument("--sample", action="store_true",
                   help="sample instead of greedy decoding (what --temperature, --top-k, "
                   "--top-p and --seed shape; they are refused without it)")
    p.add_argument("--temperature", type=_positive_float, default=1.0,
                   help="sampling temperature (> 0)")
    p.add_argument("--top-k", type=_at_least(1), default=None,
                   help="sample from the k likeliest tokens")
    p.add_argument("--top-p", type=_probability, default=None,
                   help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--num-beams", type=_at_least(1), default=1, help="beam search width (1 = off)")
    p.add_argument("--repetition-penalty", type=_positive_float, default=1.0,
                   help="divide the scores of tokens the sequence holds (> 1 repeats less)")
    p.add_argument("--no-repeat-ngram-size", type=_at_least(0), default=0,
                   help="never repeat an n-gram of this size (0 = off)")
    p.add_argument("--min-new-tokens", type=_at_least(0), default=0,
                   help="no end token before this many new tokens (tasks with one)")
    p.add_argument("--seed", type=_at_least(0), default=None,  # None: not given, seed 0
                   help="sampling seed (default: 0)")
    p.set_defaults(handler=cmd_generate)

    p = sub.add_parser("bench", help="run scripts of benchmarks/ by name", formatter_class=fmt)
    p.add_argument("names", nargs="*", help="benchmark names (file stems); none = list them")
    p.add_argument("--list", action="store_true", help="list the benchmarks")
    p.add_argument("--args", nargs=argparse.REMAINDER, default=[],
                   help="arguments passed to every benchmark script")
    p.set_defaults(handler=cmd_bench)

    p = sub.add_parser("report", help="Markdown + PNG summary of finished runs",
                       formatter_class=fmt)
    p.add_argument("runs", nargs="+", help="run folders, or folders holding run folders "
                   "(e.g. runs: every finished run directly inside)")
    p.add_argument("--out", help="output folder (default: FIRST_RUN/report, or FOLDER/report "
                   "when the first argument is a folder of runs)")
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser("demo", help="baseline vs LGT vs EGT on two graded tasks",
                       formatter_class=fmt, description="Train a baseline transformer, an LGT "
                       "and an EGT (learnable grades, 000 Alg. 5.1/7.1) on two graded tasks "
                       "with several seeds, next to simple baselines; write OUT/report.md.")
    p.add_argument("--out", default="runs/demo", help="output folder")
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
    p.set_defaults(handler=cmd_search)
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


def run_command(handler: Any, args: argparse.Namespace, prog: str = "graded") -> int:
    """``handler(args)`` as the command line runs it: warnings in one line, Ctrl-C reported as
    aborted, a user's error (:func:`_user_errors`) in one line ``<prog>: error: ...`` with exit
    status 2 (GRADED_TRACEBACK=1 shows the tracebacks instead)."""
    shown_as = warnings.formatwarning
    if not os.environ.get("GRADED_TRACEBACK"):
        warnings.formatwarning = _one_line_warning
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("\naborted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _user_errors() as exc:
        if os.environ.get("GRADED_TRACEBACK"):
            raise
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = shown_as


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
    """A warning as the command line prints it: ``graded: warning: ...``, without the source
    file and line of the library code that raised it (GRADED_TRACEBACK=1 shows them)."""
    return f"graded: warning: {message}\n"


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a user's input can cause: a bad value or config (ValueError, which ConfigError and
    CheckpointError are), a missing, unreadable or unwritable file, a run folder in use or a
    refused resume (RunError), a diverged run. Reported in one line with exit code 2;
    GRADED_TRACEBACK=1 shows the traceback instead."""
    from graded.train.runs import RunError

    return (ValueError, OSError, FloatingPointError, RunError)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, PermissionError) and exc.filename:
        return f"cannot write or read {exc.filename}: permission denied"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{exc.filename} does not exist"
    if isinstance(exc, FileExistsError) and exc.filename:
        return f"{exc.filename} exists and is not a folder: expected a folder or a new path"
    if isinstance(exc, NotADirectoryError) and exc.filename:
        return f"cannot use {exc.filename}: a part of that path is a file, not a folder"
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"cannot use {exc.filename}: {exc.strerror.lower()}"
    return str(exc) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
