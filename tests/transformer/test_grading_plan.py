"""Grading at construction: a GradingPlan made from the config hands each stage its grading
(000 §5-6); gradings carry their role and are found by it, never by a module's name."""

import re
from pathlib import Path

import pytest
import torch

import graded.transformer.graded as graded_module
from graded import Seq2SeqTransformer, TransformerClassifier, TransformerConfig, TransformerLM
from graded.attention.graded import GradedMultiheadAttention
from graded.grading import LinearGrading
from graded.transformer import TransformerDecoder, TransformerEncoder
from graded.transformer.blocks import AttentionSublayer, FeedForwardSublayer
from graded.transformer.graded import (
    GradedFeatures,
    GradingPlan,
    feature_grading,
    feature_gradings,
    gradings,
    head_gradings,
)

BASE = dict(vocab_size=13, d_model=8, n_heads=2, n_layers=2, max_len=16)
GRADED = dict(grading="linear", grade_init="warm_start", grade_init_value=0.1)
SRC = Path(__file__).resolve().parents[2] / "src" / "graded"


def config(**kw):
    return TransformerConfig(**{**BASE, **kw})


def ids(*shape):
    return torch.randint(0, 13, shape, generator=torch.Generator().manual_seed(3))


def test_a_subclass_of_the_ffn_sublayer_keeps_its_grading():
    class ScaledFFN(FeedForwardSublayer):
        def forward(self, x):
            return 2.0 * super().forward(x)

    torch.manual_seed(0)
    plan = GradingPlan(config(**GRADED))
    ff = ScaledFFN(plan.config, plan=plan)
    assert ff.grading.grading is plan.feature
    x = torch.randn(2, 5, 8)
    m = 1.0 + 0.1 * torch.arange(8.0)  # LGT shift: f(q) = q + 1 with q_k = 0.1·k
    torch.testing.assert_close(ff(x), 2.0 * ff.ffn(x) * m)


def test_ungraded_config_has_no_plan_and_a_plan_needs_a_graded_config():
    assert GradingPlan.from_config(config()) is None
    with pytest.raises(ValueError, match="grading is None"):
        GradingPlan(config())
    model = TransformerLM(config())
    assert model.grading_plan is None and gradings(model) == {}
    assert feature_grading(model) is None


def _embed_naive(enc, x, alpha, m_in):
    """tokens(x)·m (or tokens(x·m) for features) + (1 − α t)·Pe, written out by hand."""
    t = torch.arange(x.shape[1])
    pe = enc.embed.positions(t.expand(x.shape[0], -1)) * (1.0 - alpha * t)[None, :, None]
    if x.is_floating_point():
        return enc.embed.tokens(x * m_in) + pe
    return enc.embed.tokens(x) * m_in + pe


@pytest.mark.parametrize("features", [False, True])
def test_standalone_encoder_from_a_graded_config_is_graded_in_every_stage(features):
    alpha = 0.02
    kw = dict(vocab_size=None, input_dim=3, input_grades=[0.0, 1.0, 2.0]) if features else {}
    torch.manual_seed(0)
    enc = TransformerEncoder(config(**GRADED, grade_position_alpha=alpha, **kw))
    x = torch.randn(2, 5, 3) if features else ids(2, 5)
    positions = torch.arange(5).expand(2, -1)
    m = 1.0 + 0.1 * torch.arange(8.0)
    m_in = torch.tensor([1.0, 2.0, 3.0]) if features else m
    # input and position stages
    torch.testing.assert_close(enc.embed(x, positions), _embed_naive(enc, x, alpha, m_in))
    # attention: one graded attention with a head grading of its own per layer
    attns = [b.self_attn.attn for b in enc.stack.blocks]
    assert all(isinstance(a, GradedMultiheadAttention) for a in attns)
    assert len({id(a.grading) for a in attns}) == len(attns) == 2
    # feed-forward stage: M·Fnn(h)
    h = torch.randn(2, 5, 8)
    for block in enc.stack.blocks:
        torch.testing.assert_close(block.ff(h), block.ff.ffn(h) * m)
    # changing the feature grades changes every stage that shares them, as M·x does
    q = torch.linspace(0.0, 0.7, 8)
    enc.feature_grading.set_grades(q)
    for block in enc.stack.blocks:
        torch.testing.assert_close(block.ff(h), block.ff.ffn(h) * (1.0 + q))
    if not features:
        torch.testing.assert_close(enc.embed(x, positions),
                                   _embed_naive(enc, x, alpha, 1.0 + q))


def test_standalone_encoder_without_position_alpha_adds_plain_positions():
    enc = TransformerEncoder(config(**GRADED))
    assert enc.embed.position_grading is None
    assert isinstance(enc.embed.input_grading, GradedFeatures)


def test_standalone_decoder_grades_self_and_cross_attention_with_their_own_gradings():
    dec = TransformerDecoder(config(**GRADED), cross_attention=True)
    layers = [s for s in dec.modules() if isinstance(s, AttentionSublayer)]
    assert len(layers) == 4 and sum(s.cross for s in layers) == 2
    assert [id(s.attn.grading) for s in layers] == [id(g) for g in dec.grading_plan.heads]
    assert feature_grading(dec) is dec.feature_grading is dec.grading_plan.feature


