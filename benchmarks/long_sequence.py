"""Long-sequence benchmark of the attention backends (issue 7, SPEC C8; 002 §4.3.2, §7.2).

For every backend, interleaved in one run, at lengths T = 256 … 16384 and d = 64 per head:

- wall time of the forward pass (no grad) and of forward + backward (median of repeats; the
  backends take turns inside each repeat, so machine noise hits them alike);
- peak memory of both, on CPU as the rise of the resident set's high-water mark (VmHWM, reset
  through /proc/self/clear_refs) above the resident size just before the call, in a fresh
  subprocess per (backend, T). tracemalloc cannot see torch's allocations and torch keeps no
  peak statistic for CPU memory, so the OS high-water mark is the honest measurement; the
  subprocess fixes glibc's mmap threshold so that large freed blocks go back to the OS and the
  resident set follows torch's live tensors. On CUDA (``--device cuda``) it is torch's own
  statistic, ``torch.cuda.max_memory_allocated`` above the memory allocated before the call
  (``--memory-backends`` limits it to some backends; ``--quick`` measures full alone);
- the bytes autograd saves for backward (an analytic count from ``saved_tensors_hooks``,
  deduplicated by storage), which is what the backward pass must keep alive;
- approximation error ‖y − y_full‖ / ‖y_full‖ against full attention as a function of each
  approximate backend's knob (features, rank, window, random blocks, rounds, dilation,
  summary positions).

Writes ``results.json``, ``report.md`` (tables, crossover lengths, the slope check
time_linear(16384) / time_linear(4096) <= 4.5) and PNG plots to ``--out``.

    python benchmarks/long_sequence.py --out runs/long_sequence          # full run
    python benchmarks/long_sequence.py --quick --out runs/long_sequence  # seconds-long check
    python benchmarks/long_sequence.py --device cuda --dtype bfloat16 --out runs/ls_cuda

``--device`` and ``--dtype`` (default cpu, float32) set where q, k, v and the backends live and
their dtype; on CUDA every timed call is bracketed by ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _timing import (
    add_device_options,
    check_counts,
    device_and_dtype,
    dtype_name,
    machine,
    parse_with_quick,
    peak_memory,
    synchronize,
)

from graded.attention.backends import available_backends, get_backend

LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]
QUICK_LENGTHS = [256, 512]


def backend_options(name: str, t: int) -> dict:
    """The settings each backend is benchmarked with at length t."""
    stride = 2 ** round(math.log2(math.sqrt(t)))
    n_blocks = -(-t // 64)
    band = [[abs(i - j) <= 1 or j == 0 for j in range(n_blocks)] for i in range(n_blocks)]
    return {
        "full": {},
        "explicit": {},
        "chunked": {"query_chunk": 512, "key_chunk": 512},
        "sliding_window": {"window": 128},
        "dilated": {"dilation": stride},  # the Sparse Transformer's strided head, l ≈ √T
        # its fixed pattern, l ≈ √T and c = l/16 (the paper's example: l = 128, c = 8)
        "sparse_fixed": {"block": stride, "summary": max(1, stride // 16)},
        "block_sparse": {"layout": band, "block_size": 64},
        "bigbird": {"block_size": 64, "num_global_blocks": 1, "num_random_blocks": 3},
        "linear": {"chunk_size": 64},
        "performer": {"num_features": 256, "seed": 0},
        "linformer": {"max_len": t, "rank": 256},
        "lsh": {"n_rounds": 2, "chunk_size": 64, "seed": 0},
    }[name]


def make_backend(args: argparse.Namespace, name: str, t: int):
    """Backend ``name`` with its benchmark settings at length t, on ``--device`` in
    ``--dtype`` (parameters and buffers such as Linformer's projections)."""
    return get_backend(name, **backend_options(name, t)).to(args.device, args.dtype)


def make_inputs(args: argparse.Namespace, t: int, grad: bool) -> tuple[torch.Tensor, ...]:
    """q, k, v (B, H, t, d), drawn on the CPU (the same values on every device)."""
    g = torch.Generator().manual_seed(t)
    shape = (args.batch, args.heads, t, args.head_dim)
    return tuple(torch.randn(shape, generator=g).to(args.device, args.dtype).requires_grad_(grad)
                 for _ in range(3))


def run_once(backend, qkv, causal: bool, backward: bool) -> None:
    out = backend(*qkv, is_causal=causal)
    if backward:
        out.sum().backward()


def timed(backend, args, t: int, backward: bool) -> float:
    qkv = make_inputs(args, t, backward)
    synchronize(args.device)
    start = time.perf_counter()
    if backward:
        run_once(backend, qkv, args.causal, True)
    else:
        with torch.no_grad():
            run_once(backend, qkv, args.causal, False)
    synchronize(args.device)
    return time.perf_counter() - start


def saved_bytes(backend, args, t: int) -> int:
    """Bytes of distinct storages autograd saves for backward, inputs excluded."""
    qkv = make_inputs(args, t, True)
    inputs = {x.untyped_storage().data_ptr() for x in qkv}
    seen: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        ptr = x.untyped_storage().data_ptr()
        if ptr not in inputs:
            seen[ptr] = x.untyped_storage().nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        backend(*qkv, is_causal=args.causal)
    return sum(seen.values())


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_growth(fn) -> int:
    """Bytes by which the resident set's high-water mark rises above its current size during
    fn(). Resets the mark first (writing 5 to /proc/self/clear_refs, Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    base = _status_kib("VmRSS:")
    fn()
    return max(_status_kib("VmHWM:") - base, 0) * 1024


def measure_memory_here(args: argparse.Namespace) -> None:
    """Subprocess entry: peak RSS growth of forward, then of forward + backward (JSON).

    Runs the call once untimed first at min(T, 1024) (kernels, thread pools load), and the
    parent sets MALLOC_MMAP_THRESHOLD_ so that large blocks are mapped and unmapped, not kept
    in the heap, so a freed warm-up tensor cannot hide a later allocation."""
    name, t = args.measure_memory[0], int(args.measure_memory[1])
    backend = make_backend(args, name, t)
    warm_t = min(t, 1024)
    run_once(make_backend(args, name, warm_t), make_inputs(args, warm_t, True), args.causal, True)
    qkv = make_inputs(args, t, True)

    def forward() -> None:
        with torch.no_grad():
            run_once(backend, qkv, args.causal, False)

    fwd = _peak_growth(forward)
    both = _peak_growth(lambda: run_once(backend, qkv, args.causal, True))
    print(json.dumps({"forward": fwd, "forward_backward": both}))


def cuda_memory(args: argparse.Namespace, name: str, t: int, backend=None) -> dict:
    """Peak CUDA memory above the inputs of forward, then of forward + backward (of
    ``backend``, the timed instance, whose compiled kernels are built; default a new one)."""
    backend = make_backend(args, name, t) if backend is None else backend
    qkv = make_inputs(args, t, True)

    def forward() -> None:
        with torch.no_grad():
            run_once(backend, qkv, args.causal, False)

    fwd = peak_memory(forward, args.device)
    both = peak_memory(lambda: run_once(backend, qkv, args.causal, True), args.device)
    return {"forward": fwd, "forward_backward": both}


def measure_memory(args: argparse.Namespace, name: str, t: int, backend=None) -> dict | str:
    """Peak memory of forward and of forward + backward: torch's statistic on CUDA (of
    ``backend`` when given), the resident set's high-water mark in a fresh subprocess on CPU."""
    if args.device.type == "cuda":
        try:
            return cuda_memory(args, name, t, backend)
        except torch.OutOfMemoryError as err:
            torch.cuda.empty_cache()
            return f"failed: {str(err).splitlines()[0]}"
    return memory_in_subprocess(args, name, t)


