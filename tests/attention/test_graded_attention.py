"""GradedMultiheadAttention: each variant of 000 Def 5.22 against a naive loop of its formula."""

import math

import pytest
import torch
from torch import nn

from graded.attention import MultiheadAttention
from graded.attention.graded import GradedMultiheadAttention
from graded.grading import ExponentialGrading, LinearGrading

E, H, D = 8, 2, 4  # embed_dim, heads, head_dim


def per_head(module, x_q, x_kv):
    """Projected per-head q, k, v of a (T, E) input, from the module's weights (naive)."""
    w, b = module.in_proj_weight, module.in_proj_bias
    q = x_q @ w[:E].T + b[:E]
    k = x_kv @ w[E : 2 * E].T + b[E : 2 * E]
    v = x_kv @ w[2 * E :].T + b[2 * E :]
    split = lambda t: [t[:, h * D : (h + 1) * D] for h in range(H)]  # noqa: E731
    return split(q), split(k), split(v)


def naive_graded_attention(module, x_q, x_kv, scales, variant, keep=None):
    """Loop over heads, queries, keys and coordinates, exactly as the paper writes it.

    scales: (H, D) diagonal of M per head. keep: (Tq, Tk) bool, True = may attend.
    """
    qs, ks, vs = per_head(module, x_q, x_kv)
    t_q, t_k = x_q.shape[0], x_kv.shape[0]
    heads = []
    for h in range(H):
        m = scales[h]
        out = torch.zeros(t_q, D, dtype=x_q.dtype)
        for i in range(t_q):
            scores = []
            for j in range(t_k):
                if variant in ("scores", "multi_head"):  # sc_ij = Σ_k m_k q_ik k_jk
                    s = sum(m[c] * qs[h][i, c] * ks[h][j, c] for c in range(D))
                elif variant == "queries_keys":  # (M q_i)·(M k_j)
                    s = sum((m[c] * qs[h][i, c]) * (m[c] * ks[h][j, c]) for c in range(D))
                else:  # values: plain scores
                    s = sum(qs[h][i, c] * ks[h][j, c] for c in range(D))
                s = s / math.sqrt(D)
                if keep is not None and not keep[i, j]:
                    s = torch.tensor(float("-inf"), dtype=x_q.dtype)
                scores.append(s)
            alpha = torch.softmax(torch.stack(scores), dim=0)
            for j in range(t_k):
                v = vs[h][j] * m if variant == "values" else vs[h][j]
                out[i] = out[i] + alpha[j] * v
        heads.append(out)
    concat = torch.cat(heads, dim=-1)
    return concat @ module.out_proj.weight.T + module.out_proj.bias


def make(variant, grading, per_head_grades, learnable, seed=0):
    torch.manual_seed(seed)
    shape = (H, D) if per_head_grades or variant == "multi_head" else (D,)
    grades = torch.rand(shape, dtype=torch.float64) * 1.5
    module = GradedMultiheadAttention(
        E, H, grading=grading, grades=grades, variant=variant, learnable_grades=learnable,
        batch_first=True,
    ).double()
    return module


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
@pytest.mark.parametrize("grading", ["linear", "exponential"])
@pytest.mark.parametrize("per_head_grades", [False, True])
def test_every_variant_equals_the_papers_formula(variant, grading, per_head_grades):
    module = make(variant, grading, per_head_grades, learnable=per_head_grades)
    x = torch.randn(1, 5, E, dtype=torch.float64)
    scales = module.grading.scales().detach().expand(H, D)
    keep = torch.rand(5, 5) > 0.3
    keep.fill_diagonal_(True)
    expected = naive_graded_attention(module, x[0], x[0], scales, variant, keep)
    got, _ = module(x, x, x, attn_mask=~keep, need_weights=False)
    torch.testing.assert_close(got[0], expected, rtol=1e-10, atol=1e-10)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    expected = naive_graded_attention(module, x[0], x[0], scales, variant, causal)
    got, _ = module(x, x, x, is_causal=True, need_weights=True)
    torch.testing.assert_close(got[0], expected, rtol=1e-10, atol=1e-10)


