"""Morphic layer step timings, interleaved in one run (issue 6).

A "step" is one layer forward, the readout and its next-token loss, and the backward pass, on
B·T tokens. Compared, with the variants interleaved repetition by repetition (median of each):

1. |E| = 4: the routed layer with exact per-token utilities (utility-augmented routing plus the
   ψ penalty of L_GT) against the same layer without utilities (context routing). Target <= 2x.
2. |E| = 8: the same utility layer against the paper-exact 004 App. B layer
   (``graded.morphic.reference.PaperGradedLayer``: batch-mean routing, one full readout pass per
   edge). Target: ours >= 10x faster.
3. The utility engine alone at |E| = 8, forward only (App. B detaches its utilities): App. B's
   |E| + 1 readout passes against ``exact_utilities`` (one readout pass, then per edge an
   (N, d_h) x (d_h, V) product and a log-sum-exp). ``--engine-grades`` repeats it for more,
   smaller grades at the same |E|, where the gap widens (D / d_h grows).
4. Sparse execution (issue 17), evaluation forward of one layer: |E| = 16 with top-1 hard routing
   (global normalisation, ``execution="sparse"``: each block runs on its routed rows only)
   against the dense soft layer (every block on every token). Target <= 0.35x, with per-edge FFN
   blocks (hidden 4·d, 004 §4.1.3). With linear d×d blocks the router's context logits (the same
   in both) cost more than all 16 blocks together, so the ratio there is also reported.
5. The state split (``GradedStateSpace.split``): the |E| = 8 utility step of comparison 2 with
   the state split once by ``torch.split`` against one slice per grade (``SlicedSpace``), whose
   backward builds a zero-filled gradient of the whole state per slice. ``--split-only`` runs it
   alone, at ``--grades`` × ``--dim`` (docs/morphic.md quotes 16 grades × 64).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/morphic.py            # full size, B·T = 4096
    .venv/bin/python benchmarks/morphic.py --quick                     # tiny smoke run
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/morphic.py --engine-grades 16 32
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/morphic.py --sparse-only   # comparison 4 only
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/morphic.py --split-only --grades 16 --dim 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.nn import functional as F

from graded.morphic import (
    EdgeSet,
    FFNBlock,
    Grade,
    GradedStateSpace,
    LinearBlock,
    MorphicLayer,
    UtilityProbe,
    exact_utilities,
)
from graded.morphic.objective import utility_penalty
from graded.morphic.reference import PaperGradedLayer, paper_lm_loss


def make_space(grades: int, dim: int) -> GradedStateSpace:
    return GradedStateSpace([Grade(f"g{i}", dim, i) for i in range(grades)])


def make_edges(space: GradedStateSpace, n_edges: int) -> list[tuple[str, str]]:
    """n_edges edges: self-loops first, then shifts g_i → g_{i+1} (wrapping)."""
    labels = list(space.labels)
    pairs = [(g, g) for g in labels]
    pairs += [(labels[i], labels[(i + 1) % len(labels)]) for i in range(len(labels))]
    if n_edges > len(pairs):
        raise ValueError(f"at most {len(pairs)} edges for {len(labels)} grades, got {n_edges}")
    return pairs[:n_edges]


class SlicedSpace(GradedStateSpace):
    """The same space, split into one slice per grade (what ``GradedStateSpace.split`` replaced):
    each slice's backward pass builds a zero-filled gradient of the whole state."""

    def split(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        self.check_state(z)
        return {g: z[..., self.slices[g]] for g in self.labels}


class OurStep:
    def __init__(self, space, pairs, vocab, *, utilities: bool, rank: int) -> None:
        edges = EdgeSet.explicit(space, pairs)
        blocks = [LinearBlock(space.dim(g), space.dim(h)) for g, h in pairs]
        self.layer = MorphicLayer(space, edges, blocks, router={"rank": rank},
                                  train_routing="utility" if utilities else "context")
        self.readout = torch.nn.Linear(space.total_dim, vocab)
        self.utilities = utilities

    def __call__(self, z, targets) -> None:
        probe = (UtilityProbe(self.readout.weight, self.readout.bias, targets)
                 if self.utilities else None)
        z_new, tr = self.layer(z, probe)
        loss = F.cross_entropy(self.readout(z_new).flatten(0, 1), targets.flatten())
        if self.utilities:
            loss = loss + 0.1 * utility_penalty(tr.utilities, self.layer.thresholds, 5.0,
                                                targets >= 0)
        loss.backward()


class PaperStep:
    def __init__(self, space, pairs, vocab, *, rank: int) -> None:
        dims = {g.label: g.dim for g in space.grades}
        self.grades = list(space.labels)
        self.layer = PaperGradedLayer(self.grades, pairs, dims, rank)
        self.head = torch.nn.Linear(space.total_dim, vocab)
        self.lm_loss = paper_lm_loss(self.head, self.grades)
        self.space = space

    def __call__(self, z, targets) -> None:
        flat = z.flatten(0, 1)
        y = targets.flatten()
        z_dict = {g: flat[:, self.space.slices[g]] for g in self.grades}
        z_new, aux = self.layer(z_dict, y, self.lm_loss)
        loss = self.lm_loss(z_new, y)
        alphas = torch.stack([aux["alpha"][e] for e in self.layer.E])
        loss = loss - 1e-3 * (alphas * (alphas + 1e-9).log()).sum()
        loss.backward()


class PaperEngine:
    """App. B's utilities alone: L_base and one full readout pass per edge (forward)."""

    def __init__(self, step: PaperStep) -> None:
        self.step = step

    def __call__(self, z, targets) -> None:
        st = self.step
        flat, y = z.detach().flatten(0, 1), targets.flatten()
        zd = {g: flat[:, st.space.slices[g]] for g in st.grades}
        with torch.no_grad():
            base = st.lm_loss(zd, y)
            for g, h in st.layer.E:
                plus = dict(zd)
                plus[h] = st.layer.phi[f"{h}|{g}"](zd[g])
                _ = base - st.lm_loss(plus, y)


class OurEngine:
    """Our exact utilities alone, for every token and edge (forward)."""

    def __init__(self, step: OurStep) -> None:
        self.step = step

    def __call__(self, z, targets) -> None:
        layer, ro = self.step.layer, self.step.readout
        with torch.no_grad():
            zz = z.detach()
            cands = layer.candidates(zz)
            exact_utilities(zz, cands, layer.edges, layer.space, ro.weight, ro.bias, targets)


def engine_ratio(grades: int, dim: int, args) -> dict:
    space = make_space(grades, dim)
    z = torch.randn(args.batch, args.seq, space.total_dim)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq))
    pairs = make_edges(space, 8)
    variants = {
        "paper_engine": PaperEngine(PaperStep(space, pairs, args.vocab, rank=args.rank)),
        "our_engine": OurEngine(OurStep(space, pairs, args.vocab, utilities=True,
                                        rank=args.rank)),
    }
    times = time_interleaved(variants, z, targets, args.reps, args.warmup)
    return {"grades": grades, "dim_per_grade": dim, "median_seconds": medians(times),
            "paper_over_ours": paired_ratio(times, "paper_engine", "our_engine")}


