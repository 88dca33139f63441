"""LM training step at GPT-2 small's shape: ungraded, LGT and EGT ``TransformerLM`` side by
side, with Hugging Face's ``GPT2LMHeadModel`` of the same shape when ``transformers`` is
importable, all interleaved in one run.

A step is: zero the gradients, forward on random token ids (B, T), next-token cross-entropy,
backward, AdamW step (``--dtype`` bfloat16/float16 runs the forward under autocast with float32
parameters, float16 through a gradient scaler, as ``train.precision`` does; ``--compile`` wraps
every model in ``torch.compile``). The ungraded model is GPT-2's architecture as
``graded.interop.gpt2_config`` maps it (learned positions, pre-norm LayerNorm, tanh GELU, tied
output layer); LGT and EGT add grades at every stage, learnable (warm start q_k = 0.01·k) or,
in the "fixed" arms, the same grades as buffers (``--models`` picks arms). Hugging Face's model is
randomly initialised from a ``GPT2Config`` (nothing is downloaded). Reports the median time per
step over ``--rounds`` interleaved rounds, tokens/s (B·T per step), each model's time over the
ungraded one's and its tokens/s over Hugging Face's, and on CUDA the peak memory of a step
above the parameters and optimizer states. Writes ``results.json`` and ``report.md`` to
``--out``.

Each timed call is one step, synchronised with the GPU before and after it: the step's own
latency, host work included. ``--back-to-back K`` times K steps per call instead, with nothing
between them, as a training loop runs that reads its loss only every K steps: the host queues
step n + 1 while the GPU computes step n, so host work the GPU outpaces is hidden. The token
ids are checked once before the timing and the steps run inside
``graded.checks.checked_inputs`` (nothing in them waits for the GPU); the time per step is the
call's over K.

    python benchmarks/lm_training_step.py --device cuda --dtype bfloat16 --out runs/lm_step
    python benchmarks/lm_training_step.py --device cuda --dtype bfloat16 --compile \\
        --out runs/lm_step_compiled
    python benchmarks/lm_training_step.py --device cuda --dtype bfloat16 --back-to-back 5 \
        --no-hf --out runs/lm_step_back_to_back
    python benchmarks/lm_training_step.py --quick     # a tiny shape on the CPU, seconds

``--quick`` sets the shape, ``--rounds`` and ``--warmup`` of ``QUICK`` where the command line
does not give them (``--quick --rounds 1`` times one round).

``--compare-folds`` adds, for each graded arm, a twin ("…, previous folds") that folds its
grading into the weights as the code before 28a0b8f did (all layers at the first ask, float32
products with autograd's backward, cast by ``F.linear`` under autocast:
``graded.folding.FoldedLinears.previous_form``), timed in the same rounds.
``--compare-layers`` adds a twin ("…, layer by layer") that folds and computes its scales layer
by layer (``model.batch_grading = False``): the backward of the batched folds is one node,
run when the last of its layers' gradients is in, after which the GPU waits for the host to
issue its per-map kernels; layer by layer each fold's backward follows its layer's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _timing import (
    PREVIOUS_FOLDS,
    TrainingStep,
    add_device_options,
    check_counts,
    device_and_dtype,
    dtype_name,
    interleaved,
    machine,
    parse_with_quick,
    peak_memory,
    previous_folds,
    table,
)

from graded import TransformerConfig, TransformerLM
from graded.checks import check_token_ids, checked_inputs

# arm -> (grading, learnable grades)
GRADINGS = {"ungraded": (None, False), "LGT": ("linear", True), "EGT": ("exponential", True),
            "LGT fixed": ("linear", False), "EGT fixed": ("exponential", False)}
#: Suffix of the arms that fold and compute their scales layer by layer (``--compare-layers``).
LAYER_BY_LAYER = ", layer by layer"
QUICK = {"d_model": 64, "layers": 2, "heads": 4, "seq_len": 32, "batch": 2, "vocab": 256,
         "rounds": 3, "warmup": 1}


def ungraded_config(args: argparse.Namespace) -> TransformerConfig:
    """GPT-2's architecture at the requested shape (what ``gpt2_config`` maps GPT-2 to)."""
    return TransformerConfig(
        vocab_size=args.vocab, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
        d_ff=4 * args.d_model, max_len=args.seq_len, dropout=0.0, positional="learned",
        activation="gelu_tanh", norm="layer", norm_eps=1e-5, norm_first=True, bias=True,
        tie_embeddings=True)


