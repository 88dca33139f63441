"""Interleaved timing and the ``--device`` / ``--dtype`` options shared by the benchmark
scripts.

Candidates are timed in alternation, round after round, each in each place of the order in
turn and none twice in a row (:func:`round_order`), so that drift in machine load and the
CPU's caches treat all of them alike; ratios are taken between medians measured in the same
run. On CUDA, kernels run asynchronously: every timed region is bracketed by
``torch.cuda.synchronize`` so that the clock stops when the GPU has finished, not when the
launches were queued, and peak memory is torch's own statistic
(``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from graded.folding import FoldedLinears

#: ``--dtype`` names (with train.precision's short names as aliases) and their dtypes.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def add_device_options(parser: argparse.ArgumentParser, dtype_help: str) -> None:
    """Add ``--device`` (default cpu) and ``--dtype`` (default float32) to ``parser``."""
    parser.add_argument("--device", default="cpu",
                        help="torch device to run on: cpu (default), cuda, cuda:N")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES), help=dtype_help)


class _Unset:
    """The value of an option the command line did not give (see :func:`parse_with_quick`)."""

    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


def parse_with_quick(parser: argparse.ArgumentParser, argv: list[str] | None,
                     quick: dict[str, object]) -> argparse.Namespace:
    """``parser.parse_args(argv)`` (the parser has a ``--quick`` flag), where ``--quick`` sets
    each option of ``quick`` (dest -> value) that the command line leaves out; an option given
    explicitly keeps its value (``--quick --rounds 1`` times one round), and without
    ``--quick`` an option left out takes the parser's default. argparse fills in a default
    only for a name the namespace passed in lacks, so a placeholder there tells "left out"
    from "given", even when the value given equals the default."""
    args = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(quick, _UNSET)))
    for dest, value in quick.items():
        if getattr(args, dest) is _UNSET:
            setattr(args, dest, value if args.quick else parser.get_default(dest))
    return args


def check_counts(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 minimums: dict[str, int]) -> None:
    """Exit through ``parser.error`` naming the first option of ``minimums`` (dest -> least
    value) below its least value: ``--rounds must be at least 1, got 0`` (a count of 0 ended
    in a traceback, or in a table without rows)."""
    for dest, least in minimums.items():
        value = getattr(args, dest)
        if value < least:
            parser.error(f"--{dest.replace('_', '-')} must be at least {least}, got {value}")


def device_and_dtype(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """The parsed ``--device`` and ``--dtype``; exits with a message when the device is
    unavailable or the dtype is one this build cannot compute in on it."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available in this torch build "
                         f"({torch.__version__}) or on this machine")
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device {args.device}: only cpu and cuda are supported")
    dtype = DTYPES[args.dtype]
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise SystemExit(f"--dtype bfloat16: {torch.cuda.get_device_name(device)} has no bf16")
    return device, dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _no_wait() -> None:
    pass


