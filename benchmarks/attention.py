"""Forward+backward time of graded.MultiheadAttention against torch.nn.MultiheadAttention.

Both modules hold the same parameters and are timed alternately in one run at each shape;
the ratio is ours / torch's (target <= 1.05).

``--causal`` adds a causal row per shape. Each module is called as its own API asks for
causal self-attention: torch's with a boolean causal ``attn_mask`` and the hint
``is_causal=True`` (it requires the mask with the hint, then drops it and calls the fused
kernel with ``is_causal=True``), ours with ``is_causal=True`` alone (it builds no mask and
makes the same kernel call). Both reach ``scaled_dot_product_attention`` with no mask and
``is_causal=True`` (``tests/test_benchmarks.py`` checks it): the same work.

    python benchmarks/attention.py            # the README's figures
    python benchmarks/attention.py --quick    # a smoke run (3 rounds unless --rounds is given)
    python benchmarks/attention.py --device cuda --dtype bfloat16   # on a GPU (modules and
                                                                    # inputs cast to bf16)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _timing import (
    add_device_options,
    check_counts,
    device_and_dtype,
    dtype_name,
    interleaved,
    machine,
    parse_with_quick,
    table,
)

import graded

SHAPES = [(8, 256, 256, 8), (8, 1024, 256, 8), (4, 512, 512, 8)]
QUICK_SHAPES = [(2, 64, 64, 4)]


def causal_options(module: torch.nn.Module, t: int, device: torch.device | str = "cpu") -> dict:
    """The keyword arguments of a causal self-attention call of ``module`` over ``t``
    positions: torch's module takes the boolean causal mask (True = masked) with the hint,
    ours the hint alone (module docstring)."""
    if isinstance(module, graded.MultiheadAttention):
        return {"is_causal": True}
    mask = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)
    return {"attn_mask": mask, "is_causal": True}


def step(module: torch.nn.Module, x: torch.Tensor, options: dict | None = None) -> None:
    module.zero_grad(set_to_none=True)
    out, _ = module(x, x, x, need_weights=False, **(options or {}))
    out.sum().backward()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, 3 rounds (unless --rounds is given)")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds per candidate")
    parser.add_argument("--causal", action="store_true",
                        help="also time causal self-attention (a second row per shape)")
    add_device_options(parser, "dtype of both modules and their inputs (default float32)")
    args = parse_with_quick(parser, argv, {"rounds": 3})
    check_counts(parser, args, {"rounds": 1})
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device, dtype = device_and_dtype(args)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    rounds = args.rounds
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
        for causal in (False, True) if args.causal else (False,):
            opts = {name: causal_options(m, t, device) if causal else {}
                    for name, m in (("torch", ref), ("graded", ours))}
            times = interleaved(
                {"torch": lambda r=ref, x=x, o=opts["torch"]: step(r, x, o),
                 "graded": lambda m=ours, x=x, o=opts["graded"]: step(m, x, o)},
                rounds=rounds, device=device)
            ratio = times["graded"] / times["torch"]
            worst = max(worst, ratio)
            rows.append([f"B={b}, T={t}, d={d}, h={h}{', causal' if causal else ''}",
                         f"{times['torch'] * 1e3:.2f}", f"{times['graded'] * 1e3:.2f}",
                         f"{ratio:.3f}"])
    on = "" if dtype == torch.float32 else f"{dtype_name(dtype)}; "
    print(f"# graded.MultiheadAttention vs torch.nn.MultiheadAttention, forward+backward "
          f"(median of {rounds} interleaved rounds; {on}{machine(device)})")
    print(table(["shape", "torch ms", "graded ms", "ratio"], rows))
    print(f"worst ratio {worst:.3f} (target <= 1.05): {'PASS' if worst <= 1.05 else 'FAIL'}")


if __name__ == "__main__":
    main()