class LayerForward:
    """One layer's evaluation forward (no autograd), as ``model.evaluate`` runs it."""

    def __init__(self, space, pairs, *, mode: str, execution: str, rank: int, block: str
                 ) -> None:
        edges = EdgeSet.explicit(space, pairs)
        blocks = [LinearBlock(space.dim(g), space.dim(h)) if block == "linear"
                  else FFNBlock(space.dim(g), space.dim(h), 4 * space.dim(h)) for g, h in pairs]
        router = {"rank": rank, "mode": mode, "normalization": "global"}
        self.layer = MorphicLayer(space, edges, blocks, router=router, execution=execution,
                                  train_routing="context").eval()
        self.routed_fraction: list[float] = []

    def __call__(self, z, targets) -> None:
        with torch.no_grad():
            _, tr = self.layer(z)
        self.routed_fraction.append(float((tr.alpha != 0).sum()) / tr.alpha[..., 0].numel())


def sparse_ratio(space, args, block: str) -> dict:
    """Top-1 hard sparse against dense soft, |E| = 16, forward at evaluation, interleaved."""
    pairs = make_edges(space, 16)
    z = torch.randn(args.batch, args.seq, space.total_dim)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq))
    variants = {"E16_top1_sparse": LayerForward(space, pairs, mode="hard", execution="sparse",
                                                rank=args.rank, block=block),
                "E16_soft_dense": LayerForward(space, pairs, mode="soft", execution="dense",
                                               rank=args.rank, block=block)}
    times = time_interleaved(variants, z, targets, args.reps, args.warmup)
    fraction = variants["E16_top1_sparse"].routed_fraction
    return {"block": block, "median_seconds": medians(times),
            "sparse_over_dense": paired_ratio(times, "E16_top1_sparse", "E16_soft_dense"),
            "sparse_edges_run_per_token": statistics.mean(fraction)}