def memory_in_subprocess(args: argparse.Namespace, name: str, t: int) -> dict | str:
    cmd = [
        sys.executable, __file__, "--measure-memory", name, str(t), "--batch", str(args.batch),
        "--heads", str(args.heads), "--head-dim", str(args.head_dim),
        "--threads", str(args.threads), "--dtype", dtype_name(args.dtype),
    ] + (["--causal"] if args.causal else [])
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.max_seconds * 6,
                          env=env)
    if proc.returncode != 0:
        return f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr else proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def benchmark_speed(args: argparse.Namespace, names: list[str]) -> dict:
    """Interleaved timing: for each T and repeat, every backend runs in a rotated order."""
    results: dict = {n: {} for n in names}
    last: dict[str, float] = {}
    for name in names:  # untimed warm-up: first calls load kernels and thread pools
        if not (name == "linformer" and args.causal):
            timed(make_backend(args, name, 128), args, 128, True)
    for t in args.lengths:
        active = []
        for name in names:
            if name == "linformer" and args.causal:
                results[name][t] = {"skipped": "no causal form"}
            elif name in last and last[name] * args.growth(name) > args.max_seconds:
                results[name][t] = {"skipped": f"predicted > {args.max_seconds}s"}
            elif name in ("full", "explicit", "chunked") and t > args.dense_max_len:
                results[name][t] = {"skipped": f"dense above --dense-max-len {args.dense_max_len}"}
            else:
                active.append(name)
        times: dict[str, dict[str, list[float]]] = {n: {"fwd": [], "fwd_bwd": []} for n in active}
        refused: dict[str, str] = {}
        backends = {name: make_backend(args, name, t) for name in active}
        if args.device.type == "cuda":  # untimed: compiled kernels (FlexAttention) are built
            for name in active:          # per length and grad mode on their first call
                try:
                    timed(backends[name], args, t, False)
                    timed(backends[name], args, t, True)
                except torch.OutOfMemoryError as err:
                    torch.cuda.empty_cache()
                    refused[name] = str(err).splitlines()[0]
        for rep in range(args.repeats):
            order = active[rep % max(len(active), 1):] + active[: rep % max(len(active), 1)]
            for name in order:
                if name in refused or (times[name]["fwd_bwd"]
                                       and times[name]["fwd_bwd"][0] > args.max_seconds / 4):
                    continue  # one sample of a slow call is enough
                backend = backends[name]
                try:
                    times[name]["fwd"].append(timed(backend, args, t, False))
                    times[name]["fwd_bwd"].append(timed(backend, args, t, True))
                except torch.OutOfMemoryError as err:  # CUDA out of memory
                    del backend, backends[name]
                    torch.cuda.empty_cache()
                    refused[name] = str(err).splitlines()[0]
                except MemoryError as err:
                    refused[name] = str(err).split(";")[0]
        for name in active:
            if name in refused:
                results[name][t] = {"skipped": refused[name]}
                continue
            entry = {k: statistics.median(v) for k, v in times[name].items()}
            entry["saved_bytes"] = saved_bytes(backends[name], args, t)
            if not args.no_memory and t in args.memory_lengths and (
                    args.memory_backends is None or name in args.memory_backends):
                entry["memory"] = measure_memory(args, name, t, backends[name])
            results[name][t] = entry
            last[name] = entry["fwd_bwd"]
        del backends
        print(f"T={t}: " + ", ".join(
            f"{n} {results[n][t].get('fwd_bwd', float('nan')):.3f}s" for n in active
            if "fwd_bwd" in results[n][t]), flush=True)
    return results


