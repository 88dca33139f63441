"""Forward+backward time of graded.MultiheadAttention against torch.nn.MultiheadAttention.

Both modules hold the same parameters and are timed alternately in one run at each shape;
the ratio is ours / torch's (target <= 1.05).

    python benchmarks/attention.py            # the README's figures
    python benchmarks/attention.py --quick    # a smoke run
    python benchmarks/attention.py --device cuda --dtype bfloat16   # on a GPU (modules and
                                                                    # inputs cast to bf16)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _timing import add_device_options, device_and_dtype, dtype_name, interleaved, machine, table

import graded

SHAPES = [(8, 256, 256, 8), (8, 1024, 256, 8), (4, 512, 512, 8)]


def step(module: torch.nn.Module, x: torch.Tensor) -> None:
    module.zero_grad(set_to_none=True)
    out, _ = module(x, x, x, need_weights=False)
    out.sum().backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few rounds")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds per candidate")
    parser.add_argument("--causal", action="store_true", help="also time causal attention")
    add_device_options(parser, "dtype of both modules and their inputs (default float32)")
    args = parser.parse_args()
    device, dtype = device_and_dtype(args)
    shapes = [(2, 64, 64, 4)] if args.quick else SHAPES
    rounds = 3 if args.quick else args.rounds
    torch.manual_seed(0)
    rows = []
    worst = 0.0
    for b, t, d, h in shapes:
        ref = torch.nn.MultiheadAttention(d, h, batch_first=True)
        ours = graded.MultiheadAttention(d, h, batch_first=True)
        ours.load_state_dict(ref.state_dict())
        ref.to(device, dtype)
        ours.to(device, dtype)
        x = torch.randn(b, t, d).to(device, dtype).requires_grad_()
        times = interleaved({"torch": lambda r=ref, x=x: step(r, x),
                             "graded": lambda o=ours, x=x: step(o, x)}, rounds=rounds,
                            device=device)
        ratio = times["graded"] / times["torch"]
        worst = max(worst, ratio)
        rows.append([f"B={b}, T={t}, d={d}, h={h}", f"{times['torch'] * 1e3:.2f}",
                     f"{times['graded'] * 1e3:.2f}", f"{ratio:.3f}"])
    on = "" if dtype == torch.float32 else f"{dtype_name(dtype)}; "
    print(f"# graded.MultiheadAttention vs torch.nn.MultiheadAttention, forward+backward "
          f"(median of {rounds} interleaved rounds; {on}{machine(device)})")
    print(table(["shape", "torch ms", "graded ms", "ratio"], rows))
    print(f"worst ratio {worst:.3f} (target <= 1.05): {'PASS' if worst <= 1.05 else 'FAIL'}")


if __name__ == "__main__":
    main()