def _model(kind):
    torch.manual_seed(0)
    if kind == "lm":
        return TransformerLM(config(**GRADED, grade_position_alpha=0.01))
    if kind == "seq2seq":
        return Seq2SeqTransformer(config(grading="exponential", grades_per_head=True,
                                         n_decoder_layers=1))
    return TransformerClassifier(config(**GRADED, vocab_size=None, input_dim=3,
                                        grade_attention_variant="multi_head"), 2)


@pytest.mark.parametrize("kind", ["lm", "seq2seq", "features"])
def test_roles_found_equal_what_the_plan_built(kind):
    model = _model(kind)
    plan = model.grading_plan
    attention_layers = [m for m in model.modules() if isinstance(m, GradedMultiheadAttention)]
    assert [id(g) for g in head_gradings(model)] == [id(g) for g in plan.heads]
    assert [id(m.grading) for m in attention_layers] == [id(g) for g in plan.heads]
    assert {id(g) for g in gradings(model).values()} == {id(g) for g in plan.built()}
    assert {id(g) for g in feature_gradings(model)} == {id(plan.feature), id(plan.inputs)}
    assert feature_grading(model) is plan.feature
    expected_input_role = "input" if kind == "features" else "feature"
    assert (plan.feature.role, plan.inputs.role) == ("feature", expected_input_role)
    assert {g.role for g in plan.heads} == {"attention"}


@pytest.mark.parametrize("kind", ["lm", "seq2seq", "features"])
def test_one_feature_grading_is_shared_by_input_ffn_and_output(kind):
    model = _model(kind)
    plan = model.grading_plan
    ffns = [m for m in model.modules() if isinstance(m, FeedForwardSublayer)]
    assert ffns and all(f.grading.grading is plan.feature for f in ffns)
    assert model.head.grading is plan.feature is model.feature_grading
    embeds = [m.embed for m in model.children() if hasattr(m, "embed")]
    assert all(e.input_grading.grading is plan.inputs for e in embeds)


def test_state_dict_keeps_the_checkpoint_layout_of_graded_models():
    lm = TransformerLM(config(**GRADED, n_layers=1))
    assert sorted(k for k in lm.state_dict() if "grad" in k) == [
        "decoder.embed.input_grading.grading.grades",
        "decoder.stack.blocks.0.ff.grading.grading.grades",
        "decoder.stack.blocks.0.self_attn.attn.grading.grades",
        "feature_grading.grades",
        "head.grading.grades",
    ]
    cls = TransformerClassifier(config(**GRADED, n_layers=1, vocab_size=None, input_dim=3), 2)
    assert sorted(k for k in cls.state_dict() if "grad" in k) == [
        "encoder.embed.input_grading.grading.grades",
        "encoder.stack.blocks.0.ff.grading.grading.grades",
        "encoder.stack.blocks.0.self_attn.attn.grading.grades",
        "feature_grading.grades",
        "head.grading.grades",
        "input_grading.grades",
    ]


def test_head_gradings_are_found_by_role_under_any_attribute_name():
    torch.manual_seed(0)
    mixer = GradedMultiheadAttention(8, 2, "exponential", variant="values")
    model = torch.nn.ModuleDict({"mixer": mixer})
    assert head_gradings(model) == [mixer.grading] and feature_gradings(model) == []


def test_unknown_role_is_named():
    with pytest.raises(ValueError, match=r"'heads'.*'attention'"):
        gradings(TransformerLM(config(**GRADED)), "heads")


def test_no_install_grading_and_no_name_matching_remain():
    assert not hasattr(graded_module, "install_grading")
    pattern = re.compile(r"__name__\s*(==|in)\s*[(\"'](?!__main__)|endswith\(\"attn")
    offenders = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line) or "install_grading" in line]
    assert offenders == []


def test_graded_attention_marks_its_grading_as_a_head_grading_unless_it_has_a_role():
    assert GradedMultiheadAttention(8, 2, "linear").grading.role == "attention"
    assert GradedMultiheadAttention(8, 2, LinearGrading(4)).grading.role == "attention"
    given = LinearGrading(4)
    given.role = "feature"
    assert GradedMultiheadAttention(8, 2, given).grading.role == "feature"


def test_grade_heads_names_an_unknown_variant_and_the_known_ones():
    from graded.attention.graded import grade_heads

    x = torch.ones(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"'keys'.*'scores'"):
        grade_heads("keys", lambda t: 2 * t, x, x, x)


def test_held_gradings_answer_for_their_model_only_and_until_the_block_ends():
    gradings = graded_module.gradings
    config = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=2, d_ff=16,
                               grading="linear", learnable_grades=True)
    model, other = TransformerLM(config), TransformerLM(config)
    walked = gradings(model)
    with graded_module.held_gradings(model) as held:
        assert held == walked
        assert gradings(model) == walked
        assert graded_module.head_gradings(model) == [
            g for g in walked.values() if g.role == "attention"]
        assert graded_module.feature_grading(model) is \
            walked["decoder.embed.input_grading.grading"]
        model.extra = LinearGrading(8)  # not seen inside the block (the caller's promise)
        assert "extra" not in gradings(model)
        gradings(model).clear()  # a copy: the held gradings stay
        assert gradings(model) == walked
        assert set(gradings(other).values()).isdisjoint(walked.values())  # walked anew
        assert len(gradings(other)) == len(walked)
    assert "extra" in gradings(model)