def hf_gpt2(args: argparse.Namespace, ours: TransformerConfig) -> torch.nn.Module:
    """Hugging Face's GPT2LMHeadModel of the same shape, randomly initialised, with its
    defaults otherwise. Among them ``use_cache=True``: each training forward also fills a
    ``DynamicCache`` (transformers 5: a ``torch.cat`` of each layer's keys and values onto an
    empty tensor, and its backward), work our model does not do; ``use_cache=False`` avoids
    the copies but sends its causal mask through a packed-sequence check that reads a value
    back to the host (a synchronisation on a GPU). The default is what a training script
    that leaves the config alone gets; either way a small share of a step."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    from graded.interop import gpt2_config

    transformers.logging.set_verbosity_error()
    cfg = GPT2Config(vocab_size=args.vocab, n_positions=args.seq_len, n_embd=args.d_model,
                     n_layer=args.layers, n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1)
    if gpt2_config(cfg) != ours:
        raise AssertionError("the GPT-2 model and the ungraded TransformerLM differ in shape")
    return GPT2LMHeadModel(cfg)


def build(args: argparse.Namespace, device: torch.device) -> dict[str, torch.nn.Module]:
    base = ungraded_config(args)
    models: dict[str, torch.nn.Module] = {}
    for name in args.models:
        grading, learnable = GRADINGS[name]
        extra = {} if grading is None else dict(grading=grading, learnable_grades=learnable,
                                                 grade_init="warm_start", grade_init_value=0.01)
        twins = [name] + ([name + PREVIOUS_FOLDS]
                          if grading is not None and args.compare_folds else [])
        twins += [name + LAYER_BY_LAYER] if grading is not None and args.compare_layers else []
        for arm in twins:
            torch.manual_seed(0)
            models[arm] = TransformerLM(TransformerConfig(**{**base.model_dump(), **extra}))
            models[arm].batch_grading = not arm.endswith(LAYER_BY_LAYER)
    if args.hf and importable("transformers"):
        torch.manual_seed(0)
        models["HF GPT-2"] = hf_gpt2(args, base)
    return {name: m.to(device).train() for name, m in models.items()}


def importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def logits_of(model: torch.nn.Module, compile: bool):
    """The function from token ids to logits of ``model`` (compiled when asked)."""
    forward = torch.compile(model) if compile else model
    if isinstance(model, TransformerLM):
        return forward
    return lambda ids: forward(input_ids=ids).logits  # a Hugging Face causal LM


def back_to_back(step: TrainingStep, k: int):
    """``k`` steps in a row inside ``checked_inputs`` (the ids were checked once)."""
    def steps() -> None:
        with checked_inputs():
            for _ in range(k):
                step()
    return steps


def run(args: argparse.Namespace) -> dict:
    device, dtype = device_and_dtype(args)
    models = build(args, device)
    x = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1),
                      generator=torch.Generator().manual_seed(0)).to(device)
    steps = {}
    for name, model in models.items():
        steps[name] = TrainingStep(logits_of(model, args.compile), model.parameters(), x,
                                   dtype=dtype)
    k = args.back_to_back
    single = {name: previous_folds(step) if name.endswith(PREVIOUS_FOLDS) else step
              for name, step in steps.items()}
    calls = single if k == 1 else {name: back_to_back(step, k) for name, step in single.items()}
    if k > 1:
        check_token_ids(x, args.vocab)
    times = interleaved(calls, rounds=args.rounds, warmup=args.warmup, device=device)
    times = {name: t / k for name, t in times.items()}
    tokens = args.batch * args.seq_len
    results = {}
    for name, model in models.items():
        sec = times[name]
        steps[name].opt.zero_grad(set_to_none=True)  # the peak counts gradients, not the base
        results[name] = {
            "params": sum(p.numel() for p in model.parameters()),
            "ms_per_step": sec * 1e3,
            "tokens_per_s": tokens / sec,
            "time_over_ungraded": sec / times["ungraded"],
            "peak_memory_bytes": peak_memory(single[name], device),
        }
        if "HF GPT-2" in times:
            results[name]["tokens_per_s_over_hf"] = times["HF GPT-2"] / sec
    hf = models.get("HF GPT-2")
    return {
        "shape": {"d_model": args.d_model, "layers": args.layers, "heads": args.heads,
                  "seq_len": args.seq_len, "batch": args.batch, "vocab": args.vocab},
        "device": str(device), "dtype": dtype_name(dtype), "compile": args.compile,
        "rounds": args.rounds, "warmup": args.warmup, "back_to_back": args.back_to_back,
        "compare_folds": args.compare_folds,
        "machine": machine(device),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "hf_attention": None if hf is None else hf.config._attn_implementation,
        "hf_skipped": None if hf is not None else (
            "--no-hf" if not args.hf else "transformers is not importable"),
        "models": results,
    }


def report(res: dict) -> str:
    s = res["shape"]
    rows = []
    for name, r in res["models"].items():
        mem = r["peak_memory_bytes"]
        rows.append([name, f"{r['params'] / 1e6:.2f}", f"{r['ms_per_step']:.1f}",
                     f"{r['tokens_per_s']:.0f}", f"{r['time_over_ungraded']:.3f}",
                     f"{r['tokens_per_s_over_hf']:.3f}" if "tokens_per_s_over_hf" in r else "-",
                     "-" if mem is None else f"{mem / 2**20:.0f}"])
    hf = (f"Hugging Face attention: {res['hf_attention']}." if res["hf_attention"]
          else f"Hugging Face GPT-2 left out ({res['hf_skipped']}).")
    return "\n".join([
        f"# LM training step (forward, backward, AdamW): d_model {s['d_model']}, {s['layers']} "
        f"layers, {s['heads']} heads, T={s['seq_len']}, B={s['batch']}, vocab {s['vocab']}",
        "",
        f"{res['device']}, {res['dtype']}{' (autocast)' if res['dtype'] != 'float32' else ''}"
        f"{', torch.compile' if res['compile'] else ''}; median of {res['rounds']} interleaved "
        f"rounds after {res['warmup']} warm-up calls; {_per_call(res.get('back_to_back', 1))}; "
        f"{res['machine']}. {hf}",
        "",
        table(["model", "params (M)", "ms/step", "tokens/s", "time / ungraded",
               "tokens/s / HF", "peak MiB"], rows),
        "",
        "peak MiB (CUDA only): the most memory torch allocated during one step beyond what was "
        "allocated before it (every model's parameters and optimizer state): gradients, "
        "activations, temporaries.",
        "",
    ])


def _per_call(k: int) -> str:
    if k == 1:
        return "one step per call, synchronised with the device before and after"
    return (f"{k} steps back to back per call (synchronised only around the call, inputs "
            "checked once), time per step = call / " + str(k))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"a tiny shape and few rounds (sets {', '.join(QUICK)} where not "
                   "given)")
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per row (T)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--rounds", type=int, default=10, help="timed rounds per model")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
    p.add_argument("--compile", action="store_true", help="torch.compile every model")
    p.add_argument("--back-to-back", type=int, default=1, metavar="K",
                   help="time K steps per call with nothing between them (default 1: one "
                   "step, synchronised before and after)")
    p.add_argument("--models", nargs="+", default=list(GRADINGS), choices=list(GRADINGS),
                   metavar="ARM", help=f"our arms to time (default all: {', '.join(GRADINGS)}); "
                   "the ungraded one is always timed")
    p.add_argument("--compare-folds", action="store_true",
                   help="each graded arm also with the folds of the code before 28a0b8f "
                   "(a twin arm, same rounds)")
    p.add_argument("--compare-layers", action="store_true",
                   help="each graded arm also folding layer by layer (batch_grading=False; a "
                   "twin arm, same rounds)")
    p.add_argument("--no-hf", dest="hf", action="store_false",
                   help="leave Hugging Face's GPT-2 out even when transformers is importable")
    p.add_argument("--out", type=Path, default=Path("runs/lm_training_step"))
    add_device_options(p, "autocast dtype of the forward passes (float32: none)")
    args = parse_with_quick(p, argv, QUICK)
    check_counts(p, args, {**dict.fromkeys(("back_to_back", "d_model", "layers", "heads",
                                            "seq_len", "batch", "vocab", "rounds"), 1),
                           "warmup": 0})
    args.models = ["ungraded"] + [m for m in dict.fromkeys(args.models) if m != "ungraded"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    res = run(args)
    text = report(res)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(res, indent=1))
    (args.out / "report.md").write_text(text)
    print(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
