"""Two GPU diagnostics (CUDA only), run as measured for docs/gpu.md:

1. Where grading's eager cost goes: one bf16 training step (autocast, AdamW) of an ungraded
   ``TransformerLM`` (the default architecture at d_model 768, 12 layers, 12 heads, T = 1024,
   B = 8, vocabulary 50257) and of LGT and EGT with learnable and with fixed grades (and LGT
   with ``fold_grading=False``: grading applied to the activations), each profiled for the
   number of CUDA kernels and their summed GPU time, then timed: the mean wall time of 5 steps
   run back to back, and the mean CPU time until a step returns (each step synchronised
   first, so that the host is not held up by earlier work), and per phase (forward with the
   loss, backward, optimizer) the time on the GPU's timeline (CUDA events at the phase
   boundaries, idle time included) and on the host. Kernel time close to the ungraded
   model's with a larger wall time means the GPU waits: on the host launching kernels when
   the host time is close to the wall time.
2. FlexAttention's compilation inside a model: a 4-layer ``sliding_window`` LM's first and
   second bf16 forward + backward and dynamo's frame counters.

    python benchmarks/gpu_diagnostics.py
    python benchmarks/gpu_diagnostics.py --quick --device cpu   # a tiny shape: a smoke run

On the CPU (``--device cpu``) a step's kernels are counted from its dispatched ATen operators
instead (``_timing.kernels_of``: views and allocations none, a foreach operator one per tensor
off torch's fused route), and the FlexAttention check is skipped:

    python benchmarks/gpu_diagnostics.py --device cpu --quick --layers 12
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch._dynamo.utils as dynamo_utils
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from _timing import KernelCount

from graded import TransformerConfig, TransformerLM

FULL = dict(vocab=50257, d_model=768, heads=12, layers=12, seq_len=1024, batch=8)
QUICK = dict(vocab=256, d_model=64, heads=4, layers=2, seq_len=32, batch=2)


def kernel_profile(device: torch.device, shape: dict) -> None:
    base = dict(vocab_size=shape["vocab"], d_model=shape["d_model"], n_heads=shape["heads"],
                n_layers=shape["layers"], max_len=shape["seq_len"] + 1)
    x = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq_len"] + 1), device=device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    arms = (("ungraded", None, False, True), ("LGT", "linear", True, True),
            ("EGT", "exponential", True, True), ("LGT fixed", "linear", False, True),
            ("EGT fixed", "exponential", False, True),
            ("LGT, on activations", "linear", True, False),
            ("LGT fixed, on activations", "linear", False, False))
    for name, g, learnable, fold in arms:
        torch.manual_seed(0)
        extra = {} if g is None else dict(grading=g, learnable_grades=learnable,
                                          grade_init="warm_start", grade_init_value=0.01,
                                          fold_grading=fold)
        m = TransformerLM(TransformerConfig(**base, **extra)).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

        def step(m=m, opt=opt, mark=lambda: None) -> None:
            mark()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = m(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                     x[:, 1:].flatten())
            mark()
            loss.backward()
            mark()
            opt.step()
            mark()

        for _ in range(3):
            step()
        sync(device)
        with profile(activities=activities) as p:
            step()
            sync(device)
        if cuda:
            kernels = [e for e in p.events() if e.device_type.name == "CUDA"]
            counted = (f"kernels {len(kernels)}, kernel time "
                       f"{sum(e.device_time for e in kernels) / 1e3:.1f} ms")
        else:
            with KernelCount() as ops:
                step()
            counted = f"kernels {ops.count} (as the dispatched operators would launch them)"
        t0 = time.perf_counter()
        for _ in range(5):
            step()
        sync(device)
        wall = (time.perf_counter() - t0) / 5
        host = 0.0
        for _ in range(5):
            sync(device)
            t0 = time.perf_counter()
            step()
            host += (time.perf_counter() - t0) / 5
        sync(device)
        print(f"{name}: {counted}, wall {wall * 1e3:.1f} ms, host {host * 1e3:.1f} ms, "
              f"{phase_times(step, device)}")
        del m, opt
        if cuda:
            torch.cuda.empty_cache()


def phase_times(step, device: torch.device, steps: int = 5) -> str:
    """Mean time per phase (forward with the loss, backward, optimizer) of ``steps`` steps run
    back to back: on the GPU's timeline (CUDA events recorded at the phase boundaries, so idle
    time inside a phase counts) and on the host (the time the host spends in it)."""
    cuda = device.type == "cuda"
    events, clock = [], []

    def mark() -> None:
        clock.append(time.perf_counter())
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            events.append(e)

    sync(device)
    for _ in range(steps):
        step(mark=mark)
    sync(device)
    names = ("forward", "backward", "optimizer")
    host = [sum(clock[4 * i + j + 1] - clock[4 * i + j] for i in range(steps)) / steps * 1e3
            for j in range(3)]
    gpu = [sum(events[4 * i + j].elapsed_time(events[4 * i + j + 1]) for i in range(steps))
           / steps for j in range(3)] if cuda else None
    if gpu is None:
        return "host " + ", ".join(f"{n} {h:.1f}" for n, h in zip(names, host, strict=True))
    return "phases GPU | host ms: " + ", ".join(
        f"{n} {g:.1f} | {h:.1f}" for n, g, h in zip(names, gpu, host, strict=True))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def flex_compiles(device: torch.device) -> None:
    dynamo_utils.counters.clear()
    cfg = TransformerConfig(vocab_size=512, d_model=256, n_heads=4, n_layers=4, max_len=2049,
                            attn_backend="sliding_window", attn_backend_options={"window": 128})
    lm = TransformerLM(cfg).to(device)
    ids = torch.randint(0, 512, (2, 2048), device=device)
    seconds = []
    for _ in range(2):
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lm(ids).float().sum().backward()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    print(f"sliding_window LM, 4 layers: first step {seconds[0]:.1f} s, "
          f"second {seconds[1]:.3f} s, dynamo frames {dict(dynamo_utils.counters['frames'])}, "
          f"stats {dict(dynamo_utils.counters['stats'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--quick", action="store_true", help="a tiny shape (a smoke run)")
    parser.add_argument("--layers", type=int, default=None, help="override the layer count")
    parser.add_argument("--d-model", type=int, default=None, help="override d_model")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available here; "
                         "pass --device cpu for the operator counts on the CPU")
    shape = dict(QUICK if args.quick else FULL)
    if args.layers is not None:
        shape["layers"] = args.layers
    if args.d_model is not None:
        shape["d_model"] = args.d_model
    kernel_profile(device, shape)
    if device.type == "cuda":
        flex_compiles(device)
    else:
        print("FlexAttention compile check skipped: it needs CUDA")


if __name__ == "__main__":
    main()
