"""Variable-k modular addition (004 §5.3.1, App. A.3): routing must pick the adder from context.

Trains the two-layer morphic model of ``graded.morphic.tasks.adder`` on [x, ADD_k, =] → (x+k) mod p
and evaluates with context-only routing (``model(ids)``: no targets). Prints training time, answer
accuracy, routing accuracy, and for comparison the routing accuracy of the utility-augmented
logits ℓ̃ (which need the targets). ``--tool external`` swaps the internal adders A_k for a Python
calculator wrapped as Enc ∘ calculator ∘ Dec (a non-differentiable block).

    OMP_NUM_THREADS=2 nice .venv/bin/python benchmarks/morphic_variable_k.py --tool both
    .venv/bin/python benchmarks/morphic_variable_k.py --quick     # smoke run

``--held-out N --seeds S`` trains on all but N (x, k) pairs (every digit, adder and answer still
seen in training, ``VariableAdditionTask.split``) and reports accuracy on the held-out pairs, for
S seeds (each its own split and initialisation), with mean and range.

``--router-input context operator operator_state`` trains the same seeds and splits once per
input type of the adder router (``Router(input_type=...)``: the pooled context and the token's
own operand code, a learned embedding of the ADD_k token, or the state at the ADD_k position), so
the comparison is side by side in one run:

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/morphic_variable_k.py --tool internal \
        --held-out 11 --seeds 5 --router-input context operator operator_state

``--train-routing utility --distill-teacher utility full`` routes training by ℓ̃ (004's rule)
and compares the two teachers of the distillation term (``MorphicObjective.distill_teacher``)
on the same seeds: the utility part β(ΔL − τ) alone (the default) against all of ℓ̃, which holds
the student ℓ itself (docs/morphic.md, "Inference without targets"). ``--no-typed-readout``
starts the readout of ``num`` at its default initialisation instead of the typed decoder c·I_p
(the symmetry described in ``graded.morphic.tasks.adder``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from graded.morphic.model import MorphicObjective
from graded.morphic.tasks import VariableAdditionTask, build_adder_model, evaluate_adder
from graded.morphic.training import train_morphic


def run(*, tool: str = "internal", p: int = 11, shifts: tuple[int, ...] = (1, 2, 3, 4),
        steps: int = 400, batch: int = 64, lr: float = 0.01, seed: int = 0,
        report_dir: str | None = None, held_out: int = 0, router_input: str = "context",
        train_routing: str = "context", distill_teacher: str = "utility",
        typed_readout: bool = True) -> dict[str, float]:
    task = VariableAdditionTask(p, shifts)
    train_pairs, held_pairs = task.split(held_out, seed) if held_out else (None, None)
    torch.manual_seed(seed)
    model = build_adder_model(task, tool=tool, router_input=router_input,
                              train_routing=train_routing, typed_readout=typed_readout,
                              objective=MorphicObjective(distill_teacher=distill_teacher))

    def batches(g: torch.Generator):
        ids, targets, _ = task.sample(batch, g, pairs=train_pairs)
        return ids, targets

    start = time.perf_counter()
    result = train_morphic(model, batches, steps=steps, lr=lr, seed=seed, log_every=steps,
                           keep_initial=report_dir is not None)
    seconds = time.perf_counter() - start
    metrics = evaluate_adder(model, task)
    # a fresh random sample as well, in case the user changes p so that all_examples is large
    ids, targets, adder = task.sample(2048, torch.Generator().manual_seed(seed + 1))
    sampled = evaluate_adder(model, task, (ids, targets, adder))
    if report_dir is not None:
        from graded.morphic.diagnostics import write_report

        ex_ids, ex_targets, _ = task.all_examples()
        write_report(model, [(ex_ids, ex_targets)], report_dir, before=result.initial_model)
    # layer 1's copy edge at "=" under context routing: its weight α (the rest stays) and logit
    copy = model.routing(task.all_examples()[0])[0]
    out = {"tool": tool, "router_input": router_input, "train_routing": train_routing,
           "distill_teacher": distill_teacher, "typed_readout": typed_readout, "p": p,
           "adders": len(shifts),
           "steps": steps, "batch": batch,
           "seed": seed, "seconds": seconds, **metrics,
           "sampled_answer_accuracy": sampled["answer_accuracy"],
           "sampled_routing_accuracy": sampled["routing_accuracy"],
           "copy_weight_at_eq": float(copy.alpha[:, 2, 0].mean()),
           "copy_logit_at_eq": float(copy.context_logits[:, 2, 0].mean())}
    if held_out:
        held = evaluate_adder(model, task, task.examples(held_pairs))
        seen = evaluate_adder(model, task, task.examples(train_pairs))
        out.update(held_out=held_out, held_out_answer_accuracy=held["answer_accuracy"],
                   held_out_routing_accuracy=held["routing_accuracy"],
                   train_answer_accuracy=seen["answer_accuracy"],
                   train_routing_accuracy=seen["routing_accuracy"])
    return out


def summary(rows: list[dict[str, float]], key: str) -> str:
    values = [r[key] for r in rows]
    return (f"{key}: mean {sum(values) / len(values):.3f}, range "
            f"[{min(values):.3f}, {max(values):.3f}] over {len(values)} seeds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", choices=["internal", "external", "both"], default="both")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report", default=None, help="write diagnostics (PNG + JSON) here")
    ap.add_argument("--quick", action="store_true", help="4 steps, to check the script runs")
    ap.add_argument("--held-out", type=int, default=0,
                    help="hold out this many (x, k) pairs from training and report them")
    ap.add_argument("--seeds", type=int, default=1, help="seeds seed, seed+1, ... (one split each)")
    ap.add_argument("--p", type=int, default=11, help="the modulus")
    ap.add_argument("--shifts", type=int, nargs="+", default=[1, 2, 3, 4], help="the adders k")
    ap.add_argument("--router-input", nargs="+", default=["context"],
                    choices=["context", "operator", "operator_state"],
                    help="the adder router's input type(s), each trained on the same seeds")
    ap.add_argument("--train-routing", choices=["context", "utility"], default="context",
                    help="route training by ℓ (default) or by ℓ̃ = ℓ + β(ΔL − τ) (004's rule)")
    ap.add_argument("--distill-teacher", nargs="+", choices=["utility", "full"],
                    default=["utility"],
                    help="teacher(s) of the distillation term (used with --train-routing "
                         "utility), each trained on the same seeds: β(ΔL − τ) or all of ℓ̃")
    ap.add_argument("--no-typed-readout", action="store_true",
                    help="start the readout of num at its default init, not the decoder c·I_p")
    args = ap.parse_args()
    if args.quick:
        args.steps = 4
    torch.set_num_threads(args.threads)
    # the first optimiser built in a process imports torch._dynamo (seconds): pay it here, so
    # the first timed run is not charged for it
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    tools = ["internal", "external"] if args.tool == "both" else [args.tool]
    summaries = []
    for tool in tools:
        for router_input, teacher in itertools.product(args.router_input, args.distill_teacher):
            report = f"{args.report}/{tool}_{router_input}" if args.report else None
            if report and len(args.distill_teacher) > 1:
                report += f"_{teacher}"
            rows = []
            for seed in range(args.seed, args.seed + args.seeds):
                rows.append(run(tool=tool, steps=args.steps, seed=seed, p=args.p,
                                shifts=tuple(args.shifts), held_out=args.held_out,
                                router_input=router_input, train_routing=args.train_routing,
                                distill_teacher=teacher,
                                typed_readout=not args.no_typed_readout,
                                report_dir=report if seed == args.seed else None))
                print(json.dumps(rows[-1]), flush=True)
            keys = (("held_out_routing_accuracy", "held_out_answer_accuracy") if args.held_out
                    else ("routing_accuracy", "answer_accuracy"))
            if len(rows) > 1:
                for key in keys:
                    summaries.append(f"# {tool}, router input {router_input}, train routing "
                                     f"{args.train_routing}, teacher {teacher}, p={args.p}, "
                                     f"shifts={args.shifts}: {summary(rows, key)}")
    print("\n".join(summaries))


if __name__ == "__main__":
    main()
