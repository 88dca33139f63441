"""Cost of grading: GradedMultiheadAttention against torch.nn.MultiheadAttention, and an LM
training step of LGT/EGT against the ungraded LM, all interleaved in one run.

Targets: every attention variant within 1.05x of torch's module; LGT and EGT training steps
within 1.10x of the ungraded LM.

    python benchmarks/graded_attention.py            # the README's figures
    python benchmarks/graded_attention.py --quick    # a smoke run (3 rounds unless --rounds)
    python benchmarks/graded_attention.py --device cuda --dtype bfloat16   # on a GPU
    python benchmarks/graded_attention.py --shape 8,2048,1024,16 --no-lm   # one shape only

On CUDA the attention shapes default to B=8, T=2048, d=1024, h=16 and B=2, T=8192 (same d, h);
the GPU's LM training step at GPT-2 small's shape is ``benchmarks/lm_training_step.py``.

``--dtype`` casts the attention modules and their inputs; the LM training steps keep float32
parameters and run under autocast to it (float16 with a gradient scaler), as training with
``train.precision`` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _timing import (
    KernelCount,
    TrainingStep,
    add_device_options,
    check_counts,
    device_and_dtype,
    dtype_name,
    interleaved,
    lead_in_times,
    machine,
    parse_with_quick,
    table,
)

from graded import TransformerConfig, TransformerLM
from graded.attention import MultiheadAttention
from graded.attention.graded import VARIANTS, GradedMultiheadAttention

SHAPES = [(8, 256, 256, 8), (8, 1024, 256, 8)]
#: The GPU shapes of issue 15's targets (B, T, d_model, heads): the default on CUDA.
CUDA_SHAPES = [(8, 2048, 1024, 16), (2, 8192, 1024, 16)]
CPU = torch.device("cpu")
UNGRADED = "ours, ungraded"


def attention_step(module: torch.nn.Module, x: torch.Tensor) -> None:
    module.zero_grad(set_to_none=True)
    out, _ = module(x, x, x, need_weights=False)
    out.sum().backward()


def graded_module(d: int, h: int, variant: str, grading: str, learnable: bool = True,
                  fold: bool = True) -> GradedMultiheadAttention:
    grades = torch.rand(h, d // h) if variant == "multi_head" else torch.rand(d // h)
    return GradedMultiheadAttention(d, h, grading=grading, grades=grades, variant=variant,
                                    learnable_grades=learnable, batch_first=True,
                                    fold_grading=fold)


def bench_attention(shapes: list, rounds: int, device: torch.device = CPU,
                    dtype: torch.dtype = torch.float32,
                    learnable: bool = True,
                    unfolded: bool = False) -> tuple[list[list[str]], float]:
    """Each variant against torch's module in interleaved rounds, with our ungraded
    :class:`~graded.attention.MultiheadAttention` beside them (the row "ours, ungraded": what
    grading adds to our own module, a second reference when torch's module's time moves
    between runs); ``unfolded`` adds, in the same rounds, each variant with
    ``fold_grading=False`` (the grading applied to the projections' outputs, after their
    matrix products, instead of to the weights before)."""
    rows, worst = [], 0.0
    for b, t, d, h in shapes:
        torch.manual_seed(0)
        ref = torch.nn.MultiheadAttention(d, h, batch_first=True)
        x = torch.randn(b, t, d).to(device, dtype).requires_grad_()
        ref.to(device, dtype)
        ours = MultiheadAttention(d, h, batch_first=True)
        ours.load_state_dict(ref.state_dict())
        modules: dict[str, torch.nn.Module] = {"torch": ref, UNGRADED: ours.to(device, dtype)}
        for grading in ("linear", "exponential"):
            for variant in VARIANTS:
                m = graded_module(d, h, variant, grading, learnable)
                m.load_state_dict(ref.state_dict())
                modules[f"{grading}/{variant}"] = m.to(device, dtype)
                if unfolded:  # the same module, not folded (drawn aside: the others unchanged)
                    with torch.random.fork_rng(devices=[]):
                        twin = graded_module(d, h, variant, grading, learnable, fold=False)
                    twin.load_state_dict(m.state_dict())
                    modules[f"{grading}/{variant} unfolded"] = twin.to(device, dtype)
        cands = {name: (lambda m=m, x=x: attention_step(m, x)) for name, m in modules.items()}
        times = interleaved(cands, rounds=rounds, device=device)
        lead = lead_in_times({name: (lambda m=m, x=x: m(x, x, x, need_weights=False))
                              for name, m in modules.items()}, rounds=rounds, device=device)
        ends = {name: step_ends(m, x) for name, m in modules.items()}
        for name, sec in times.items():
            if name == "torch":
                continue
            ratio = sec / times["torch"]
            if not name.endswith(" unfolded") and name != UNGRADED:  # the defaults' worst
                worst = max(worst, ratio)
            rows.append([f"B={b}, T={t}, d={d}, h={h}", name, f"{times['torch'] * 1e3:.2f}",
                         f"{sec * 1e3:.2f}", f"{ratio:.3f}", f"{lead['torch'] * 1e6:.0f}",
                         f"{lead[name] * 1e6:.0f}", ends["torch"], ends[name]])
    return rows, worst


def step_ends(module: torch.nn.Module, x: torch.Tensor) -> str:
    """The kernels one forward + backward issues before its first matrix product and after
    its last (``KernelCount``), "lead-in / tail": what a synchronised step's device waits
    for the host to issue at either end."""
    with KernelCount() as count:
        attention_step(module, x)
    return f"{count.lead_in} / {count.tail}"


def bench_lm(batch: int, length: int, rounds: int, d: int = 256, layers: int = 4,
             device: torch.device = CPU, dtype: torch.dtype = torch.float32):
    base = dict(vocab_size=512, d_model=d, n_heads=8, n_layers=layers, max_len=length + 1)
    x = torch.randint(0, 512, (batch, length + 1)).to(device)
    cands = {}
    for name, grading in (("ungraded", None), ("LGT", "linear"), ("EGT", "exponential")):
        torch.manual_seed(0)
        extra = {} if grading is None else dict(grading=grading, learnable_grades=True,
                                                 grade_init="warm_start",
                                                 grade_init_value=0.01)
        model = TransformerLM(TransformerConfig(**base, **extra)).to(device)
        cands[name] = TrainingStep(model, model.parameters(), x, dtype=dtype)
    times = interleaved(cands, rounds=rounds, device=device)
    rows, worst = [], 0.0
    for name in ("LGT", "EGT"):
        ratio = times[name] / times["ungraded"]
        worst = max(worst, ratio)
        rows.append([f"B={batch}, T={length}, d={d}, L={layers}", name,
                     f"{times['ungraded'] * 1e3:.1f}", f"{times[name] * 1e3:.1f}", f"{ratio:.3f}"])
    return rows, worst


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """``"B,T,D,H"`` as four positive integers with D divisible by H."""
    try:
        b, t, d, h = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape {text!r}: expected four integers B,T,D,H such as 8,2048,1024,16") from None
    if min(b, t, d, h) < 1 or d % h:
        raise argparse.ArgumentTypeError(
            f"shape {text!r}: expected positive B,T,D,H with D divisible by H")
    return b, t, d, h


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, 3 rounds (unless --rounds is given)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per candidate")
    parser.add_argument("--shape", action="append", type=parse_shape, metavar="B,T,D,H",
                        help="attention shape (batch, length, d_model, heads); repeatable; "
                             "default two CPU shapes, or the two GPU shapes on CUDA")
    parser.add_argument("--no-lm", action="store_true", help="skip the LM training steps")
    parser.add_argument("--fixed-grades", action="store_true",
                        help="graded attention with fixed grades (buffers) instead of learnable")
    parser.add_argument("--compare-unfolded", action="store_true",
                        help="also time each variant with fold_grading=False in the same rounds")
    add_device_options(parser, "attention modules and inputs are cast to it; the LM steps run "
                               "under autocast to it (default float32: no autocast)")
    args = parse_with_quick(parser, argv, {"rounds": 3})
    check_counts(parser, args, {"rounds": 1})
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device, dtype = device_and_dtype(args)
    rounds = args.rounds
    default = CUDA_SHAPES if device.type == "cuda" else SHAPES
    shapes = args.shape or ([(2, 64, 64, 4)] if args.quick else default)
    rows, worst_attn = bench_attention(shapes, rounds, device, dtype, not args.fixed_grades,
                                       args.compare_unfolded)
    on = "" if dtype == torch.float32 else f"{dtype_name(dtype)}; "
    kind = "fixed" if args.fixed_grades else "learnable"
    print(f"# GradedMultiheadAttention vs torch.nn.MultiheadAttention, forward+backward, "
          f"{kind} grades (median of {rounds} interleaved rounds; {on}{machine(device)})")
    print(table(["shape", "grading/variant", "torch ms", "graded ms", "ratio",
                 "torch lead-in µs", "graded lead-in µs", "torch kernels at the ends",
                 "graded kernels at the ends"], rows))
    print(f"worst ratio {worst_attn:.3f} (target <= 1.05): "
          f"{'PASS' if worst_attn <= 1.05 else 'FAIL'}")
    print("lead-in: host time from the call of a forward pass to its first matrix product, "
          "the device idle before it (median of the rounds): what a synchronised step waits "
          "for before its first large kernel; kernels at the ends: those one forward + "
          "backward issues before its first matrix product / after its last (counted)\n")
    if args.no_lm:
        return
    lm_rows, worst_lm = bench_lm(2, 32, rounds, d=64, layers=2, device=device, dtype=dtype) \
        if args.quick else bench_lm(8, 256, rounds, device=device, dtype=dtype)
    print("# LM training step (forward, backward, AdamW), graded vs ungraded")
    print(table(["shape", "model", "ungraded ms", "graded ms", "ratio"], lm_rows))
    print(f"worst ratio {worst_lm:.3f} (target <= 1.10): "
          f"{'PASS' if worst_lm <= 1.10 else 'FAIL'}")


if __name__ == "__main__":
    main()
