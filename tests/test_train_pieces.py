"""Label smoothing, schedules (002 Eq. 6.6), parameter groups and clipping."""

import math

import pytest
import torch
from torch import nn

from graded import TransformerConfig, TransformerLM
from graded.train import (
    clip_gradients,
    inverse_sqrt,
    make_scheduler,
    param_groups,
    sequence_cross_entropy,
    warmup_cosine,
)


def test_label_smoothing_equals_hand_computed_mixture():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    targets = torch.tensor([[0, 4, -100], [2, 2, 1]])
    eps = 0.1
    total, count = 0.0, 0
    for b in range(2):
        for t in range(3):
            if targets[b, t] == -100:
                continue
            logp = torch.log_softmax(logits[b, t], -1)
            q = torch.full((5,), eps / 5, dtype=torch.float64)
            q[targets[b, t]] += 1 - eps
            total += -(q * logp).sum().item()
            count += 1
    got = sequence_cross_entropy(logits, targets, label_smoothing=eps).item()
    assert got == pytest.approx(total / count, rel=1e-12)


def test_inverse_sqrt_schedule_is_002_eq_6_6():
    d, warmup = 512, 4000
    fn = inverse_sqrt(warmup, d_model=d)
    for step in (1, 100, 3999, 4000, 4001, 20000):
        expected = d**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert fn(step - 1) == pytest.approx(expected)
    peak = inverse_sqrt(warmup)
    assert peak(warmup - 1) == pytest.approx(1.0)
    assert peak(4 * warmup - 1) == pytest.approx(0.5)


def test_inverse_sqrt_refuses_a_d_model_that_is_not_a_positive_int():
    """d_model^{-1/2} of a negative d_model is a complex number, which the schedule used to
    hand to the optimiser as its learning rate."""
    for bad in (-4, 0, 2.5):
        with pytest.raises(ValueError, match=rf"d_model must be a positive int or None, got "
                                             rf"{bad!r}"):
            inverse_sqrt(4, d_model=bad)


def test_warmup_cosine_values():
    fn = warmup_cosine(10, 110, min_ratio=0.1)
    assert fn(0) == pytest.approx(0.1)
    assert fn(9) == pytest.approx(1.0)
    assert fn(10) == pytest.approx(1.0)
    assert fn(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert fn(110) == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"total_steps \(5\) must exceed warmup_steps \(10\)"):
        warmup_cosine(10, 5)


def test_scheduler_drives_the_optimizer():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = make_scheduler(opt, "cosine", warmup_steps=2, total_steps=4)
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1.0, 2.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        make_scheduler(opt, "linear")


def test_param_groups_exclude_norms_biases_and_embeddings_from_decay():
    lm = TransformerLM(TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1,
                                         positional="learned"))
    groups = param_groups(lm, 0.1)
    decay = {id(p) for p in groups[0]["params"]}
    names = {id(p): n for n, p in lm.named_parameters()}
    decayed = sorted(names[i] for i in decay)
    assert all(p.dim() == 2 for p in groups[0]["params"])
    assert not any("norm" in n or "embed" in n or n.endswith("bias") for n in decayed)
    assert "decoder.stack.blocks.0.self_attn.attn.in_proj_weight" in decayed
    n_params = sum(len(g["params"]) for g in groups)
    assert n_params == len(list(lm.parameters()))


def test_gradient_clipping_bounds_the_global_norm():
    model = nn.Linear(4, 3)
    model(torch.randn(8, 4)).pow(2).sum().mul(100).backward()
    before = clip_gradients(model, None)
    after_clip = clip_gradients(model, 1.0)
    assert after_clip == pytest.approx(before)
    norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert norm.item() == pytest.approx(1.0, rel=1e-4)