ERROR_SWEEPS = {
    "performer": ("num_features", [16, 64, 256, 1024, 4096]),
    "linformer": ("rank", [16, 64, 256, 1024]),
    "sliding_window": ("window", [16, 32, 64, 128, 256, 512]),
    "dilated": ("dilation", [2, 4, 8, 16, 32]),
    "sparse_fixed": ("summary", [1, 2, 4, 8, 16]),
    "bigbird": ("num_random_blocks", [0, 1, 2, 4, 8]),
    "lsh": ("n_rounds", [1, 2, 4, 8]),
    "linear": ("(elu+1 kernel)", [0]),
    "chunked": ("(exact)", [0]),
}


def error_sweep(args: argparse.Namespace, qk_scale: float) -> dict:
    """Relative error against full attention as each backend's knob varies (seeds averaged);
    q and k are Gaussian times ``qk_scale`` (larger = peakier attention)."""
    t = args.error_length
    full = get_backend("full")
    out: dict = {}
    for name, (knob, values) in ERROR_SWEEPS.items():
        out[name] = {"knob": knob, "values": [], "error": []}
        for val in values:
            errs = []
            for seed in range(args.error_seeds):
                g = torch.Generator().manual_seed(1000 + seed)
                q, k, v = (torch.randn(1, args.heads, t, args.head_dim, generator=g)
                           .to(args.device, args.dtype) for _ in range(3))
                q, k = q * qk_scale, k * qk_scale
                opts = dict(backend_options(name, t))
                if not knob.startswith("("):
                    opts[knob] = val
                if name in ("performer", "lsh", "bigbird"):
                    opts["seed"] = seed
                if name == "linformer":  # segment-mean projections: identity at rank = T
                    backend = get_backend(name, **opts).to(args.device, args.dtype)
                    pool = torch.zeros(val, t)
                    for row, cols in enumerate(torch.arange(t).chunk(val)):
                        pool[row, cols] = 1.0 / len(cols)
                    with torch.no_grad():
                        backend.E.copy_(pool)
                        backend.F.copy_(pool)
                if name == "sliding_window" and val > opts.get("window", 0):
                    opts["block_size"] = val
                causal = args.causal and name != "linformer"
                with torch.no_grad():
                    ref = full(q, k, v, is_causal=causal)
                    if name != "linformer":
                        backend = get_backend(name, **opts).to(args.device, args.dtype)
                    approx = backend(q, k, v, is_causal=causal)
                errs.append(((approx - ref).norm() / ref.norm()).item())
            out[name]["values"].append(val)
            out[name]["error"].append(statistics.mean(errs))
    return out


