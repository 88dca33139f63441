"""``graded generate``: continue a prompt with a run's model (or classify it), by greedy
decoding, sampling or beam search, in as many new tokens as the model's ``max_len`` leaves."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from graded.cli.command import _fail
from graded.cli.loading import _load_run

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
    what = ("the start token leaves" if seq2seq else "the prompt's 1 token leaves"
            if prompt_len == 1 else f"the prompt's {prompt_len} tokens leave")
    if room < 1:
        raise ValueError(f"--prompt: {what} no room in the model's max_len={limit}; "
                         f"use a prompt of at most {limit - 1} tokens")
    if requested is None:
        return min(DEFAULT_NEW_TOKENS, room)
    if requested > room:
        raise ValueError(f"--max-new-tokens {requested} does not fit: {what} room for "
                         f"{room} in the model's max_len={limit}")
    return requested


def _decoding_flags(args: argparse.Namespace) -> list[str]:
    """The decoding options given away from their defaults, as flags (``--top-k 2``); the
    parser lists them with their defaults (``decoding_defaults``)."""
    given = []
    for name, default in args.decoding_defaults.items():
        value = getattr(args, name)
        if value != default:
            flag = "--" + name.replace("_", "-")
            given.append(flag if value is True else f"{flag} {value}")
    return given


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from graded.kinds import as_kind

    run_dir = Path(args.run)
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
    if not kind.generates_tokens:
        decoding = _decoding_flags(args)
        if decoding:
            return _fail(f"{', '.join(decoding)}: task {task.name} is {task.kind}, answered from "
                         "the prompt alone with no token generated, so decoding options are "
                         "not used; leave them out")
    elif args.sample and args.num_beams > 1:  # the flags of generate()'s own refusal
        return _fail(f"--sample and --num-beams {args.num_beams} cannot go together: beam "
                     "search does not sample; choose one (--num-beams 1 samples)")
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
    if kind.generates_tokens and args.min_new_tokens > new_tokens:  # it could hold back nothing
        budget = (f"--max-new-tokens {new_tokens}" if args.max_new_tokens is not None
                  else "all that fit in the model's max_len")
        return _fail(f"--min-new-tokens {args.min_new_tokens} is more than the {new_tokens} "
                     f"new tokens generated ({budget}); give at most {new_tokens}")
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
