"""Host time of a graded recipe's work in one training step, with and without the gradings held.

A graded recipe does three things each step that find the model's gradings: the grade
penalty (``Recipe.regularization``), the graded loss's weights (``Recipe.loss_weights``) and
the grade learning-rate bound with λ's annealing (``Recipe.start_step`` and the function it
returns). Finding them walks the module tree (``graded.transformer.graded.gradings``); the
trainer runs its steps inside ``held_gradings``, where the gradings found on entry answer
instead. This times that per-step work for an EGT (``egt-alg7.1``) and an LGT
(``lgt-alg5.1``) LM at GPT-2 small's width and depth (12 layers, d_model 768, 12 heads;
learnable per-layer grades), walking and held, as the median of interleaved rounds of
``--calls`` steps, on the CPU (the recipe's work is host work on any device).

    python benchmarks/recipe_host.py
    python benchmarks/recipe_host.py --quick     # a smaller model, fewer rounds
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved, machine, table

from graded.train.recipes import get_recipe
from graded.transformer.config import TransformerConfig
from graded.transformer.graded import held_gradings
from graded.transformer.models import TransformerLM

RECIPES = {"exponential": "egt-alg7.1", "linear": "lgt-alg5.1"}


def recipe_step(model: TransformerLM, grading: str, calls: int):
    """``calls`` steps of the recipe's work, as the trainer does it (its optimizer built from
    the recipe's parameter groups; the loss grades of a batch of 8 × 64 tokens)."""
    recipe = get_recipe(RECIPES[grading])
    optimizer = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0))
    grades = torch.randint(0, 3, (8, 64), generator=torch.Generator().manual_seed(0)).float()

    def run() -> None:
        for step in range(calls):
            recipe.regularization(model)
            recipe.loss_weights(model, grades)
            recipe.start_step(model, optimizer, step, 1000)()

    return run


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--quick", action="store_true", help="2 layers, d_model 64, 3 rounds")
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.d_model, args.heads, args.calls, args.rounds = 2, 64, 4, 5, 3
    torch.set_num_threads(1)
    rows = []
    for grading in RECIPES:
        config = TransformerConfig(vocab_size=100, d_model=args.d_model, n_heads=args.heads,
                                   n_layers=args.layers, grading=grading,
                                   learnable_grades=True, grading_base=2.0)
        model = TransformerLM(config)
        walk = recipe_step(model, grading, args.calls)

        def held(walk=walk, model=model) -> None:
            with held_gradings(model):
                walk()

        times = interleaved({"walk": walk, "held": held}, rounds=args.rounds)
        per = {k: v / args.calls * 1e6 for k, v in times.items()}
        rows.append([RECIPES[grading], f"{per['walk']:.0f}", f"{per['held']:.0f}",
                     f"{per['held'] / per['walk']:.3f}"])
    print(f"Recipe host work per step: {args.layers} layers, d_model {args.d_model}, "
          f"{args.heads} heads; median of {args.rounds} interleaved rounds of {args.calls} "
          f"steps; {machine()}")
    print(table(["recipe", "walking (µs)", "held (µs)", "held / walking"], rows))


if __name__ == "__main__":
    main()