def split_ratio(args) -> dict:
    """|E| = 8 utility step with the state split once (``torch.split``) against per-grade
    slices, at ``--grades`` × ``--dim``, interleaved. The same seed builds both layers, so their
    weights are equal; only the split differs."""
    grades = [Grade(f"g{i}", args.dim, i) for i in range(args.grades)]
    spaces = {"torch_split": GradedStateSpace(grades), "per_grade_slices": SlicedSpace(grades)}
    pairs = make_edges(spaces["torch_split"], 8)
    variants = {}
    for name, space in spaces.items():
        torch.manual_seed(0)
        variants[name] = OurStep(space, pairs, args.vocab, utilities=True, rank=args.rank)
    z = torch.randn(args.batch, args.seq, spaces["torch_split"].total_dim)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq))
    times = time_interleaved(variants, z, targets, args.reps, args.warmup)
    return {"grades": args.grades, "dim_per_grade": args.dim, "edges": 8,
            "median_seconds": medians(times),
            "slices_over_split": paired_ratio(times, "per_grade_slices", "torch_split")}


def time_interleaved(variants: dict, z, targets, reps: int, warmup: int
                     ) -> dict[str, list[float]]:
    """Seconds per repetition of every variant, the variants run back to back in each one."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(warmup + reps):
        for name, step in variants.items():
            zz = z.detach().clone().requires_grad_(True)
            t0 = time.perf_counter()
            step(zz, targets)
            dt = time.perf_counter() - t0
            if i >= warmup:
                times[name].append(dt)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in times.items()}


def paired_ratio(times: dict[str, list[float]], num: str, den: str) -> dict[str, float]:
    """Ratio of medians, and the quartiles of the per-repetition ratios (robust to load drift,
    since both variants of a repetition ran seconds apart)."""
    per_rep = [a / b for a, b in zip(times[num], times[den])]
    q1, q2, q3 = statistics.quantiles(per_rep, n=4) if len(per_rep) > 1 else per_rep * 3
    return {"ratio_of_medians": statistics.median(times[num]) / statistics.median(times[den]),
            "per_repetition_quartiles": [q1, q2, q3]}


def main() -> None:
    ap = argparse.ArgumentParser(description="morphic layer step timings")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--grades", type=int, default=8)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine-grades", type=int, nargs="*", default=[],
                    help="also time the utility engines alone with this many grades (|E| = 8)")
    ap.add_argument("--sparse-only", action="store_true",
                    help="time only comparison 4 (sparse top-1 against dense soft)")
    ap.add_argument("--split-only", action="store_true",
                    help="time only comparison 5 (one torch.split against per-grade slices)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error(f"--reps must be at least 1 (timed repetitions), got {args.reps}")
    if args.quick:
        args.batch, args.seq, args.vocab, args.reps, args.warmup = 2, 16, 32, 2, 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    space = make_space(args.grades, args.dim)
    z = torch.randn(args.batch, args.seq, space.total_dim)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq))
    if args.split_only:
        print(json.dumps({"tokens": args.batch * args.seq, "vocab": args.vocab,
                          "threads": args.threads, "reps": args.reps, **split_ratio(args)},
                         indent=2))
        return
    if args.sparse_only:
        sparse = [sparse_ratio(space, args, b) for b in ("ffn", "linear")]
        print(json.dumps({"tokens": args.batch * args.seq, "grades": args.grades,
                          "dim_per_grade": args.dim, "threads": args.threads, "reps": args.reps,
                          "sparse_top1_E16_over_dense_soft": sparse, "target": "<= 0.35 (ffn)"},
                         indent=2))
        return
    pairs4, pairs8 = make_edges(space, 4), make_edges(space, 8)
    variants = {
        "E4_utilities": OurStep(space, pairs4, args.vocab, utilities=True, rank=args.rank),
        "E4_no_utilities": OurStep(space, pairs4, args.vocab, utilities=False, rank=args.rank),
        "E8_utilities": OurStep(space, pairs8, args.vocab, utilities=True, rank=args.rank),
        "E8_paper_exact": PaperStep(space, pairs8, args.vocab, rank=args.rank),
    }
    times = time_interleaved(variants, z, targets, args.reps, args.warmup)
    engines = [engine_ratio(g, args.dim, args) for g in [args.grades, *args.engine_grades]]
    sparse = [sparse_ratio(space, args, b) for b in ("ffn", "linear")]
    result = {
        "tokens": args.batch * args.seq, "grades": args.grades, "dim_per_grade": args.dim,
        "vocab": args.vocab, "threads": args.threads, "reps": args.reps,
        "median_seconds": medians(times),
        "utilities_over_no_utilities_E4": paired_ratio(times, "E4_utilities", "E4_no_utilities"),
        "paper_over_ours_E8": paired_ratio(times, "E8_paper_exact", "E8_utilities"),
        "utility_engine_paper_over_ours_E8": engines,
        "sparse_top1_E16_over_dense_soft": sparse,
        "targets": {"utilities_over_no_utilities_E4": "<= 2", "paper_over_ours_E8": ">= 10",
                    "sparse_top1_E16_over_dense_soft": "<= 0.35"},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
