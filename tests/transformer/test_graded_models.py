"""LGT/EGT models (000 §5-6): neutral grades equal the ungraded twin, stage switches,
graded positions, and learning a task whose target lives in a high-grade feature."""

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerClassifier, TransformerConfig, TransformerLM
from graded.attention.graded import GradedMultiheadAttention
from graded.train import sequence_cross_entropy
from graded.train.recipes import get_recipe
from graded.transformer.graded import GradedPositions, gradings, head_gradings

BASE = dict(vocab_size=13, d_model=16, n_heads=2, n_layers=2, max_len=32)


def build(cls, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = TransformerConfig(**{**BASE, **kw})
    return cls(cfg) if cls is not TransformerClassifier else cls(cfg, 3)


def call(model, x):
    if isinstance(model, Seq2SeqTransformer):
        return model(x, x)
    return model(x)


@pytest.mark.parametrize("cls", [TransformerLM, Seq2SeqTransformer, TransformerClassifier])
@pytest.mark.parametrize("grading", ["linear", "exponential"])
@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
def test_neutral_graded_model_equals_ungraded_twin_outputs_and_gradients(cls, grading, variant):
    plain = build(cls)
    graded = build(cls, grading=grading, learnable_grades=True,
                   grade_attention_variant=variant)
    x = torch.randint(0, 13, (2, 7))
    a, b = call(plain, x), call(graded, x)
    assert torch.equal(a, b)
    a.square().sum().backward()
    b.square().sum().backward()
    grads = dict(graded.named_parameters())
    for name, p in plain.named_parameters():
        assert torch.equal(p.grad, grads[name].grad), name
    assert all(torch.isfinite(g.grades.grad).all() for g in gradings(graded).values())


def test_neutral_graded_regressor_on_features_equals_ungraded():
    plain = build(TransformerClassifier, vocab_size=None, input_dim=4)
    graded = build(TransformerClassifier, vocab_size=None, input_dim=4, grading="exponential",
                   learnable_grades=True)
    x = torch.randn(3, 5, 4)
    assert torch.equal(plain(x), graded(x))


def test_every_stage_is_switchable():
    model = build(TransformerLM, grading="linear", grade_init="constant", grade_init_value=1.0,
                  grade_input=False, grade_ffn=False, grade_output=False,
                  grade_attention=False)
    plain = build(TransformerLM)
    x = torch.randint(0, 13, (2, 5))
    assert torch.equal(model(x), plain(x))  # nothing graded: the twin again
    on = build(TransformerLM, grading="linear", grade_init="constant", grade_init_value=1.0)
    assert not torch.allclose(on(x), plain(x))
    attn = [m for m in on.modules() if isinstance(m, GradedMultiheadAttention)]
    assert len(attn) == 2


def test_graded_stages_apply_the_feature_scales():
    """With only the output stage on, logits = W_out (M h): check against a manual product."""
    model = build(TransformerLM, grading="exponential", grade_init="warm_start",
                  grade_init_value=0.25, grade_input=False, grade_ffn=False,
                  grade_attention=False)
    x = torch.randint(0, 13, (1, 4))
    h, _ = model.decoder(x)
    scales = model.feature_grading.scales()
    expected = (h * scales) @ model.head.proj.weight.T
    torch.testing.assert_close(model(x), expected)
    assert scales[1].item() == pytest.approx(2.0**0.25)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_graded_positions_scale_the_encoding(grading):
    alpha = 0.02
    model = build(TransformerLM, grading=grading, grade_position_alpha=alpha, grade_input=False)
    emb = model.decoder.embed
    pos = torch.arange(5)
    pe = emb.positions(pos)
    graded = emb.position_grading(pe, pos)
    factor = 1 - alpha * pos if grading == "linear" else 2.0 ** (-alpha * pos)
    torch.testing.assert_close(graded, pe * factor.unsqueeze(-1))


def test_lgt_positional_factor_must_stay_positive():
    with pytest.raises(ValueError, match=r"alpha\*\d+ < 1 so that the LGT factor"):
        TransformerConfig(**{**BASE, "grading": "linear", "grade_position_alpha": 0.1})
    with pytest.raises(ValueError, match=r"1 - alpha\*31 = "):
        GradedPositions("linear", 0.1, 32)


def test_normalised_input_has_unit_norm():
    model = build(TransformerLM, grading="linear", grade_normalize=True, positional="none",
                  grade_init="warm_start", grade_init_value=0.5)
    x = torch.randint(0, 13, (2, 6))
    emb = model.decoder.embed
    out = emb.input_grading(emb.tokens(x))
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(2, 6))


def test_grading_config_errors_name_the_field():
    with pytest.raises(ValueError, match="grading='quadratic' is invalid"):
        TransformerConfig(**{**BASE, "grading": "quadratic"})
    with pytest.raises(ValueError, match=r"grading_base=1\.0 is invalid"):
        TransformerConfig(**{**BASE, "grading": "exponential", "grading_base": 1.0})
    with pytest.raises(ValueError, match=r"input_grades=.* is invalid"):
        TransformerConfig(**{**BASE, "vocab_size": None, "input_dim": 3, "input_grades": [1, 2]})


def high_grade_task(n=256, seed=0):
    """Sequences of 4 feature vectors; the label is the sign of the sum of feature 3, which is
    ten times smaller than the noise features 0-2: it is the feature that must be amplified."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, 4, generator=g)
    x[..., 3] *= 0.1
    return x, (x[..., 3].sum(1) > 0).long()


@pytest.mark.parametrize(("grading", "recipe"),
                         [("linear", "lgt-alg5.1"), ("exponential", "egt-alg7.1")])
def test_lgt_and_egt_learn_a_high_grade_task_and_raise_its_grade(grading, recipe):
    x, y = high_grade_task()
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=None, input_dim=4, d_model=16, n_heads=2, n_layers=1,
                            positional="none", grading=grading, learnable_grades=True,
                            grade_init="constant", grade_init_value=0.5, grade_ffn=False,
                            grade_output=False, grade_attention=False)
    model = TransformerClassifier(cfg, 2)
    r = get_recipe(recipe)
    opt = torch.optim.AdamW(r.param_groups(model, lr=3e-3, weight_decay=0.1, grade_lr=0.05))
    steps = 200
    r.on_step(model, opt, 0, steps)
    g = torch.Generator().manual_seed(1)
    for s in range(steps):
        idx = torch.randint(0, len(x), (64,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss = loss + r.regularization(model)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        r.on_step(model, opt, s + 1, steps)
    accuracy = (model(x).argmax(-1) == y).float().mean().item()
    q = model.input_grading.grades.detach()
    assert accuracy >= 0.9, accuracy
    assert q[3] > 0.5 and q[3] > q[:3].max(), q


def test_lm_with_graded_attention_trains():
    model = build(TransformerLM, grading="exponential", learnable_grades=True,
                  grade_init="warm_start", grade_init_value=0.1, grades_per_head=True)
    x = torch.randint(0, 13, (4, 8))
    loss = sequence_cross_entropy(model(x)[:, :-1], x[:, 1:])
    loss.backward()
    heads = head_gradings(model)
    assert heads and all(g.grades.shape == (2, 8) for g in heads)
    assert all(g.grades.grad.abs().sum() > 0 for g in heads)
