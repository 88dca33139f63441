"""Where the GPU waits in an eager LM training step, and for what: idle time and its causes.

An eager graded step costs more than the ungraded one by more than the GPU time of its extra
kernels (docs/gpu.md): part of it is time the GPU spends waiting for the host. This profiles
bf16 training steps (autocast, AdamW) of an ungraded, an LGT and a fixed-grade LGT
``TransformerLM`` at GPT-2 small's shape (d_model 768, 12 layers, 12 heads, T = 1024, B = 8,
vocabulary 50257) with ``torch.profiler`` (CPU and CUDA activity), each step synchronised
before it as in ``lm_training_step.py``'s default timing (``--back-to-back``: no
synchronisation between the profiled steps, which are then read as one window), and reads
the trace:

- the step's time (from its start on the host to the end of its last kernel or of its host
  work, whichever is later), the GPU's busy time (the union of its kernels, copies and
  memsets) and its idle time, overall and per phase (forward with the loss, backward,
  optimizer; a kernel counts in the phase that launched it), beside the host's time in each
  phase (a phase whose host time exceeds its GPU busy time is bound by the host);
- each idle gap's cause: the operator whose kernel launch ended the gap (the innermost
  profiled operator around the launch on the launching thread; the gap before a step's first
  kernel, and after its last, are the host's lead-in and tail), summed over the profiled
  steps and listed by idle time.

The profiler slows the host a little, so idle times are upper bounds; compare models within
one run. ``--trace-dir DIR`` also writes each model's Chrome trace (``chrome://tracing``,
Perfetto), which :func:`idle_report` reads offline as well.

    python benchmarks/gpu_idle.py                         # on a GPU
    python benchmarks/gpu_idle.py --trace-dir runs/traces
    python benchmarks/gpu_idle.py --quick --device cpu    # a smoke run: no GPU, no idle time
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).parent))
from _timing import PREVIOUS_FOLDS, previous_folds

from graded import TransformerConfig, TransformerLM

FULL = dict(vocab=50257, d_model=768, heads=12, layers=12, seq_len=1024, batch=8)
QUICK = dict(vocab=256, d_model=64, heads=4, layers=2, seq_len=32, batch=2)
ARMS = {"ungraded": {}, "LGT": dict(grading="linear", learnable_grades=True),
        "LGT fixed": dict(grading="linear", learnable_grades=False),
        "EGT": dict(grading="exponential", learnable_grades=True),
        # the same LGT with the folds of the code before 28a0b8f (FoldedLinears.previous_form)
        "LGT, previous folds": dict(grading="linear", learnable_grades=True)}
DEFAULT_ARMS = ["ungraded", "LGT", "LGT fixed", "EGT"]
PHASES = ("forward", "backward", "optimizer")
STEP = "profiled_step"
WINDOW = "profiled_steps"  # around all the profiled steps when they run back to back
#: Trace categories of work on the GPU's timeline, and of the host calls that launch it.
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
HOST_CATS = {"cpu_op", "user_annotation"}


@dataclass
class IdleReport:
    """Totals over the profiled steps, in microseconds."""

    steps: int = 0
    step_us: float = 0.0
    busy_us: float = 0.0
    idle_us: float = 0.0
    kernels: int = 0
    idle_by_phase: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    busy_by_phase: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    host_by_phase: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    causes: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # -> [us, n]

    def add_cause(self, phase: str, name: str, us: float) -> None:
        entry = self.causes.setdefault((phase, name), [0.0, 0])
        entry[0] += us
        entry[1] += 1

    def lines(self, top: int = 8) -> list[str]:
        n = max(self.steps, 1)
        if not self.kernels:
            return [f"step {self.step_us / n / 1e3:.2f} ms, no GPU work in the trace (a CPU run: "
                    "nothing waits)"]
        def ms(table: dict[str, float], phase: str) -> str:
            return f"{table.get(phase, 0.0) / n / 1e3:.2f}"

        out = [f"step {self.step_us / n / 1e3:.2f} ms, GPU busy {self.busy_us / n / 1e3:.2f} ms, "
               f"idle {self.idle_us / n / 1e3:.2f} ms, kernels {self.kernels / n:.0f} per step; "
               "host | GPU busy | GPU idle ms: " + ", ".join(
                   f"{p} {ms(self.host_by_phase, p)} | {ms(self.busy_by_phase, p)} | "
                   f"{ms(self.idle_by_phase, p)}" for p in PHASES)
               + f", outside idle {ms(self.idle_by_phase, 'outside')}"]
        ranked = sorted(self.causes.items(), key=lambda kv: -kv[1][0])[:top]
        for (phase, name), (us, count) in ranked:
            out.append(f"    {us / n:8.1f} us/step in {count / n:5.1f} gaps  {phase:9s} {name}")
        return out


def _end(e: dict) -> float:
    return e["ts"] + e.get("dur", 0.0)


class _Enclosing:
    """The innermost interval of one thread around a time (intervals nest, as profiled
    operators do)."""

    def __init__(self, events: list[dict]) -> None:
        self.events = sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0.0)))
        self.starts = [e["ts"] for e in self.events]

    def at(self, ts: float) -> dict | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        while i >= 0:
            e = self.events[i]
            if _end(e) >= ts:
                return e
            i -= 1
        return None


def idle_report(trace: dict, window: str = STEP, steps_per_window: int = 1) -> IdleReport:
    """Idle time of the GPU in each ``window`` annotation of a Chrome trace (each holding
    ``steps_per_window`` steps: the GPU's work launched inside it counts, its lead-in and tail
    included), and its causes (module docstring)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") in HOST_CATS and e.get("name") not in (STEP, WINDOW, *PHASES):
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    enclosing = {k: _Enclosing(v) for k, v in by_thread.items()}
    phases = sorted((e for e in events if e.get("cat") == "user_annotation"
                     and e.get("name") in PHASES), key=lambda e: e["ts"])
    steps = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and e.get("name") == window), key=lambda e: e["ts"])

    def phase_at(ts: float) -> str:
        for p in phases:
            if p["ts"] <= ts <= _end(p):
                return p["name"]
        return "outside"

    def cause(kernel: dict) -> tuple[str, str]:
        launch = launches.get(kernel.get("args", {}).get("correlation"))
        if launch is None:
            return "outside", f"? ({kernel.get('name', '')[:40]})"
        op = enclosing.get((launch.get("pid"), launch.get("tid")))
        inner = op.at(launch["ts"]) if op is not None else None
        return phase_at(launch["ts"]), inner["name"] if inner is not None else launch["name"]

    report = IdleReport()
    for s in steps:
        start, host_end = s["ts"], _end(s)
        mine = [k for k in gpu if (lk := launches.get(k.get("args", {}).get("correlation")))
                is not None and start <= lk["ts"] <= host_end]
        end = max([host_end, *(_end(k) for k in mine)])
        report.steps += steps_per_window
        report.kernels += len(mine)
        report.step_us += end - start
        for p in phases:
            if start <= p["ts"] <= host_end:
                report.host_by_phase[p["name"]] += p.get("dur", 0.0)
        cursor = start  # the end of the GPU's work so far in this step
        for k in sorted(mine, key=lambda k: k["ts"]):
            phase, name = cause(k)
            if k["ts"] > cursor:
                gap = k["ts"] - cursor
                if cursor == start:  # the host's work before the step's first launch
                    name = f"(lead-in) {name}"
                report.idle_us += gap
                report.idle_by_phase[phase] += gap
                report.add_cause(phase, name, gap)
            busy = max(0.0, _end(k) - max(k["ts"], cursor))
            report.busy_us += busy
            report.busy_by_phase[phase] += busy
            cursor = max(cursor, _end(k))
        if end > cursor:  # host work after the last kernel
            report.idle_us += end - cursor
            report.idle_by_phase["outside"] += end - cursor
            report.add_cause("outside", "(host tail)", end - cursor)
    return report