def test_cross_attention_with_padding_equals_formula():
    module = make("scores", "exponential", True, learnable=False)
    q = torch.randn(1, 3, E, dtype=torch.float64)
    kv = torch.randn(1, 6, E, dtype=torch.float64)
    kpm = torch.tensor([[False, False, False, False, True, True]])
    keep = (~kpm).expand(3, 6)
    expected = naive_graded_attention(module, q[0], kv[0], module.grading.scales(), "scores",
                                      keep)
    got, _ = module(q, kv, kv, key_padding_mask=kpm)
    torch.testing.assert_close(got[0], expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_grades_are_held_in_the_dtype_the_module_is_built_in(grading):
    """GradedMultiheadAttention(dtype=float64): grades and scales in float64, as the
    projections (they were float32, so M = diag(λ^q) was rounded to float32 in a float64
    module); the output equals the formula with M computed in float64 from the grades."""
    torch.manual_seed(0)
    grades = [0.1, 0.7, 1.3, 2.9]
    module = GradedMultiheadAttention(E, H, grading=grading, grades=grades, base=3.0,
                                      f="softplus", batch_first=True, dtype=torch.float64)
    assert {t.dtype for t in (*module.parameters(), *module.buffers())} == {torch.float64}
    q = torch.tensor(grades, dtype=torch.float64)
    m = 3.0**q if grading == "exponential" else torch.nn.functional.softplus(q)
    x = torch.randn(1, 4, E, dtype=torch.float64)
    expected = naive_graded_attention(module, x[0], x[0], m.expand(H, D), "scores")
    got, _ = module(x, x, x, need_weights=False)
    torch.testing.assert_close(got[0], expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kw", [{"fold_grading": False}, {"add_bias_kv": True},
                                {"qk_rotated": True}], ids=["activations", "bias_kv", "rotated"])
def test_float64_grades_given_to_a_float32_module_are_held_in_its_dtype(kw):
    """Grades given as a float64 tensor to a module built in the default float32 are held in
    float32, as its projections: the parts graded on the activations (here the keys, or all
    of them) then give float32 outputs, those of grades given in float32."""
    grades = torch.tensor([0.1, 0.7, 1.3, 2.9], dtype=torch.float64)
    outs = []
    for g in (grades, grades.float()):
        torch.manual_seed(0)
        module = GradedMultiheadAttention(E, H, grading="exponential", grades=g,
                                          variant="queries_keys", batch_first=True, **kw)
        assert module.grading.grades.dtype == torch.float32
        x = torch.randn(2, 5, E)
        outs.append(module(x, x, x)[0])
    assert torch.equal(outs[0], outs[1])


def test_queries_keys_squares_the_grading_of_scores():
    qk = make("queries_keys", "exponential", False, learnable=False)
    sc = GradedMultiheadAttention(E, H, grading="exponential",
                                  grades=2 * qk.grading.grades, variant="scores",
                                  batch_first=True).double()
    sc.load_state_dict(qk.torch_state_dict())
    x = torch.randn(2, 4, E, dtype=torch.float64)
    torch.testing.assert_close(qk(x, x, x)[0], sc(x, x, x)[0])


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_gradcheck_of_outputs_with_respect_to_grades(variant, grading):
    module = make(variant, grading, per_head_grades=True, learnable=True)
    x = torch.randn(1, 3, E, dtype=torch.float64)
    grades = module.grading.grades.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda g: _forward_with_grades(module, x, g), (grades,))


def _forward_with_grades(module, x, g):
    """Run the module with its grades replaced by the tensor g (functional call)."""
    return torch.func.functional_call(module, {"grading.grades": g}, (x, x, x))[0]


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_neutral_grades_equal_plain_attention_outputs_and_gradients(variant, grading):
    """Bit for bit against the ungraded twin; to rounding against torch's module."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, batch_first=True)
    twin = MultiheadAttention(E, H, batch_first=True)
    module = GradedMultiheadAttention(E, H, grading=grading, variant=variant,
                                      learnable_grades=True, batch_first=True)
    twin.load_state_dict(ref.state_dict())
    module.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, E)
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    outs = [m(x, x, x, attn_mask=mask)[0] for m in (ref, twin, module)]
    assert torch.equal(outs[1], outs[2])
    torch.testing.assert_close(outs[2], outs[0])
    for out in outs:
        out.square().sum().backward()
    for name, p in module.named_parameters():
        if name.startswith("grading."):
            assert torch.isfinite(p.grad).all()
            continue
        assert torch.equal(p.grad, twin.get_parameter(name).grad), name
        torch.testing.assert_close(p.grad, ref.get_parameter(name).grad)


def test_state_dicts_move_both_ways_between_graded_and_torch():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, batch_first=True)
    module = GradedMultiheadAttention(E, H, grading="exponential", grades=torch.rand(D),
                                      batch_first=True)
    assert not module.load_state_dict(ref.state_dict()).missing_keys
    back = nn.MultiheadAttention(E, H, batch_first=True)
    back.load_state_dict(module.torch_state_dict())
    assert torch.equal(back.in_proj_weight, ref.in_proj_weight)


def test_a_strict_load_still_refuses_missing_grades_of_other_modules():
    """Only the attention's own grades may be missing (a plain attention state dict): the
    missing grades of a sibling grading module, or a graded state dict that lacks part of
    the attention's grading, are refused by a strict load."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.grading = LinearGrading(E, torch.rand(E))  # loaded before the attention
            self.attn = GradedMultiheadAttention(E, H, grading="exponential",
                                                 grades=torch.rand(D))

    net = Net()
    partial = net.state_dict()
    del partial["grading.grades"]
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "grading.grades"'):
        net.load_state_dict(partial)
    partial = net.state_dict()
    del partial["attn.grading.base"]
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "attn.grading.base"'):
        net.load_state_dict(partial)
    plain = {k: v for k, v in net.state_dict().items() if not k.startswith("attn.grading.")}
    grades = net.attn.grading.grades.clone()
    assert not net.load_state_dict(plain).missing_keys
    assert torch.equal(net.attn.grading.grades, grades)


