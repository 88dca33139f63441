"""Generalisation splits of the morphic tasks, over seeds: held-out adder sets, held-out moduli
(``graded.morphic.tasks.modular``) and a length split for Dyck (``graded.morphic.tasks.dyck``).

Every accuracy is measured with context-only routing (``model(ids)``: no targets) on examples
that training never saw; see the task modules for what "held out" means in each split.

- ``adders``: [x, ADD_k, MOD_p, =] over moduli {5, 7, 11} and shifts {1, 2, 3, 4}; for each
  modulus one shift is held out (``split_adders(1, seed)``), a different draw per seed;
- ``moduli``: moduli {5, 7, 11, 13}, shifts {1, 2, 3, 4}; moduli 7 and 11 are never trained
  (``split_moduli``), the same split for every seed (seeds vary the initialisation);
- ``dyck-length``: train on length 16, evaluate on length 64 (``length_split``), accuracy over
  all positions and over the positions t >= 16 that training never reached.

``--router-input`` trains the modular splits once per adder-router input type, on the same seeds
and splits, so the comparison is side by side in one run::

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/morphic_generalisation.py --split all \\
        --seeds 5 --router-input context operator
    .venv/bin/python benchmarks/morphic_generalisation.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from graded.morphic.tasks import (
    ModularAdditionTask,
    build_dyck_model,
    build_modular_model,
    evaluate_dyck,
    evaluate_modular,
    length_split,
)
from graded.morphic.training import train_morphic

SPLITS = ("adders", "moduli", "dyck-length")


def modular_run(split: str, *, seed: int, steps: int, router_input: str) -> dict:
    if split == "adders":
        task = ModularAdditionTask((5, 7, 11), (1, 2, 3, 4))
        train, held = task.split_adders(1, seed)
    else:
        task = ModularAdditionTask((5, 7, 11, 13), (1, 2, 3, 4))
        train, held = task.split_moduli([7, 11])
    torch.manual_seed(seed)
    model = build_modular_model(task, router_input=router_input)

    def batches(g: torch.Generator):
        ids, targets, _, _ = task.sample(64, g, triples=train)
        return ids, targets

    start = time.perf_counter()
    train_morphic(model, batches, steps=steps, lr=0.01, seed=seed, log_every=steps)
    seconds = time.perf_counter() - start
    seen, new = evaluate_modular(model, task, train), evaluate_modular(model, task, held)
    return {"split": split, "router_input": router_input, "seed": seed, "steps": steps,
            "seconds": seconds, "train_examples": len(train), "held_out_examples": len(held),
            "train_answer_accuracy": seen["answer_accuracy"],
            "held_out_answer_accuracy": new["answer_accuracy"],
            "held_out_routing_accuracy": new["routing_accuracy"]}


def dyck_run(*, seed: int, steps: int, train_length: int = 16, test_length: int = 64) -> dict:
    train, test = length_split(train_length, test_length)
    torch.manual_seed(seed)
    model = build_dyck_model(train, max_len=test_length)
    start = time.perf_counter()
    train_morphic(model, lambda g: train.sample(64, g), steps=steps, lr=0.02, seed=seed,
                  log_every=steps)
    seconds = time.perf_counter() - start
    short = evaluate_dyck(model, *train.sample(1024, torch.Generator().manual_seed(1000 + seed)))
    long = evaluate_dyck(model, *test.sample(1024, torch.Generator().manual_seed(2000 + seed)),
                         from_position=train_length)
    return {"split": "dyck-length", "seed": seed, "steps": steps, "seconds": seconds,
            "train_length": train_length, "test_length": test_length,
            "train_length_accuracy": short["accuracy"],
            "held_out_accuracy": long["accuracy"],
            "held_out_accuracy_beyond_train_length": long["accuracy_from_position"]}


def summary(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows]
    return (f"{key}: mean {sum(values) / len(values):.3f}, range [{min(values):.3f}, "
            f"{max(values):.3f}] over {len(values)} seeds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=[*SPLITS, "all"], default="all")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--steps", type=int, default=400, help="training steps (modular splits)")
    ap.add_argument("--dyck-steps", type=int, default=300)
    ap.add_argument("--router-input", nargs="+", default=["context", "operator"],
                    choices=["context", "operator", "operator_state"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1 seed, 4 steps: checks it runs")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.steps, args.dyck_steps = 1, 4, 4
    torch.set_num_threads(args.threads)
    # the first optimiser built in a process imports torch._dynamo (seconds): pay it here, so
    # the first timed run is not charged for it
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    splits = SPLITS if args.split == "all" else (args.split,)
    seeds = range(args.seed, args.seed + args.seeds)
    lines = []
    for split in splits:
        if split == "dyck-length":
            rows = [dyck_run(seed=s, steps=args.dyck_steps) for s in seeds]
            for row in rows:
                print(json.dumps(row), flush=True)
            for key in ("held_out_accuracy", "held_out_accuracy_beyond_train_length"):
                lines.append(f"# dyck-length 16 -> 64: {summary(rows, key)}")
            continue
        for router_input in args.router_input:
            rows = []
            for s in seeds:
                rows.append(modular_run(split, seed=s, steps=args.steps,
                                        router_input=router_input))
                print(json.dumps(rows[-1]), flush=True)
            for key in ("held_out_routing_accuracy", "held_out_answer_accuracy"):
                lines.append(f"# {split}, router input {router_input}: {summary(rows, key)}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
