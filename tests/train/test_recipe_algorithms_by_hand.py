"""000 Algorithms 5.1 (LGT) and 7.1 (EGT) written out step by step, independently of
graded.train.recipes, give the parameters the recipes give on a tiny graded classifier with
per-head grades: λ_t = 1 + (λ_max − 1)·t/T set on every grading before step t, the graded loss
Σ_i w(q_{y_i}) ℓ_i / n (w = f(q) = q + 1 or λ_t^q), the regularisers γ‖q‖², γ′Σ_i‖q_i‖² and
γ_coord Σ_i‖q_i − mean_j q_j‖², clipping at τ, AdamW in three groups (matrices with weight
decay; biases, norms, embeddings and positions without; grades without, at a rate capped at
lr_margin × 1/q_max (LGT, q_max = max f(q)) or lr_margin / (λ_t^{q_max} ln λ_t) (EGT, q_max the
largest grade)), a warmup-cosine schedule, and EGT's grades projected onto q ≥ 0."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from graded import TransformerConfig
from graded.train.recipes import get_recipe
from graded.train.schedules import make_scheduler
from graded.transformer import TransformerClassifier

T, LR, WD, WARMUP, MIN_RATIO, TAU, MARGIN = 5, 0.5, 0.1, 2, 0.1, 1.0, 0.9
GAMMA, GAMMA_HEADS, GAMMA_COORD = 0.01, 0.02, 0.03


def schedule(s: int) -> float:
    if s < WARMUP:
        return (s + 1) / WARMUP
    progress = min((s - WARMUP) / (T - WARMUP), 1.0)
    return MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


def by_hand(model, x, y, class_grades, exponential: bool) -> list[float]:
    """The algorithm written out; the grade learning rate of each step."""
    feature = model.encoder.embed.input_grading.grading
    heads = model.encoder.stack.blocks[0].self_attn.attn.grading
    grades = [feature.grades, heads.grades]
    matrices = [p for n, p in model.named_parameters()
                if n.endswith("weight") and p.dim() == 2 and "embed" not in n]
    ids = {id(p) for p in matrices + grades}
    rest = [p for p in model.parameters() if id(p) not in ids]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": WD},
                             {"params": rest, "weight_decay": 0.0},
                             {"params": grades, "weight_decay": 0.0}], lr=LR)
    lam_max = model.config.grading_base
    rates = []
    for s in range(T):
        t = s + 1
        lam = 1 + (lam_max - 1) * t / T
        with torch.no_grad():
            if exponential:
                feature.base.fill_(lam)
                heads.base.fill_(lam)
                q_max = max(float(q.max()) for q in grades)
                bound = 1 / (lam ** q_max * math.log(lam))
            else:
                q_max = max(float((q + 1).max()) for q in grades)  # f(q) = q + 1
                bound = 1 / q_max
        for i, group in enumerate(opt.param_groups):
            group["lr"] = LR * schedule(s) if i < 2 else min(LR * schedule(s), MARGIN * bound)
        rates.append(opt.param_groups[2]["lr"])
        opt.zero_grad()
        q_y = class_grades[y]
        # λ^q = exp(q ln λ) in float32, λ rounded to float32 as the grading holds it
        w = torch.exp(q_y * torch.tensor(lam).log()) if exponential else q_y + 1
        loss = (w * F.cross_entropy(model(x), y, reduction="none")).sum() / len(y)
        loss = (loss + GAMMA * feature.grades.square().sum()
                + GAMMA_HEADS * heads.grades.square().sum()
                + GAMMA_COORD * (heads.grades - heads.grades.mean(0)).square().sum())
        loss.backward()
        # the global norm summed in the groups' order, as the recipe's loop sums it
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], TAU)
        opt.step()
        if exponential:
            with torch.no_grad():
                for q in grades:
                    q.clamp_(min=0.0)
    return rates


@pytest.mark.parametrize(("grading", "recipe_name"), [("exponential", "egt-alg7.1"),
                                                      ("linear", "lgt-alg5.1")])
def test_the_recipe_is_its_algorithm_written_out(grading, recipe_name):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=10, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=6,
                            positional="learned", grading=grading, learnable_grades=True,
                            grades_per_head=True, grade_init="warm_start", grade_init_value=0.5,
                            dropout=0.0)
    model = TransformerClassifier(cfg, 3)
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 10, (4, 6), generator=gen), torch.tensor([0, 2, 1, 2])
    class_grades = torch.tensor([0.0, 1.0, 2.0])
    recipe = get_recipe(recipe_name, gamma=GAMMA, gamma_heads=GAMMA_HEADS,
                        gamma_coord=GAMMA_COORD, lr_margin=MARGIN)
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=LR, weight_decay=WD), lr=LR)
    sched = make_scheduler(opt, "cosine", warmup_steps=WARMUP, total_steps=T,
                           min_ratio=MIN_RATIO)
    rates = []
    recipe.on_step(model, opt, 0, T)
    for s in range(T):
        rates.append(opt.param_groups[-1]["lr"])
        opt.zero_grad()
        w = recipe.loss_weights(model, class_grades[y])
        loss = (w * F.cross_entropy(model(x), y, reduction="none")).sum() / len(y)
        (loss + recipe.regularization(model)).backward()
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], TAU)
        opt.step()
        sched.step()
        recipe.on_step(model, opt, s + 1, T)
    hand_rates = by_hand(twin, x, y, class_grades, grading == "exponential")
    assert rates == pytest.approx(hand_rates, rel=1e-12)
    assert any(r < LR * schedule(s) for s, r in enumerate(hand_rates))  # the bound acted
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q), name