def profile_arm(name: str, extra: dict, shape: dict, device: torch.device, steps: int,
                back_to_back: bool, trace_dir: Path | None) -> IdleReport:
    torch.manual_seed(0)
    if extra:
        extra = dict(extra, grade_init="warm_start", grade_init_value=0.01)
    cfg = TransformerConfig(vocab_size=shape["vocab"], d_model=shape["d_model"],
                            n_heads=shape["heads"], n_layers=shape["layers"],
                            max_len=shape["seq_len"] + 1, dropout=0.0, **extra)
    model = TransformerLM(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq_len"] + 1), device=device)

    def step() -> None:
        with record_function(STEP):
            opt.zero_grad(set_to_none=True)
            with record_function("forward"), torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(x[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                         x[:, 1:].flatten())
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                opt.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):
        step()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities) as prof:
        if back_to_back:
            with record_function(WINDOW):
                for _ in range(steps):
                    step()
        else:
            for _ in range(steps):
                sync()
                step()
        sync()
    with tempfile.TemporaryDirectory() as tmp:
        path = (trace_dir or Path(tmp)) / f"trace_{name.replace(' ', '_')}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return idle_report(trace, WINDOW, steps) if back_to_back else idle_report(trace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--quick", action="store_true", help="a tiny shape (a smoke run)")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per model")
    parser.add_argument("--back-to-back", action="store_true",
                        help="no synchronisation between the profiled steps")
    parser.add_argument("--models", nargs="+", choices=list(ARMS), default=DEFAULT_ARMS,
                        help=f"default: {', '.join(DEFAULT_ARMS)}")
    parser.add_argument("--top", type=int, default=8, help="causes listed per model")
    parser.add_argument("--trace-dir", type=Path, default=None,
                        help="also write each model's Chrome trace here")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available here; "
                         "pass --device cpu for a smoke run")
    if args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")
    shape = QUICK if args.quick else FULL
    mode = "steps back to back" if args.back_to_back else "each step synchronised before it"
    print(f"# GPU idle time in a bf16 LM training step: {args.steps} profiled steps per model, "
          f"{mode}; shape {shape}; torch {torch.__version__}"
          + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ", CPU"))
    print("# per step: step time, GPU busy and idle time (by phase), then the idle gaps' "
          "causes (the operator whose launch ended a gap) by idle time")
    for name in args.models:
        profile = previous_folds(profile_arm) if name.endswith(PREVIOUS_FOLDS) else profile_arm
        report = profile(name, ARMS[name], shape, device, args.steps, args.back_to_back,
                         args.trace_dir)
        if device.type == "cuda":  # the model and optimizer of the last arm are gone
            torch.cuda.empty_cache()
        lines = report.lines(args.top)
        print(f"{name}: {lines[0]}")
        for line in lines[1:]:
            print(line)


if __name__ == "__main__":
    main()
