"""Grading folded into the weights: a diagonal grading next to a linear map is that map with
its rows or columns rescaled, (W x + b)·m = (diag(m) W) x + m·b and W (m·x) = (W diag(m)) x.

Every folded form is compared with the activation form (``fold_grading=False``, today's
formulas, themselves checked against naive loops in tests/attention/test_graded_attention.py):
outputs and the gradients to the grades and the weights agree to float64 rounding. Where the
fold would not be exact (rotary positions with grades unequal on a rotary pair, grouped keys and
values with per-head grades, ``add_bias_kv``) the activation form is taken, and a test shows
that folding there would be wrong.
"""

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerClassifier, TransformerConfig, TransformerLM
from graded.attention.graded import GradedMultiheadAttention
from graded.folding import activation_grading, graded_linear
from graded.positional import RotaryEmbedding
from graded.transformer.blocks import FeedForwardSublayer
from graded.transformer.graded import GradingPlan, gradings, head_gradings

E, H = 8, 2  # embed_dim, heads: head_dim 4
TOL = dict(rtol=1e-12, atol=1e-12)
LAYOUTS = {
    "fused": {},
    "kdim_vdim": {"kdim": 6, "vdim": 5},
    "grouped": {"num_kv_heads": 1},
}


def close(a, b):
    torch.testing.assert_close(a, b, **TOL)


