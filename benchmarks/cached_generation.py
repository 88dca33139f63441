"""Memory and time per token of cached generation, 4096 tokens (issue 16).

A small decoder-only LM (d_model 64, 4 heads, 2 layers, rotary positions) generates --tokens
tokens greedily from a one-token prompt with its KV cache / decoding state, once per backend:
``sliding_window`` (rolling window of --window keys), ``linear`` and ``performer`` (running
sums), and ``full`` (a growing key/value cache) for comparison. The decoding loop is the one
``generate`` runs (one forward call per token with the cache); the backends are stepped in
alternation, token by token (``_timing.round_order``: each in each place in turn, none twice
in a row), so that drift in machine load hits all of them alike. Reported
per block of --block tokens: the median seconds per token and the bytes held by the cache at
the end of the block (``KVCache.nbytes``: keys, values, decoding states, positions, padding).
"Flat" is the ratio of the last block's median time to the first block's. ``--backends``
runs a subset (the growing ``full`` cache, stepped in alternation with the others, slows
them slightly as it grows; leave it out to time the constant-memory backends alone).

    .venv/bin/python benchmarks/cached_generation.py            # 4096 tokens
    .venv/bin/python benchmarks/cached_generation.py --quick    # 256 tokens
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import check_counts, machine, parse_with_quick, round_order, table

from graded import TransformerConfig, TransformerLM

BACKENDS = {
    "sliding_window": lambda window: {"window": window},
    "linear": lambda window: {},
    "performer": lambda window: {"num_features": 32, "seed": 0},
    "full": lambda window: {},
}


def build(name: str, window: int, max_len: int) -> TransformerLM:
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=64, d_model=64, n_heads=4, n_layers=2, max_len=max_len,
                            positional="rope", attn_backend=name,
                            attn_backend_options=BACKENDS[name](window))
    return TransformerLM(cfg).eval()


@torch.no_grad()
def run(tokens: int, block: int, window: int, backends: list[str]) -> dict:
    models = {name: build(name, window, tokens + 8) for name in backends}
    caches = {name: m.new_cache() for name, m in models.items()}
    last = {}
    for name, model in models.items():  # the prompt: one token
        logits = model(torch.zeros(1, 1, dtype=torch.long), cache=caches[name])
        last[name] = logits[:, -1].argmax(-1, keepdim=True)
    times: dict[str, list[float]] = {name: [] for name in models}
    nbytes: dict[str, list[int]] = {name: [] for name in models}
    order = list(models)
    for t in range(tokens - 1):
        for name in round_order(order, t):
            start = time.perf_counter()
            logits = models[name](last[name], cache=caches[name])
            last[name] = logits[:, -1].argmax(-1, keepdim=True)
            times[name].append(time.perf_counter() - start)
        if (t + 2) % block == 0:
            for name in models:
                nbytes[name].append(caches[name].nbytes)
    out = {}
    for name in models:
        blocks = [statistics.median(times[name][i:i + block])
                  for i in range(0, len(times[name]), block)]
        out[name] = {"ms_per_token": [1e3 * b for b in blocks], "cache_bytes": nbytes[name],
                     "flat": blocks[-1] / blocks[0],
                     "length": caches[name].length}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true",
                    help="256 tokens, blocks of 64, window 16 (where not given)")
    args = parse_with_quick(ap, argv, {"tokens": 256, "block": 64, "window": 16})
    check_counts(ap, args, dict.fromkeys(("block", "window", "threads"), 1))
    if args.tokens < 2 or args.tokens % args.block:
        ap.error(f"--tokens must be a multiple of --block ({args.block}) and at least 2, got "
                 f"{args.tokens} (each column of the table is a whole block)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    result = run(args.tokens, args.block, args.window, args.backends)
    wall = time.perf_counter() - began
    ends = [str(args.block * (i + 1)) for i in range(args.tokens // args.block)]
    rows = []
    for name, r in result.items():
        rows.append([f"`{name}`", "ms/token"] + [f"{v:.3f}" for v in r["ms_per_token"]]
                    + [f"{r['flat']:.2f}"])
        rows.append(["", "cache KiB"] + [f"{b / 1024:.1f}" for b in r["cache_bytes"]] + [""])
    print(f"Cached greedy generation of {args.tokens} tokens, blocks of {args.block} "
          f"(sliding window {args.window}); {machine()}; {wall:.0f} s in all\n")
    print(table(["backend", "per block ending at token", *ends, "flat (last/first)"], rows))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "machine": machine(), "wall_s": wall,
                                         "result": result}, indent=1))


if __name__ == "__main__":
    main()
