"""Host work of grading: an LM's forward pass and training step at a tiny shape on the CPU.

On a GPU an eager forward pass of GPT-2 small's shape is host-bound: the device finishes each
kernel before the host has issued the next one, so the Python, dispatcher and launch work of
grading's extra operators is paid in full (docs/gpu.md). At a tiny shape on the CPU the
arithmetic costs next to nothing and a pass's time is that host work, so this measures it
without a GPU: ``TransformerLM`` with 12 layers, d_model 32, 4 heads, feed-forward width 128,
B = 2, T = 64 (128 rows: every grading folds into its weights, as at the full shape), float32
(``--dtype bfloat16``: the forward pass under CPU autocast, as a bf16 GPU step runs it), one
thread, ungraded and LGT / EGT with learnable and with fixed grades, each timed as the median
of ``--rounds`` interleaved rounds of ``--calls`` calls. Also counts the CUDA kernels that one
forward pass and one training step (forward, backward, AdamW in its foreach form, the default
on a GPU) would launch, from the ATen operators they dispatch (``_timing.kernels_of``: views and
allocations none, a foreach operator one per tensor unless torch's fused route applies), and
the kernels and host time before a forward pass's first matrix product (its lead-in), and the
operators a forward pass dispatches (views and allocations included: host work that launches
nothing).

    python benchmarks/host_overhead.py
    python benchmarks/host_overhead.py --dtype bfloat16
    python benchmarks/host_overhead.py --dtype bfloat16 --compare-folds
    python benchmarks/host_overhead.py --quick     # fewer rounds, seconds
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _timing import (
    PREVIOUS_FOLDS,
    KernelCount,
    check_counts,
    interleaved,
    lead_in_times,
    machine,
    parse_with_quick,
    previous_folds,
    table,
)

from graded import TransformerConfig, TransformerLM

SHAPE = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=12, d_ff=128, max_len=64,
             dropout=0.0, positional="learned")
ARMS = {"ungraded": {}, "LGT": dict(grading="linear", learnable_grades=True),
        "EGT": dict(grading="exponential", learnable_grades=True),
        "LGT fixed": dict(grading="linear", learnable_grades=False),
        "EGT fixed": dict(grading="exponential", learnable_grades=False)}
def arms(compare_folds: bool = False) -> dict[str, dict]:
    """The arms: ungraded, LGT, EGT, fixed grades; with ``compare_folds`` the LGT arms again
    with the folds of the code before 28a0b8f."""
    if not compare_folds:
        return dict(ARMS)
    return {**ARMS, **{name + PREVIOUS_FOLDS: ARMS[name] for name in ("LGT", "LGT fixed")}}


def build(batch: int, length: int, dtype: torch.dtype = torch.float32,
          compare_folds: bool = False) -> tuple[dict, dict, dict]:
    x = torch.randint(0, SHAPE["vocab_size"], (batch, length + 1),
                      generator=torch.Generator().manual_seed(0))
    forwards, steps, kernels, step_kernels, lead_in, operators = {}, {}, {}, {}, {}, {}
    for name, extra in arms(compare_folds).items():
        torch.manual_seed(0)
        if extra:
            extra = dict(extra, grade_init="warm_start", grade_init_value=0.01)
        model = TransformerLM(TransformerConfig(**SHAPE, **extra)).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)  # as on a GPU

        def forward(model=model) -> torch.Tensor:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                return model(x[:, :-1])

        def step(model=model, opt=opt, forward=forward) -> None:
            opt.zero_grad(set_to_none=True)
            logits = forward()
            torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                              x[:, 1:].flatten()).backward()
            opt.step()

        if name.endswith(PREVIOUS_FOLDS):
            forward, step = previous_folds(forward), previous_folds(step)
        step()
        with KernelCount() as count:
            forward()
        with KernelCount() as count_step:
            step()
        forwards[name], steps[name] = forward, step
        kernels[name], step_kernels[name] = count.count, count_step.count
        lead_in[name], operators[name] = count.lead_in, count.operators
    return forwards, steps, {"forward": kernels, "step": step_kernels, "lead_in": lead_in,
                             "operators": operators}


def repeat(fn, calls: int):
    def run() -> None:
        for _ in range(calls):
            fn()
    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=5, help="calls per timed round")
    p.add_argument("--quick", action="store_true",
                   help="5 rounds of 2 calls (where --rounds, --calls are not given)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16: forward passes under CPU autocast, as on a GPU in bf16")
    p.add_argument("--compare-folds", action="store_true",
                   help="also the LGT arms with the folds of the code before 28a0b8f")
    args = parse_with_quick(p, argv, {"rounds": 5, "calls": 2})
    check_counts(p, args, {"rounds": 1, "calls": 1})
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    forwards, steps, kernels = build(batch=2, length=SHAPE["max_len"], dtype=dtype,
                                     compare_folds=args.compare_folds)
    fwd = interleaved({n: repeat(f, args.calls) for n, f in forwards.items()},
                      rounds=args.rounds, warmup=2)
    stp = interleaved({n: repeat(f, args.calls) for n, f in steps.items()},
                      rounds=args.rounds, warmup=2)
    lead = lead_in_times(forwards, rounds=args.rounds * args.calls)
    rows = [[name, str(kernels["lead_in"][name]), f"{lead[name] * 1e3:.2f}",
             str(kernels["operators"][name]), str(kernels["forward"][name]),
             f"{fwd[name] / args.calls * 1e3:.2f}",
             f"{fwd[name] / fwd['ungraded']:.3f}", str(kernels["step"][name]),
             f"{stp[name] / args.calls * 1e3:.2f}", f"{stp[name] / stp['ungraded']:.3f}"]
            for name in forwards]
    print(f"# Host work of grading: TransformerLM, 12 layers, d_model 32, B=2, T=64, "
          f"{args.dtype}{' (autocast)' if args.dtype != 'float32' else ''}, "
          f"one CPU thread; median of {args.rounds} interleaved rounds of {args.calls} calls; "
          f"{machine(torch.device('cpu'))}\n")
    print(table(["model", "kernels before the first product", "ms to it",
                 "operators / forward", "kernels / forward",
                 "forward ms", "forward / ungraded", "kernels / step", "step ms",
                 "step / ungraded"], rows))
    print("\nkernels before the first product, ms to it: what a forward pass issues before its "
          "first matrix product, and the host time until then (a synchronised GPU step waits "
          "that long for its first large kernel); operators / forward: every dispatched "
          "operator, views and allocations included (the dispatcher's share of the host work)")


if __name__ == "__main__":
    main()
