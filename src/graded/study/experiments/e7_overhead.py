"""E7: the wall-clock cost of grading (claim 8, 001 Prop 4.10: grading adds O(nd) work).

For each model size, an ungraded transformer LM and the same model graded in every stage (EGT,
learnable grades, per-head attention grades) are timed on one forward + backward pass of the
same batch, side by side in one process: the two are timed alternately, ``rounds`` times, each
timing the median of ``repeats`` passes after a warm-up, so that load on the machine affects
both alike. Estimate: the relative overhead exp(mean log(graded/ungraded)) − 1, a geometric
mean that one round slowed by load cannot dominate; over several sizes, the mean over sizes
of each size's mean log ratio, with the study's interval for rounds within fixed sizes
(:func:`graded.study.statistics.stratified_interval`: the overhead differs from size to size
by design, so only the spread of the rounds within a size is noise), mapped the same way.
The prediction "negligible" is read as an overhead below ``MARGIN`` (10%): the claim holds
when the whole interval lies below 10% and fails when it lies above. Timings on a loaded
machine are noisy; the ratio, measured side by side, is what the study reports.
"""

from __future__ import annotations

import math
import statistics
import time

import torch
from torch.nn import functional as F

from graded.study.core import Context, Finding, atomic_write_text, verdict
from graded.study.statistics import mean_interval, stratified_interval
from graded.transformer.config import TransformerConfig
from graded.transformer.models import TransformerLM

__all__ = ["MARGIN", "SIZES", "OverheadExperiment", "time_pass"]

MARGIN = 0.10
# (d_model, n_layers, n_heads, sequence length, batch)
SIZES = ((32, 2, 4, 32, 16), (64, 2, 4, 64, 16), (128, 4, 4, 128, 8))


def _model(d: int, layers: int, heads: int, length: int, graded: bool) -> TransformerLM:
    fields = dict(vocab_size=64, d_model=d, n_heads=heads, n_layers=layers, d_ff=4 * d,
                  max_len=length, positional="learned")
    if graded:
        fields.update(grading="exponential", learnable_grades=True, grades_per_head=True,
                      grade_init="warm_start", grade_init_value=0.05,
                      grade_position_alpha=0.01)
    torch.manual_seed(0)
    return TransformerLM(TransformerConfig(**fields))


def time_pass(model: torch.nn.Module, ids: torch.Tensor, repeats: int) -> float:
    """Median seconds of one forward + backward pass (cross-entropy on the next token)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        times.append(time.perf_counter() - began)
        model.zero_grad(set_to_none=True)
    return statistics.median(times)


def _overhead(log_ratios: list[float], sizes: list | None = None) -> tuple[float, float, float]:
    """The relative overhead exp(mean log(graded/ungraded)) − 1 (a geometric mean, robust to
    a round slowed by load) and the study's 95% interval of the mean log ratio (the hull of the
    percentile bootstrap and the t interval), mapped the same way. ``sizes`` (one label per
    round): the model size of each round; the mean is then over sizes of each size's mean,
    and the interval counts only the spread of rounds within a size
    (:func:`graded.study.statistics.stratified_interval`)."""
    iv = (mean_interval(log_ratios) if sizes is None
          else stratified_interval(log_ratios, sizes))
    return math.exp(iv.estimate) - 1.0, math.exp(iv.low) - 1.0, math.exp(iv.high) - 1.0


class OverheadExperiment:
    """E7: forward + backward time, graded vs ungraded, measured side by side."""

    name = "E7"
    title = "Overhead: wall-clock forward + backward, graded vs ungraded"
    claims = ("8",)

    def run(self, ctx: Context) -> list[Finding]:
        torch.set_num_threads(1)
        sizes = SIZES[:2] if ctx.quick else SIZES
        rounds, repeats = (6, 5) if ctx.quick else (12, 10)
        lines = ["| d_model | layers | heads | length | batch | ungraded ms | graded ms | "
                 "overhead | 95% interval |", "|---|---|---|---|---|---|---|---|---|"]
        overheads_all: list[float] = []
        size_of_round: list[int] = []
        per_size = []
        for size, (d, layers, heads, length, batch) in enumerate(sizes):
            plain = _model(d, layers, heads, length + 1, graded=False)
            graded = _model(d, layers, heads, length + 1, graded=True)
            ids = torch.randint(0, 64, (batch, length + 1),
                                generator=torch.Generator().manual_seed(0))
            time_pass(plain, ids, 2)
            time_pass(graded, ids, 2)
            t_plain, t_graded, ratios = [], [], []
            for _ in range(rounds):
                a = time_pass(plain, ids, repeats)
                g = time_pass(graded, ids, repeats)
                t_plain.append(a)
                t_graded.append(g)
                ratios.append(math.log(g / a))
            est, lo, hi = _overhead(ratios)
            per_size.append((d, est))
            overheads_all += ratios
            size_of_round += [size] * len(ratios)
            lines.append(f"| {d} | {layers} | {heads} | {length} | {batch} | "
                         f"{1e3 * statistics.median(t_plain):.2f} | "
                         f"{1e3 * statistics.median(t_graded):.2f} | {est:+.1%} | "
                         f"[{lo:+.1%}, {hi:+.1%}] |")
        est, lo, hi = _overhead(overheads_all, size_of_round)
        atomic_write_text(ctx.path("section.md"), "\n".join(lines) + "\n\nEach row: "
                          f"{rounds} alternating rounds of the median of {repeats} passes, one "
                          "thread. Graded = EGT in every stage (input, graded positions, "
                          "per-head attention grades, FFN, output), learnable grades.\n")
        detail = ("Relative overhead (geometric mean of graded/ungraded, − 1) of one forward + "
                  "backward pass; "
                  "the mean over sizes of each size's mean log ratio ("
                  + ", ".join(f"d={d}: {e:+.1%}" for d, e in per_size)
                  + "); replicates are the rounds within each size, whose spread is the "
                  "noise (the sizes are fixed, their differences are not noise). Holds when the "
                  f"interval lies below the {MARGIN:.0%} margin.")
        return [Finding("8", self.name, "relative overhead of graded forward + backward",
                        "the ungraded model, timed alternately in the same process",
                        len(overheads_all), est, lo, hi,
                        verdict(lo - MARGIN, hi - MARGIN, predicted="negative"), detail)]