def test_one_fixed_grading_shared_by_attention_of_two_widths_grades_each_by_the_formula():
    """The row scales kept with fixed grades are the layout of the module that asks: a grading
    over head_dim passed to a 2-head and a 4-head module (packed rows of 3·8 and 3·16)."""
    torch.manual_seed(0)
    grading = ExponentialGrading(D, torch.rand(D, dtype=torch.float64))
    for heads in (H, 2 * H, H):
        module = GradedMultiheadAttention(heads * D, heads, grading=grading,
                                          batch_first=True).double()
        x = torch.randn(1, 5, heads * D, dtype=torch.float64)
        got, _ = module(x, x, x, need_weights=False)
        m = grading.scales().detach()
        w, b = module.in_proj_weight.detach(), module.in_proj_bias.detach()
        n = heads * D  # (heads, T, D) per-head queries, keys, values
        q, k, v = ((x[0] @ w[i * n:(i + 1) * n].T + b[i * n:(i + 1) * n])
                   .unflatten(-1, (heads, D)).transpose(0, 1) for i in range(3))
        q = q * m
        heads_out = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1) @ v
        want = module.out_proj(heads_out.transpose(0, 1).flatten(-2))
        torch.testing.assert_close(got[0], want)


def test_a_variant_set_on_a_built_module_grades_by_its_formula():
    """``variant`` is a plain attribute: after a pass as "scores" (the queries' rows folded),
    setting it to "values" grades the values, as the paper's formula (4) writes it."""
    torch.manual_seed(0)
    module = make("scores", "exponential", per_head_grades=False, learnable=False)
    x = torch.randn(5, E, dtype=torch.float64)
    module(x[None], x[None], x[None])
    module.variant = "values"
    got, _ = module(x[None], x[None], x[None], need_weights=False)
    scales = module.grading.scales().detach().expand(H, D)
    want = naive_graded_attention(module, x, x, scales, "values")
    torch.testing.assert_close(got[0], want.detach())


def test_grading_module_can_be_passed_in():
    g = LinearGrading(D, torch.ones(H, D), num_heads=H)
    m = GradedMultiheadAttention(E, H, grading=g, variant="multi_head")
    assert m.grading is g
    with pytest.raises(ValueError, match="acts on 3 features but head_dim is 4"):
        GradedMultiheadAttention(E, H, grading=ExponentialGrading(3))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown graded attention variant 'keys'"):
        GradedMultiheadAttention(E, H, variant="keys")
    with pytest.raises(ValueError, match="grading must be 'linear' or 'exponential', got 'log'"):
        GradedMultiheadAttention(E, H, grading="log")
    with pytest.raises(ValueError, match=r"multi_head' needs per-head grades"):
        GradedMultiheadAttention(E, H, variant="multi_head", grades=torch.ones(D))
    with pytest.raises(ValueError, match="q >= 0"):
        GradedMultiheadAttention(E, H, grading="exponential", grades=-torch.ones(D))


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
def test_graded_attention_composes_with_an_exact_backend(variant):
    """Grading scales q (or v) before the backend, so the exact chunked backend gives the
    fused kernel's result for every variant."""
    fused = make(variant, "exponential", per_head_grades=True, learnable=True)
    chunked = GradedMultiheadAttention(
        E, H, grading="exponential", grades=fused.grading.grades.detach().clone(),
        variant=variant, learnable_grades=True, batch_first=True, backend="chunked",
        backend_options={"query_chunk": 2, "key_chunk": 4},
    ).double()
    chunked.load_state_dict(fused.state_dict())
    x = torch.randn(2, 6, E, dtype=torch.float64)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    a, _ = fused(x, x, x, key_padding_mask=kpm, need_weights=False)
    b, _ = chunked(x, x, x, key_padding_mask=kpm, need_weights=False)
    torch.testing.assert_close(b, a)
    a.sum().backward()
    b.sum().backward()
    torch.testing.assert_close(chunked.grading.grades.grad, fused.grading.grades.grad)


def test_graded_lm_runs_on_a_linear_time_backend():
    from graded import TransformerConfig, TransformerLM

    cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_len=32,
                            grading="linear", learnable_grades=True, attn_backend="linear")
    lm = TransformerLM(cfg)
    x = torch.randint(0, 11, (2, 9))
    lm(x).sum().backward()
    grades = [m.grading.grades for m in lm.modules() if isinstance(m, GradedMultiheadAttention)]
    assert grades and all(torch.isfinite(g.grad).all() for g in grades)