def autocast(device: torch.device | str, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Autocast to ``dtype`` on ``device``; float32 means no autocast."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def round_order(names: list, r: int) -> list:
    """The order of round ``r``: ``names`` rotated left by ``r`` places, so that over n
    rounds each of the n candidates takes each place once; two candidates keep their order
    (A B A B ...). No candidate runs twice in a row, across the rounds' seams included: the
    last of round r is names[(r - 1) % n], the first of round r + 1 names[(r + 1) % n],
    different for n >= 3. (Reversing the order every other round, as before, made the first
    and the last candidate run twice in a row at every seam: half of their calls came
    straight after a call of their own, with its weights and activations still in the CPU's
    caches, and none of the others'.)"""
    n = len(names)
    if n <= 2:
        return list(names)
    k = r % n
    return list(names[k:]) + list(names[:k])


def interleaved(
    candidates: dict[str, Callable[[], object]], *, rounds: int = 30, warmup: int = 3,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Median seconds per call of each candidate, timed alternately in the orders of
    :func:`round_order` (synchronising ``device`` before and after each timed call when it is
    a GPU). ValueError naming ``rounds`` when it is below 1 (no time to take a median of)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 (timed rounds per candidate), got {rounds}")
    on_gpu = torch.device(device).type == "cuda"
    wait = (lambda: synchronize(device)) if on_gpu else _no_wait  # nothing more on the CPU
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    items = list(candidates.items())
    for r in range(rounds):
        for name, fn in round_order(items, r):
            wait()
            start = time.perf_counter()
            fn()
            wait()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in samples.items()}


class TrainingStep:
    """One training step of a language model on token ids ``x`` (B, T + 1): zero the
    gradients, next-token cross-entropy of ``logits_of(x[:, :-1])`` against ``x[:, 1:]`` under
    autocast to ``dtype`` (float32: none), backward, AdamW step. Under float16 the loss goes
    through a gradient scaler, as the trainer's ``precision: fp16`` does."""

    def __init__(self, logits_of: Callable[[torch.Tensor], torch.Tensor],
                 params: Iterable[torch.nn.Parameter], x: torch.Tensor, *,
                 dtype: torch.dtype = torch.float32, lr: float = 1e-4) -> None:
        self.logits_of, self.x, self.dtype = logits_of, x, dtype
        self.opt = torch.optim.AdamW(params, lr=lr)
        self.scaler = torch.amp.GradScaler(x.device.type) if dtype == torch.float16 else None

    def __call__(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        with autocast(self.x.device, self.dtype):
            logits = self.logits_of(self.x[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.x[:, 1:].reshape(-1))
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()


def peak_memory(fn: Callable[[], object], device: torch.device | str) -> int | None:
    """Peak bytes torch allocates on a CUDA ``device`` during ``fn()`` above what was allocated
    before it (None on CPU, where torch keeps no peak statistic)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def machine(device: torch.device | str = "cpu") -> str:
    text = (f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    device = torch.device(device)
    if device.type == "cuda":
        text += f", {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return text


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# Operators that launch no kernel on a GPU besides views (func.is_view): allocations, lifts.
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
              "lift_fresh", "_unsafe_view",
              # a value read to the host: a copy, not a kernel (AdamW's step counters are
              # host tensors: no device work at all)
              "_local_scalar_dense"}
#: The matrix products (the first one ends a forward pass's lead-in).
PRODUCTS = {"addmm", "mm", "bmm", "linear", "matmul"}


def _has_tensors(func, args) -> bool:
    """Whether an operator takes or returns a tensor: one that does neither
    (``torch.promote_types``, ``torch.can_cast``, dispatched like any operator) has no data on
    a device to launch a kernel on."""
    if any(isinstance(a, torch.Tensor) or (isinstance(a, (list, tuple))
                                           and any(isinstance(t, torch.Tensor) for t in a))
           for a in args):
        return True
    return any("Tensor" in str(r.type) for r in func._schema.returns)


def kernels_of(func, args) -> int:
    """The CUDA kernels one dispatched operator launches, as counted here: none for a view,
    an allocation or an operator on no tensor (a dtype's promotion); one for an operator; for
    a foreach operator one (torch's fused route, one multi-tensor kernel per few dozen tensors)
    when its tensor lists agree pairwise in shape, strides and dtype on one dtype and device,
    else one per tensor (the route that loops over the pairs: a weight times its row scales'
    column, bf16 gradients times float32 scales)."""
    name = func.overloadpacket.__name__
    if func.is_view or name in _NO_KERNEL or not _has_tensors(func, args):
        return 0
    if not name.startswith("_foreach_"):
        return 1
    lists = [a for a in args if isinstance(a, (list, tuple)) and a
             and all(isinstance(t, torch.Tensor) for t in a)]
    first = lists[0]
    if len({(t.dtype, t.device) for t in first}) > 1:
        return len(first)
    for other in lists[1:]:
        if any(a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype
               for a, b in zip(first, other, strict=True)):
            return len(first)
    return 1


class KernelCount(TorchDispatchMode):
    """The kernels (:func:`kernels_of`) of the operators dispatched inside the block,
    ``lead_in``: those before the first matrix product and ``tail``: those after the last
    (None if there was none; a synchronised step's device waits for the host's issuing of
    both), and ``operators``: every dispatched operator, views and allocations included (each
    a call through the dispatcher, the host's share of the work whether it launches or
    not)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.operators = 0
        self.lead_in: int | None = None
        self.tail: int | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kernels = kernels_of(func, args)
        if func.overloadpacket.__name__ in PRODUCTS:
            if self.lead_in is None:
                self.lead_in = self.count
            self.tail = -kernels  # the product itself is not part of the tail
        if self.tail is not None:
            self.tail += kernels
        self.count += kernels
        self.operators += 1
        return func(*args, **(kwargs or {}))


#: Suffix of the arms that fold as the code before 28a0b8f (``--compare-folds``).
PREVIOUS_FOLDS = ", previous folds"


def previous_folds(fn: Callable) -> Callable:
    """``fn`` with ``FoldedLinears.previous_form`` on for the length of each call (the folds
    of the code before 28a0b8f, for side-by-side timing)."""
    def run(*args, **kwargs):
        FoldedLinears.previous_form = True
        try:
            return fn(*args, **kwargs)
        finally:
            FoldedLinears.previous_form = False
    return run


@contextlib.contextmanager
def first_product_time() -> Iterator[dict]:
    """Inside the block ``F.linear`` notes the time of its first call in the dict yielded
    (key "t"; cleared by the caller): when a forward pass hands the device its first matrix
    product. Every matrix product of these models goes through ``F.linear``."""
    seen: dict = {}
    linear = torch.nn.functional.linear

    def noting(*args, **kwargs):
        seen.setdefault("t", time.perf_counter())
        return linear(*args, **kwargs)

    torch.nn.functional.linear = noting
    try:
        yield seen
    finally:
        torch.nn.functional.linear = linear


def lead_in_times(forwards: dict, rounds: int,
                  device: torch.device | str = "cpu") -> dict[str, float]:
    """Median seconds from the start of each forward pass to its first matrix product: what
    a synchronised GPU step waits for the host before its first large kernel. The device is
    synchronised before each pass (it starts idle, as a synchronised step does); the passes
    take turns in the orders of :func:`round_order`."""
    times: dict[str, list[float]] = {name: [] for name in forwards}
    items = list(forwards.items())
    with first_product_time() as seen:
        for r in range(rounds):
            for name, forward in round_order(items, r):
                synchronize(device)
                seen.clear()
                start = time.perf_counter()
                forward()
                times[name].append(seen["t"] - start)
    return {name: statistics.median(t) for name, t in times.items()}