def crossover(results: dict, name: str, key: str) -> int | None:
    """Smallest T from which `name` is faster than `full` at every larger measured T."""
    common = sorted(t for t in results["full"] if key in results["full"][t]
                    and key in results.get(name, {}).get(t, {}))
    best = None
    for t in reversed(common):
        if results[name][t][key] < results["full"][t][key]:
            best = t
        else:
            break
    return best


def write_report(args, results: dict, errors: dict, out: Path) -> str:
    lines = [
        "# Long-sequence attention benchmark", "",
        f"batch {args.batch}, heads {args.heads}, d {args.head_dim} per head, "
        f"{'causal' if args.causal else 'non-causal'}, {dtype_name(args.dtype)}, "
        f"{args.threads} threads, torch {torch.__version__}, repeats {args.repeats} (median)"
        + ("." if args.device.type == "cpu" else f"; {machine(args.device)}."), "",
        "## Time (s): forward / forward+backward", "",
        "| backend | " + " | ".join(str(t) for t in args.lengths) + " |",
        "|---|" + "---|" * len(args.lengths),
    ]
    for name, row in results.items():
        cells = []
        for t in args.lengths:
            e = row.get(t, {})
            cells.append(f"{e['fwd']:.4f} / {e['fwd_bwd']:.4f}" if "fwd" in e
                         else f"skipped ({e.get('skipped', '-')})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    peak_kind = ("peak RSS growth" if args.device.type == "cpu"
                 else "peak CUDA memory above the inputs")
    lines += ["", f"## Memory (MiB): {peak_kind} forward / forward+backward; saved for "
              "backward", "", "| backend | " + " | ".join(str(t) for t in args.lengths) + " |",
              "|---|" + "---|" * len(args.lengths)]
    for name, row in results.items():
        cells = []
        for t in args.lengths:
            e = row.get(t, {})
            mem = e.get("memory")
            peak = (f"{mem['forward'] / 2**20:.1f} / {mem['forward_backward'] / 2**20:.1f}"
                    if isinstance(mem, dict) else (mem or "-"))
            cells.append(f"{peak}; {e['saved_bytes'] / 2**20:.1f}" if "saved_bytes" in e
                         else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Crossover with the fused kernel (`full`)", "",
              "| backend | forward faster from T = | forward+backward faster from T = |",
              "|---|---|---|"]
    for name in results:
        if name != "full":
            a, b = crossover(results, name, "fwd"), crossover(results, name, "fwd_bwd")
            lines.append(f"| {name} | {a or 'not within measured T'} | "
                         f"{b or 'not within measured T'} |")
    lines += ["", "## Slope check", ""]
    lin = results.get("linear", {})
    for key in ("fwd", "fwd_bwd"):
        if key in lin.get(16384, {}) and key in lin.get(4096, {}):
            ratio = lin[16384][key] / lin[4096][key]
            verdict = "PASS" if ratio <= 4.5 else "FAIL"
            lines.append(
                f"- linear {key}: time(16384)/time(4096) = {ratio:.2f} (<= 4.5: {verdict})"
            )
        else:
            lines.append(f"- linear {key}: T = 4096 and 16384 not both measured in this run")
    lines += ["", f"## Approximation error against full attention (T = {args.error_length}, "
              "Gaussian q, k, v with q and k scaled by s, mean of seeds; linformer with "
              "segment-mean projections)", "",
              "| backend | knob | values | s | rel. error |", "|---|---|---|---|---|"]
    for scale, sweep in errors.items():
        for name, e in sweep.items():
            lines.append(f"| {name} | {e['knob']} | {e['values']} | {scale} | "
                         f"{[round(x, 4) for x in e['error']]} |")
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def plot(args, results: dict, errors: dict, out: Path) -> None:
    from graded.plotting import pyplot, save_figure

    plt = pyplot()

    names = list(results)

    def style(name: str) -> dict:  # 11 backends: distinct colours, dashed for exact ones
        exact = name in ("full", "explicit", "chunked")
        return {"color": plt.cm.tab20(names.index(name) % 20), "marker": "o",
                "linestyle": "--" if exact else "-", "label": name}

    for key, label in (("fwd", "forward"), ("fwd_bwd", "forward + backward")):
        fig, ax = plt.subplots(figsize=(7, 5))
        for name, row in results.items():
            ts = [t for t in args.lengths if key in row.get(t, {})]
            if ts:
                ax.loglog(ts, [row[t][key] for t in ts], **style(name))
        ax.set(xlabel="sequence length T", ylabel="seconds", title=f"time, {label}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        save_figure(fig, out / f"time_{key}.png", dpi=120)
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, row in results.items():
        ts = [t for t in args.lengths if isinstance(row.get(t, {}).get("memory"), dict)]
        if ts:
            ax.loglog(ts, [max(row[t]["memory"]["forward_backward"], 1) / 2**20 for t in ts],
                      **style(name))
    peak_kind = "peak RSS growth" if args.device.type == "cpu" else "peak CUDA memory"
    ax.set(xlabel="sequence length T", ylabel="MiB", title=f"{peak_kind}, forward + backward")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    save_figure(fig, out / "memory.png", dpi=120)
    first = next(iter(errors.values()))
    sweeps = [n for n in first if len(first[n]["values"]) > 1]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(3 * len(sweeps), 3), squeeze=False)
    for ax, name in zip(axes[0], sweeps):
        for scale, sweep in errors.items():
            ax.plot(sweep[name]["values"], sweep[name]["error"], marker="o",
                    label=f"s = {scale}")
        ax.set_xscale("symlog", base=2, linthresh=1)  # symlog: the knob may be 0
        ax.set(title=name, xlabel=first[name]["knob"], ylabel="relative error")
        ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, out / "approximation_error.png", dpi=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/long_sequence"))
    p.add_argument("--quick", action="store_true",
                   help="tiny lengths and sweeps, one repeat and error seed (where not given): "
                   "a smoke run")
    p.add_argument("--lengths", type=int, nargs="+", default=None)
    p.add_argument("--backends", nargs="+", default=None, help="default: all registered")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--causal", action="store_true")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="skip a backend at T when its predicted forward+backward time exceeds this")
    p.add_argument("--dense-max-len", type=int, default=16384,
                   help="skip full/explicit/chunked above this length")
    p.add_argument("--no-memory", action="store_true", help="skip the RSS subprocesses")
    p.add_argument("--memory-backends", nargs="+", default=None,
                   help="measure the RSS of these backends only (default: every backend timed; "
                        "--quick: full alone, as each measurement is a fresh process)")
    p.add_argument("--error-length", type=int, default=None)
    p.add_argument("--error-seeds", type=int, default=3)
    p.add_argument("--error-qk-scale", type=float, nargs="+", default=[1.0, 0.5],
                   help="scales of q and k in the error sweep (larger = peakier attention)")
    p.add_argument("--measure-memory", nargs=2, metavar=("BACKEND", "T"), help=argparse.SUPPRESS)
    add_device_options(p, "dtype of q, k, v and of the backends' parameters (default float32)")
    args = parse_with_quick(p, argv, {"repeats": 1, "error_seeds": 1})
    if args.lengths is not None and min(args.lengths) < 1:
        p.error(f"--lengths must be positive sequence lengths, got {args.lengths}")
    check_counts(p, args, dict.fromkeys(("repeats", "error_seeds", "batch", "heads",
                                         "head_dim", "threads"), 1))
    args.device, args.dtype = device_and_dtype(args)
    if args.quick:
        args.lengths = args.lengths or QUICK_LENGTHS
        args.error_length = args.error_length or 256
        for name in ERROR_SWEEPS:
            knob, values = ERROR_SWEEPS[name]
            ERROR_SWEEPS[name] = (knob, values[:2])
    args.lengths = args.lengths or LENGTHS
    args.error_length = args.error_length or 1024
    args.memory_lengths = args.lengths[:1] if args.quick else args.lengths
    if args.quick and args.memory_backends is None:
        args.memory_backends = ["full"]
    quadratic = {"full", "explicit", "chunked"}
    t_sqrt_t = {"dilated", "sparse_fixed"}  # O(T√T) at l ≈ √T
    args.growth = lambda name: 4.5 if name in quadratic else (3.0 if name in t_sqrt_t else 2.5)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.measure_memory:
        measure_memory_here(args)
        return
    names = args.backends or available_backends()
    unknown = sorted(set(names) - set(available_backends()))
    if unknown:
        raise SystemExit(f"unknown backends {unknown}; available: {available_backends()}")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = benchmark_speed(args, names)
    errors = {str(s): error_sweep(args, s) for s in args.error_qk_scale}
    (args.out / "results.json").write_text(json.dumps(
        {"speed": {n: {str(t): e for t, e in r.items()} for n, r in results.items()},
         "error": errors}, indent=1))
    print(write_report(args, results, errors, args.out))
    plot(args, results, errors, args.out)
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
