"""What ``graded.train``'s Trainer costs per step beyond the work: the trainer against a
training loop written out here, over the same model, optimizer, batches and loss.

For each size, a shipped run config (``configs/*.yaml``) as ``graded train`` builds it
(``graded.config.build_run``: data, model, recipe; the options as shipped, on the CPU), and
``tiny``, the Dyck config with a model of d_model 16, one layer and batches of 8, where the
arithmetic costs next to nothing and a step's time is mostly host work. Each round runs, from
the same initial model, in turn:

- ``loop``: the hand-written step: gather the batch (the trainer's data order,
  ``StepSampler``), zero the gradients, forward, the loss (token or row cross-entropy, each item
  weighted by the recipe's ``loss_weights`` under a graded recipe, over the step's item count),
  plus ``recipe.regularization``, backward, clip the gradient norm, AdamW with the recipe's
  parameter groups, the learning-rate schedule, ``recipe.on_step`` (λ annealing, the grade
  learning-rate bound). It runs inside ``checked_inputs`` and drops a padding mask that masks
  nothing, as the trainer does, so the model does the same work in both arms;
- ``loop again``: the same loop once more, the control: its time over the loop's is the
  noise of the measurement;
- ``trainer``: ``Trainer.fit(pause_after=K)`` with ``log_every`` and ``eval_every`` beyond K,
  so that nothing but steps runs in the window timed (progress bar and TensorBoard writer as
  shipped, the bar's output discarded);
- ``trainer, logging``: the same with the config's ``log_every`` (10 unless set): the window
  then holds a log step every ``log_every`` steps (values read, CSV, grades, TensorBoard).

The time per step is that from the start of step ``--warmup`` + 1 to the start of step K
(the trainer's steps stamped as ``_train_step`` is called), over those steps: every step's
share of the loop's bookkeeping is in it, the fit's setup and its final read and checkpoint are
not; "fit outside the steps" is the rest of a ``fit`` call. Each time is taken on the wall
clock and as this thread's CPU time (``time.thread_time``), which waiting for a core on a
loaded machine does not inflate (the TensorBoard writer's thread is not in it). Reports the
median of ``--rounds`` interleaved rounds (each arm taking each place in the order in turn,
garbage collected before each arm), the trainer's time over the loop's, and whether the
parameters after K steps equal the loop's exactly (the same work). One thread by default.

    python benchmarks/trainer_overhead.py
    python benchmarks/trainer_overhead.py --sizes tiny dyck --rounds 24 --steps 100
    python benchmarks/trainer_overhead.py --quick     # seconds
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from _timing import check_counts, machine, parse_with_quick, table

from graded.checks import checked_inputs
from graded.config import build_run, load_config
from graded.tasks.base import IGNORE_INDEX
from graded.train.data import StepSampler
from graded.train.optim import param_groups
from graded.train.schedules import make_scheduler
from graded.train.trainer import Trainer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: size -> (config file, --set overrides)
SIZES = {
    "tiny": ("dyck.yaml", ["model.d_model=16", "model.n_heads=2", "model.n_layers=1",
                           "model.d_ff=32", "train.batch_size=8"]),
    "dyck": ("dyck.yaml", []),
    "polynomials": ("polynomials.yaml", []),
    "graph_properties": ("graph_properties.yaml", []),
}
ARMS = ("loop", "loop again", "trainer", "trainer, logging")


class Size:
    """One size: its data, initial model, recipe and options, built once."""

    def __init__(self, name: str, quick: bool, folder: Path) -> None:
        file, overrides = SIZES[name]
        overrides = [*overrides, "train.device=cpu", f"output.dir={folder}"]
        if quick:  # fewer examples to generate; the batches keep their shape
            overrides.append("task.n_train=256")
        cfg = load_config(CONFIGS / file, overrides)
        parts = build_run(cfg, folder / name)
        self.name, self.folder = name, folder
        self.kind, self.recipe = parts.trainer.kind, parts.trainer.recipe
        self.train = parts.train.tensors
        self.output_grades = parts.trainer.output_grades
        self.graded_loss = parts.trainer.graded_loss
        self.model = copy.deepcopy(parts.model)  # the initial model, as build_run seeded it
        self.options, self.seed = cfg.train, cfg.seed
        self.params = sum(p.numel() for p in self.model.parameters())
        if self.kind.name not in ("lm", "classification"):
            raise SystemExit(f"{name}: the hand loop covers lm and classification, not "
                             f"{self.kind.name}")

    def loop(self, steps: int, stamps: list[tuple[float, float]]) -> torch.nn.Module:
        """The hand-written loop (module docstring); returns the trained model."""
        model, o, recipe = copy.deepcopy(self.model), self.options, self.recipe
        groups = (recipe.param_groups(model, lr=o.lr, weight_decay=o.weight_decay,
                                      grade_lr=o.grade_lr) if recipe is not None
                  else param_groups(model, o.weight_decay))
        opt = torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps)
        sched = make_scheduler(opt, o.schedule, warmup_steps=o.warmup_steps,
                               total_steps=o.steps, min_ratio=o.min_lr_ratio)
        params = [p for g in opt.param_groups for p in g["params"]]
        data, lm = self.train, self.kind.name == "lm"
        sampler = StepSampler(len(data["targets"]), o.batch_size, seed=self.seed)
        clip = o.clip_norm if o.clip_norm is not None else float("inf")
        torch.manual_seed(self.seed)  # dropout, as a fresh fit seeds it
        model.train()
        if recipe is not None:
            recipe.on_step(model, opt, 0, o.steps)
        with checked_inputs(True):  # the data were checked once, by the trainer
            for step in range(steps):
                stamps.append(now())
                idx = sampler.global_indices(step)
                x, y, mask = data["inputs"][idx], data["targets"][idx], None
                if "key_padding_mask" in data:
                    mask = data["key_padding_mask"][idx]
                    mask = mask if mask.any() else None
                opt.zero_grad(set_to_none=True)
                out = model(x) if mask is None else model(x, mask)
                if lm:
                    per = F.cross_entropy(out.float().flatten(0, 1), y.flatten(),
                                          ignore_index=IGNORE_INDEX, reduction="none")
                    per, count = per.view(y.shape), int((y != IGNORE_INDEX).sum())
                else:
                    per, count = F.cross_entropy(out.float(), y, reduction="none"), len(y)
                if self.graded_loss:  # the grade of each target token, or of the true class
                    grades = (F.pad(data["token_grades"][idx][:, 1:], (0, 1)) if lm
                              else self.output_grades[y])
                    per = per * recipe.loss_weights(model, grades)
                loss = per.sum() * (1 / count)
                if recipe is not None:
                    loss = loss + recipe.regularization(model)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, clip)
                opt.step()
                sched.step()
                if recipe is not None:
                    recipe.on_step(model, opt, step + 1, o.steps)
        return model

    def trainer(self, steps: int, stamps: list[tuple[float, float]], run: str,
                log_every: int) -> torch.nn.Module:
        """``Trainer.fit(pause_after=steps)`` on a copy of the initial model."""
        options = self.options.model_copy(update={
            "log_every": log_every, "eval_every": max(self.options.eval_every, steps + 1)})
        trainer = Trainer(copy.deepcopy(self.model), self.train, None, kind=self.kind,
                          options=options, run_dir=self.folder / run, seed=self.seed,
                          recipe=self.recipe, output_grades=self.output_grades)
        step = trainer._train_step

        def stamped(s: int):
            stamps.append(now())
            return step(s)

        trainer._train_step = stamped
        with contextlib.redirect_stderr(io.StringIO()):  # the progress bar
            result = trainer.fit(pause_after=steps)
        if result.interrupted:  # SIGINT or SIGTERM ends the fit early: no figure from it
            raise SystemExit("interrupted")
        return trainer.model


def now() -> tuple[float, float]:
    """The wall clock and the CPU time of this thread (seconds)."""
    return time.perf_counter(), time.thread_time()


def per_step(stamps: list[tuple[float, float]], warmup: int) -> tuple[float, float]:
    """Wall and CPU seconds per step from the start of step ``warmup`` + 1 to that of the
    last step."""
    steps = len(stamps) - 1 - warmup
    return tuple((b - a) / steps for a, b in zip(stamps[warmup], stamps[-1], strict=True))


def same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def measure(size: Size, steps: int, rounds: int, warmup: int) -> dict:
    """Median wall and CPU seconds per step of each arm, the fit's wall time outside its
    steps, and whether every arm's parameters equal the loop's after ``steps`` steps in every
    round."""
    samples: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
    outside: list[float] = []
    equal = True
    n = len(ARMS)
    for r in range(rounds):
        models = {}
        order = ARMS[r % n:] + ARMS[:r % n]  # each arm in each place in turn
        for arm in order if (r // n) % 2 == 0 else order[::-1]:
            stamps: list[tuple[float, float]] = []
            gc.collect()  # the last arm's garbage, collected now rather than in this arm
            start = time.perf_counter()
            if arm.startswith("loop"):
                models[arm] = size.loop(steps, stamps)
            else:
                log_every = size.options.log_every if arm == "trainer, logging" else 10**9
                models[arm] = size.trainer(steps, stamps, f"{size.name}-{r}-{arm}", log_every)
            took = time.perf_counter() - start
            samples[arm].append(per_step(stamps, warmup))
            if arm == "trainer":
                outside.append(took - steps * samples[arm][-1][0])
        equal &= all(same_parameters(models["loop"], models[arm]) for arm in ARMS[1:])
    wall = {arm: statistics.median(t[0] for t in ts) for arm, ts in samples.items()}
    cpu = {arm: statistics.median(t[1] for t in ts) for arm, ts in samples.items()}
    return {"wall": wall, "cpu": cpu, "outside": statistics.median(outside), "equal": equal}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    p.add_argument("--steps", type=int, default=60, help="steps per arm and round (K)")
    p.add_argument("--warmup", type=int, default=10,
                   help="first steps left out of the timing (the fit's start-up)")
    p.add_argument("--rounds", type=int, default=12,
                   help="rounds; the arms take each place in the order in turn")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true",
                   help="tiny and dyck, 2 rounds of 5 steps, 256 training examples (where "
                   "--sizes, --rounds, --steps, --warmup are not given)")
    args = parse_with_quick(p, argv, {"sizes": ["tiny", "dyck"], "steps": 5, "warmup": 3,
                                      "rounds": 2})
    check_counts(p, args, {"warmup": 0, "threads": 1, "rounds": 1})
    if args.steps < args.warmup + 2:
        p.error(f"--steps must be at least --warmup + 2 = {args.warmup + 2}, got {args.steps}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.sizes:
            size = Size(name, args.quick, Path(folder))
            res = measure(size, args.steps, args.rounds, args.warmup)
            w, c = res["wall"], res["cpu"]
            rows.append([
                name, f"{size.params:,}", size.recipe.name if size.recipe else "none",
                str(size.options.log_every),
                f"{w['loop'] * 1e3:.3f}", f"{w['trainer'] / w['loop']:.3f}",
                f"{w['trainer, logging'] / w['loop']:.3f}",
                f"{c['loop'] * 1e3:.3f}", f"{c['loop again'] / c['loop']:.3f}",
                f"{c['trainer'] / c['loop']:.3f}",
                f"{(c['trainer'] - c['loop']) * 1e6:.0f}",
                f"{c['trainer, logging'] / c['loop']:.3f}",
                f"{res['outside'] * 1e3:.0f}", "yes" if res["equal"] else "NO"])
    load = f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    print(f"# Trainer overhead per step, CPU, {args.threads} thread(s); median of "
          f"{args.rounds} interleaved rounds of {args.steps} steps per arm (steps "
          f"{args.warmup + 1}–{args.steps} timed); 1-minute load average {load} on "
          f"{os.cpu_count()} cores; {machine(torch.device('cpu'))}\n")
    print(table(["size", "parameters", "recipe", "log_every", "loop ms/step (wall)",
                 "trainer / loop (wall)", "trainer, logging / loop (wall)",
                 "loop ms/step (CPU)", "loop again / loop (CPU)", "trainer / loop (CPU)",
                 "trainer − loop µs (CPU)",
                 "trainer, logging / loop (CPU)", "fit outside the steps ms (wall)",
                 "parameters equal"], rows))
    print("\nwall: perf_counter; CPU: this thread's CPU time (time.thread_time)")
    print(f"command: python benchmarks/trainer_overhead.py "
          f"{' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