def attention_pair(variant, grading, per_head, layout, bias, **extra):
    """The same graded attention twice, folded and activation form, in float64."""
    gen = torch.Generator().manual_seed(0)
    shape = (H, E // H) if per_head else (E // H,)
    grades = torch.rand(shape, generator=gen, dtype=torch.float64) * 1.5
    pair = []
    for fold in (True, False):
        torch.manual_seed(1)
        m = GradedMultiheadAttention(E, H, grading=grading, grades=grades, variant=variant,
                                     learnable_grades=True, batch_first=True, bias=bias,
                                     fold_grading=fold, **LAYOUTS[layout], **extra).double()
        with torch.no_grad():  # non-zero biases, so that their scaling is tested too
            for p in (m.in_proj_bias, m.out_proj.bias):
                if p is not None:
                    p.normal_(generator=gen)
        pair.append(m)
    pair[1].load_state_dict(pair[0].state_dict())
    return pair


def run(module, length, layout, seed=2):
    """Output of self- (or, with kdim/vdim, cross-) attention and the gradients of a loss."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, length, E, generator=gen, dtype=torch.float64)
    key = value = x
    if layout == "kdim_vdim":
        key = torch.randn(2, length + 1, 6, generator=gen, dtype=torch.float64)
        value = torch.randn(2, length + 1, 5, generator=gen, dtype=torch.float64)
    mask = torch.rand(length, key.shape[1], generator=gen) > 0.7
    mask[:, 0] = False  # every query keeps a key
    out, _ = module(x, key, value, attn_mask=mask, need_weights=False)
    out.square().sum().backward()
    return out, {n: p.grad for n, p in module.named_parameters()}


VARIANT_GRADES = [("scores", False), ("scores", True), ("queries_keys", False),
                  ("queries_keys", True), ("values", False), ("values", True),
                  ("multi_head", True)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("grading", ["linear", "exponential"])
@pytest.mark.parametrize("variant,per_head", VARIANT_GRADES)
@pytest.mark.parametrize("length", [6, 2])  # 12 rows >= E: weights scaled; 4 rows: activations
def test_folded_attention_equals_the_activation_form_outputs_and_gradients(
        variant, per_head, grading, layout, bias, length):
    folded, plain = attention_pair(variant, grading, per_head, layout, bias)
    assert plain.folded_parts == ()
    expected = {"scores": ("q",), "multi_head": ("q",), "queries_keys": ("q", "k"),
                "values": ("v",)}[variant]
    if layout == "grouped" and per_head:  # the heads of a group share k, v but not grades
        expected = tuple(p for p in expected if p == "q")
    assert folded.folded_parts == expected
    out_f, grads_f = run(folded, length, layout)
    out_p, grads_p = run(plain, length, layout)
    close(out_f, out_p)
    assert grads_f.keys() == grads_p.keys() and "grading.grades" in grads_f
    for name in grads_f:
        close(grads_f[name], grads_p[name])


def test_folded_projection_is_the_projection_with_rescaled_rows():
    """Independent of the activation form: q from project equals x W_qᵀ with row h·d + i of
    W_q and b_q multiplied by m_{h,i} by hand, for per-head grades (multi_head)."""
    folded, _ = attention_pair("multi_head", "exponential", True, "fused", True)
    x = torch.randn(3, 5, E, dtype=torch.float64)
    q, k, _ = folded.project(x, x, x)
    m = 2.0 ** folded.grading.grades.detach()  # λ^q, (H, head_dim)
    w, b = folded.in_proj_weight.detach(), folded.in_proj_bias.detach()
    rows = m.reshape(-1)
    want_q = (x @ (rows[:, None] * w[:E]).T + rows * b[:E]).unflatten(-1, (H, E // H))
    close(q.detach(), want_q.transpose(1, 2))
    close(k.detach(), (x @ w[E:2 * E].T + b[E:2 * E]).unflatten(-1, (H, E // H)).transpose(1, 2))


def test_folded_parts_skip_the_activation_multiply_and_transform_heads_is_the_identity():
    folded, plain = attention_pair("queries_keys", "linear", True, "fused", True)
    calls = []
    folded.grading.register_forward_hook(lambda *_: calls.append(1))
    plain.grading.register_forward_hook(lambda *_: calls.append(2))
    x = torch.randn(2, 6, E, dtype=torch.float64)
    folded(x, x, x, need_weights=False)
    assert calls == []  # the grading's x·m never ran: only its scales, into the weights
    plain(x, x, x, need_weights=False)
    assert calls == [2, 2]  # q·m and k·m on the activations
    q, k, v = folded.project(x, x, x)
    assert all(a is b for a, b in zip(folded.transform_heads(q, k, v), (q, k, v)))
    assert all(a is not b for a, b in zip(plain.transform_heads(q, k, v)[:2], (q, k)))


def test_bias_kv_keeps_keys_and_values_on_the_activations():
    """bias_k, bias_v are appended after the projection and graded with the keys: with
    add_bias_kv the keys and values are graded on the activations, the queries folded."""
    for variant in ("queries_keys", "values"):
        folded, plain = attention_pair(variant, "exponential", False, "fused", True,
                                       add_bias_kv=True)
        assert folded.folded_parts == (("q",) if variant == "queries_keys" else ())
        out_f, grads_f = run(folded, 6, "fused")
        out_p, grads_p = run(plain, 6, "fused")
        close(out_f, out_p)
        close(grads_f["bias_k"], grads_p["bias_k"])
        close(grads_f["grading.grades"], grads_p["grading.grades"])


def rotary_between(module, x, rotary):
    """project, rotary positions on q and k, attend: what the transformer blocks do."""
    q, k, v = module.project(x, x, x)
    pos = torch.arange(x.shape[1])
    heads, _ = module.attend(rotary(q, pos), rotary(k, pos), v, is_causal=True)
    return module.merge(heads)


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
def test_with_rotary_and_grades_unequal_on_a_pair_queries_and_keys_are_not_folded(variant):
    """Rotary rotates the pairs (2i, 2i+1): rot(q·m) ≠ rot(q)·m unless m_{2i} = m_{2i+1}. With
    ``qk_rotated`` the module leaves q, k on the activations (the values stay folded) and
    equals the activation form; folding them anyway would change the result."""
    rotary = RotaryEmbedding(E // H).double()
    folded, plain = attention_pair(variant, "exponential", True, "fused", True, qk_rotated=True)
    wrongly, _ = attention_pair(variant, "exponential", True, "fused", True)
    grades = folded.grading.grades.detach()
    assert not torch.equal(grades[:, 0::2], grades[:, 1::2])  # not pair-symmetric
    assert folded.folded_parts == (("v",) if variant == "values" else ())
    x = torch.randn(2, 7, E, dtype=torch.float64)
    close(rotary_between(folded, x, rotary), rotary_between(plain, x, rotary))
    if variant != "values":
        diff = rotary_between(wrongly, x, rotary) - rotary_between(plain, x, rotary)
        assert diff.abs().max() > 1e-3


@pytest.mark.parametrize("rows", [3, 40])  # fewer rows than in/out: activations; more: weights
def test_graded_linear_is_the_linear_map_between_the_gradings(rows):
    gen = torch.Generator().manual_seed(0)
    w, b = (torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)
            for s in ((7, 5), (7,)))
    m_out, m_in = (torch.rand(n, generator=gen, dtype=torch.float64).add(0.5).requires_grad_()
                   for n in (7, 5))
    x = torch.randn(rows, 5, generator=gen, dtype=torch.float64)
    for kw, want in (({"out_scales": m_out}, (x @ w.T + b) * m_out),
                     ({"in_scales": m_in}, (x * m_in) @ w.T + b)):
        got = graded_linear(x, w, b, **kw)
        close(got, want)
        params = (w, b, *kw.values())
        for g1, g2 in zip(torch.autograd.grad(got.sum(), params),
                          torch.autograd.grad(want.sum(), params)):
            close(g1, g2)


# ---------------------------------------------------------------------------- models
BASE = dict(vocab_size=13, d_model=16, n_heads=4, n_layers=2, d_ff=24, max_len=40,
            dropout=0.0, grade_init="warm_start", grade_init_value=0.3, learnable_grades=True)


def model_pair(cls, **kw):
    """The same graded model, folded and in the activation form, float64, equal weights."""
    pair = []
    for fold in (True, False):
        torch.manual_seed(0)
        cfg = TransformerConfig(**{**BASE, **kw, "fold_grading": fold})
        model = (cls(cfg, 3) if cls is TransformerClassifier else cls(cfg)).double()
        with torch.no_grad():  # non-neutral, per-coordinate distinct grades everywhere
            for g in gradings(model).values():
                g.grades.add_(torch.rand(g.grades.shape, dtype=g.grades.dtype) * 0.5)
        pair.append(model)
    pair[1].load_state_dict(pair[0].state_dict())
    return pair


def forward(model, ids, **kw):
    return model(ids, ids, **kw) if isinstance(model, Seq2SeqTransformer) else model(ids, **kw)


MODELS = {
    "lm": (TransformerLM, {}),
    "lm-rope": (TransformerLM, {"positional": "rope"}),
    "lm-rope-gqa-per-head": (TransformerLM, {"positional": "rope", "n_kv_heads": 2,
                                             "grades_per_head": True}),
    "lm-gqa": (TransformerLM, {"n_kv_heads": 1}),
    "lm-swiglu-normalised": (TransformerLM, {"activation": "swiglu", "grade_normalize": True}),
    "lm-token-grading": (TransformerLM, {"token_grading": True}),
    "classifier": (TransformerClassifier, {}),
    "classifier-rope": (TransformerClassifier, {"positional": "rope"}),
    "seq2seq": (Seq2SeqTransformer, {}),
}


@pytest.mark.parametrize("grading", ["linear", "exponential"])
@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_folded_model_equals_the_activation_form_logits_and_grade_gradients(
        name, variant, grading):
    cls, kw = MODELS[name]
    folded, plain = model_pair(cls, grading=grading, grade_attention_variant=variant, **kw)
    ids = torch.randint(0, 13, (4, 9), generator=torch.Generator().manual_seed(1))
    extra = {}
    if kw.get("token_grading"):
        extra["token_grades"] = torch.randint(0, 3, (4, 9)).double()
    outs = [forward(m, ids, **extra) for m in (folded, plain)]
    close(outs[0], outs[1])
    for out in outs:
        out.square().sum().backward()
    grads_p = dict(plain.named_parameters())
    for n, p in folded.named_parameters():
        close(p.grad, grads_p[n].grad)
    assert any(n.endswith("grades") for n, _ in folded.named_parameters())


def test_a_folded_model_runs_no_activation_grading_in_its_stack():
    """Without rotary, every attention grading and the FFN and output gradings are folded:
    their x·m never runs; only the input grading acts on the activations, once per pass."""
    folded, plain = model_pair(TransformerLM, grading="exponential",
                               grade_attention_variant="queries_keys")
    ids = torch.randint(0, 13, (4, 16))  # 64 rows >= d_ff: the FFN's weights are scaled

    def count(model):
        calls = {"feature": 0, "attention": 0}
        for g in gradings(model).values():
            g.register_forward_hook(lambda *_, r=g.role: calls.__setitem__(r, calls[r] + 1))
        model(ids)
        return calls

    assert count(folded) == {"feature": 1, "attention": 0}  # the input stage only
    assert len(head_gradings(plain)) == 2
    # input, two FFNs, output; q·m and k·m in both layers
    assert count(plain) == {"feature": 1 + 2 + 1, "attention": 2 * 2}


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu", "swiglu"])
def test_folded_feed_forward_equals_m_times_the_feed_forward(activation):
    torch.manual_seed(0)
    cfg = TransformerConfig(**{**BASE, "grading": "linear", "activation": activation})
    plan = GradingPlan(cfg)
    sub = FeedForwardSublayer(cfg, plan=plan).double()  # holds plan.feature: now float64
    with torch.no_grad():
        plan.feature.grades.uniform_(0, 2)
    x = torch.randn(3, 30, 16, dtype=torch.float64)  # 90 rows >= d_ff = 24: folded weights
    close(sub(x), sub.ffn(x) * plan.feature.scales())


@pytest.mark.parametrize("kw", [{}, {"positional": "rope"}, {"n_kv_heads": 2},
                                {"positional": "rope", "grade_attention_variant": "values"},
                                {"attn_backend": "sliding_window",
                                 "attn_backend_options": {"window": 3, "block_size": 4}}],
                         ids=["sinusoidal", "rope", "gqa", "rope-values", "stateful-backend"])
@pytest.mark.parametrize("variant", ["queries_keys", "values"])
def test_cached_decoding_of_a_folded_model_equals_the_uncached_activation_form(kw, variant):
    """The cache holds keys and values graded exactly when they are folded: a prompt of 10
    tokens (weights scaled), then one token a step (activations scaled inside project), equals
    the uncached pass of the activation form."""
    kw = {"grade_attention_variant": variant, **kw}
    folded, plain = model_pair(TransformerLM, grading="exponential", **kw)
    folded.eval()
    plain.eval()
    ids = torch.randint(0, 13, (2, 16), generator=torch.Generator().manual_seed(3))
    cache = folded.new_cache()
    with torch.no_grad():
        got = [folded(ids[:, :10], cache=cache)]
        got += [folded(ids[:, t:t + 1], cache=cache) for t in range(10, 16)]
        torch.testing.assert_close(torch.cat(got, dim=1), plain(ids), rtol=1e-10, atol=1e-10)
    prompt = ids[:, :5]
    assert torch.equal(folded.generate(prompt, 10, use_cache=True),
                       plain.generate(prompt, 10, use_cache=False))


def test_seq2seq_cached_generation_of_a_folded_model_equals_the_activation_form():
    folded, plain = model_pair(Seq2SeqTransformer, grading="linear",
                               grade_attention_variant="queries_keys")
    src = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(2))
    got = folded.eval().generate(src, 8, bos_token_id=1, use_cache=True)
    want = plain.eval().generate(src, 8, bos_token_id=1, use_cache=False)
    assert torch.equal(got, want)


def test_activation_grading_switches_folding_off_for_a_while():
    folded, plain = model_pair(TransformerLM, grading="exponential")
    switches = [m for m in folded.modules() if hasattr(m, "fold_grading")]
    assert len(switches) == 2 + 2 + 1  # two attention layers, two FFNs, the output head
    ids = torch.randint(0, 13, (2, 6))
    with activation_grading(folded):
        assert not any(m.fold_grading for m in switches)
        assert all(m.folded_parts == () for m in folded.modules()
                   if isinstance(m, GradedMultiheadAttention))
        close(folded(ids), plain(ids))
    assert all(m.fold_grading for m in switches)
