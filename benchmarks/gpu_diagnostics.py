"""Two GPU diagnostics (CUDA only), run as measured for docs/gpu.md:

1. Where grading's eager cost goes: one bf16 training step (autocast, AdamW) of an ungraded,
   an LGT and an EGT ``TransformerLM`` (the default architecture at d_model 768, 12 layers,
   12 heads, T = 1024, B = 8, vocabulary 50257), each profiled for the number of CUDA kernels
   and their summed GPU time, then timed (mean wall time of 5 steps). Kernel time close to the
   ungraded model's with a larger wall time means the step waits on kernel launches.
2. FlexAttention's compilation inside a model: a 4-layer ``sliding_window`` LM's first and
   second bf16 forward + backward and dynamo's frame counters.

    python benchmarks/gpu_diagnostics.py
"""
from __future__ import annotations

import time

import torch
import torch._dynamo.utils as dynamo_utils
from torch.profiler import ProfilerActivity, profile

from graded import TransformerConfig, TransformerLM

DEVICE = torch.device("cuda")


def kernel_profile() -> None:
    base = dict(vocab_size=50257, d_model=768, n_heads=12, n_layers=12, max_len=1025)
    x = torch.randint(0, 50257, (8, 1025), device=DEVICE)
    for name, g in (("ungraded", None), ("LGT", "linear"), ("EGT", "exponential")):
        torch.manual_seed(0)
        extra = {} if g is None else dict(grading=g, learnable_grades=True,
                                          grade_init="warm_start", grade_init_value=0.01)
        m = TransformerLM(TransformerConfig(**base, **extra)).to(DEVICE)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

        def step(m=m, opt=opt) -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = m(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                     x[:, 1:].flatten())
            loss.backward()
            opt.step()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
            step()
            torch.cuda.synchronize()
        kernels = [e for e in p.events() if e.device_type.name == "CUDA"]
        gpu_us = sum(e.device_time for e in kernels)
        t0 = time.perf_counter()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 5
        print(f"{name}: kernels {len(kernels)}, kernel time {gpu_us / 1e3:.1f} ms, "
              f"wall {wall * 1e3:.1f} ms")
        del m, opt
        torch.cuda.empty_cache()


def flex_compiles() -> None:
    dynamo_utils.counters.clear()
    cfg = TransformerConfig(vocab_size=512, d_model=256, n_heads=4, n_layers=4, max_len=2049,
                            attn_backend="sliding_window", attn_backend_options={"window": 128})
    lm = TransformerLM(cfg).to(DEVICE)
    ids = torch.randint(0, 512, (2, 2048), device=DEVICE)
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


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("gpu_diagnostics.py needs a CUDA GPU")
    kernel_profile()
    flex_compiles()
