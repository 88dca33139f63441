"""Graded attention (000 Def 5.13 / Eqs. 41-43, Def 6.4 / Eqs. 72-74, Def 5.22 / Eqs. 49-52 and
§6.2 / Eqs. 87-90) against scalar loops whose grading scales are written out from the grades:
λ^q (EGT) and f(q) (LGT) are computed here with ``math``, never read from the grading module
(``tests/attention/test_graded_attention.py`` checks the variants against the module's own
scales). The attention weights the module returns are checked as well as its outputs.
"""

import math

import pytest
import torch

from graded.attention.graded import GradedMultiheadAttention

F64 = torch.float64
E, H, DK = 6, 2, 3
GRADES = [[0.0, 0.7, 1.6], [1.1, 0.0, 0.4]]  # one tuple per head, Def 6.4's q_i


def f_of(name: str, q: float) -> float:
    """LGT f (SPEC C5, 000 Ex. 5.4/5.38): q + 1, |q| + 1, log(1 + e^q), q."""
    return {"shift": q + 1.0, "abs_shift": abs(q) + 1.0, "softplus": math.log1p(math.exp(q)),
            "identity": q}[name]


def naive(module: GradedMultiheadAttention, xq: torch.Tensor, xkv: torch.Tensor,
          scales: list[list[float]], variant: str, causal: bool = False):
    """(outputs (Tq, E), weights (H, Tq, Tk)) of one sequence, by Eqs. 41/72 (scores), 50/88
    (queries/keys), 52/90 (values), with the per-head diagonal ``scales``."""
    w, b = module.in_proj_weight.detach().tolist(), module.in_proj_bias.detach().tolist()

    def proj(x, part):
        rows = range(part * E, (part + 1) * E)
        return [[sum(w[r][c] * float(x[t, c]) for c in range(E)) + b[r] for r in rows]
                for t in range(x.shape[0])]

    q, k, v = proj(xq, 0), proj(xkv, 1), proj(xkv, 2)
    tq, tk = len(q), len(k)
    heads = [[0.0] * E for _ in range(tq)]
    weights = torch.zeros(H, tq, tk, dtype=F64)
    for h in range(H):
        m = scales[h]
        cols = range(h * DK, (h + 1) * DK)
        for i in range(tq):
            s = []
            for j in range(tk):
                if causal and j > i:
                    s.append(-math.inf)
                elif variant in ("scores", "multi_head"):  # Σ_c λ^{q_hc} q_ic k_jc (Eq. 74)
                    s.append(sum(m[c - h * DK] * q[i][c] * k[j][c] for c in cols) / math.sqrt(DK))
                elif variant == "queries_keys":  # (M q_i)·(M k_j) (Eq. 50/88)
                    s.append(sum(m[c - h * DK] * q[i][c] * m[c - h * DK] * k[j][c]
                                 for c in cols) / math.sqrt(DK))
                else:  # values: α from the plain q_iᵀk_j (Eq. 52/90)
                    s.append(sum(q[i][c] * k[j][c] for c in cols) / math.sqrt(DK))
            top = max(s)
            e = [math.exp(x - top) for x in s]
            for j in range(tk):
                a = e[j] / sum(e)
                weights[h, i, j] = a
                for c in cols:
                    vj = v[j][c] * (m[c - h * DK] if variant == "values" else 1.0)  # M v_j
                    heads[i][c] += a * vj
    wo, bo = module.out_proj.weight.detach().tolist(), module.out_proj.bias.detach().tolist()
    out = [[sum(wo[r][c] * heads[i][c] for c in range(E)) + bo[r] for r in range(E)]
           for i in range(tq)]
    return torch.tensor(out, dtype=F64), weights


def build(grading: str, variant: str, fold: bool, **kw) -> GradedMultiheadAttention:
    torch.manual_seed(0)
    return GradedMultiheadAttention(E, H, grading=grading, grades=torch.tensor(GRADES, dtype=F64),
                                    variant=variant, fold_grading=fold, batch_first=True,
                                    dtype=F64, **kw)


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
def test_head_specific_egt_attention_is_def_6_4_with_lambda_to_the_q(variant, fold):
    """000 Def 6.4, Eq. 73: M_{q_i,λ} = diag(λ^{q_i,0}, …) per head, λ = 3; Eqs. 87-90 for the
    variants. Outputs and the per-head weights α_ij (smax of Eq. 72's scores)."""
    module = build("exponential", variant, fold, base=3.0)
    torch.manual_seed(1)
    x = torch.randn(1, 5, E, dtype=F64)
    got, weights = module(x, x, x, need_weights=True, average_attn_weights=False)
    scales = [[3.0**q for q in row] for row in GRADES]
    want, want_w = naive(module, x[0], x[0], scales, variant)
    torch.testing.assert_close(got[0].detach(), want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(weights[0].detach(), want_w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("f", ["shift", "abs_shift", "softplus", "identity"])
@pytest.mark.parametrize("variant", ["scores", "values"])
def test_linearly_graded_attention_is_def_5_13_with_f_of_the_grades(f, variant):
    """000 Def 5.13, Eqs. 41-43: M_q^i = diag(f(q_i,0), …), f one of SPEC C5's maps; with
    negative grades for |q| + 1 and softplus, positive ones for the identity."""
    grades = [[g + 0.2 for g in row] for row in GRADES] if f == "identity" else (
        [[-1.3, 0.7, 1.6], [1.1, -0.4, 0.0]] if f in ("abs_shift", "softplus") else GRADES)
    torch.manual_seed(0)
    module = GradedMultiheadAttention(E, H, grading="linear", f=f,
                                      grades=torch.tensor(grades, dtype=F64), variant=variant,
                                      batch_first=True, dtype=F64)
    torch.manual_seed(2)
    x = torch.randn(1, 4, E, dtype=F64)
    got, weights = module(x, x, x, need_weights=True, average_attn_weights=False)
    want, want_w = naive(module, x[0], x[0], [[f_of(f, q) for q in row] for row in grades],
                         variant)
    torch.testing.assert_close(got[0].detach(), want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(weights[0].detach(), want_w, rtol=1e-10, atol=1e-10)


def test_causal_cross_length_graded_attention_and_head_averaged_weights():
    """Eq. 72 with a causal mask (000 Def 4.13, the masked variant) on a graded module; the
    weights averaged over heads are the mean of the per-head α_ij (torch's convention)."""
    module = build("exponential", "scores", True, base=2.0)
    torch.manual_seed(3)
    x = torch.randn(2, 5, E, dtype=F64)
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    got, avg = module(x, x, x, attn_mask=mask, need_weights=True)
    scales = [[2.0**q for q in row] for row in GRADES]
    for b in range(2):
        want, want_w = naive(module, x[b], x[b], scales, "scores", causal=True)
        torch.testing.assert_close(got[b].detach(), want, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(avg[b].detach(), want_w.mean(0), rtol=1e-10, atol=1e-10)


def test_egt_graded_scores_are_the_positive_definite_form_of_eq_74():
    """000 Eq. 74 / 001 Prop 3.2: ⟨x, x⟩_{q,λ} = Σ_k λ^{q_k} x_k² > 0 for x ≠ 0. With the
    queries equal to the keys (the same projection) the diagonal of the graded score matrix
    before scaling, s_ii·√d_k, is that form of q_i, written out."""
    module = build("exponential", "scores", True, base=2.0)
    with torch.no_grad():
        module.in_proj_weight[E:2 * E] = module.in_proj_weight[:E]
        module.in_proj_bias[E:2 * E] = module.in_proj_bias[:E]
    torch.manual_seed(4)
    x = torch.randn(1, 4, E, dtype=F64)
    _, weights = module(x, x, x, need_weights=True, average_attn_weights=False)
    q = x[0] @ module.in_proj_weight[:E].detach().T + module.in_proj_bias[:E].detach()
    for h in range(H):
        form = [sum(2.0 ** GRADES[h][c] * float(q[i, h * DK + c]) ** 2 for c in range(DK))
                for i in range(4)]
        assert all(v > 0 for v in form)
        # the row softmax of the forms: log α_ij − log α_ii = (s_ij − s_ii)
        for i in range(4):
            cross = [sum(2.0 ** GRADES[h][c] * float(q[i, h * DK + c] * q[j, h * DK + c])
                         for c in range(DK)) for j in range(4)]
            logits = torch.tensor(cross, dtype=F64) / math.sqrt(DK)
            assert cross[i] == pytest.approx(form[i], rel=1e-12)
            torch.testing.assert_close(weights[0, h, i].detach(), torch.softmax(logits, 0),
                                       rtol=1e-10, atol=1e-10)


def naive_general(wq, bq, wk, bk, wv, bv, wo, bo, xq, xk, xv, heads, kv_heads, scales, variant,
                  pad=None):
    """Eqs. 72/88/90 with separate projections (kdim, vdim) and grouped keys/values: query head
    h reads key/value head h // (heads / kv_heads); ``scales`` (heads, d_k) are the query
    head's grades (000 Def 6.4: M_{q_h} belongs to head h). ``pad``: keys left out."""
    dk = wq.shape[0] // heads
    q = [affine_rows(wq, bq, x) for x in xq]
    k = [affine_rows(wk, bk, x) for x in xk]
    v = [affine_rows(wv, bv, x) for x in xv]
    out = [[0.0] * wq.shape[0] for _ in q]
    for h in range(heads):
        g = h // (heads // kv_heads)
        m = scales[h]
        for i in range(len(q)):
            s = []
            for j in range(len(k)):
                if pad is not None and pad[j]:
                    s.append(-math.inf)
                    continue
                qi = [q[i][h * dk + c] for c in range(dk)]
                kj = [k[j][g * dk + c] for c in range(dk)]
                if variant == "scores":
                    s.append(sum(m[c] * qi[c] * kj[c] for c in range(dk)) / math.sqrt(dk))
                elif variant == "queries_keys":
                    s.append(sum(m[c] * qi[c] * m[c] * kj[c] for c in range(dk)) / math.sqrt(dk))
                else:
                    s.append(sum(qi[c] * kj[c] for c in range(dk)) / math.sqrt(dk))
            top = max(s)
            e = [math.exp(x - top) for x in s]
            for j in range(len(k)):
                for c in range(dk):
                    vj = v[j][g * dk + c] * (m[c] if variant == "values" else 1.0)
                    out[i][h * dk + c] += e[j] / sum(e) * vj
    return torch.tensor([affine_rows(wo, bo, o) for o in out], dtype=F64)


def affine_rows(w, b, x):
    w, b = w.detach().tolist(), b.detach().tolist()
    return [sum(r[c] * float(x[c]) for c in range(len(r))) + b[o] for o, r in enumerate(w)]


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values"])
def test_per_head_grades_under_grouped_query_attention_are_each_query_heads_own(variant):
    """Def 6.4 per head with grouped-query attention (4 query heads, 2 key/value heads): head h
    grades with its own tuple q_h, also the key or value it shares with the other head of its
    group."""
    heads, kv_heads, dk = 4, 2, 2
    e = heads * dk
    grades = [[0.0, 1.0], [1.5, 0.2], [0.7, 0.0], [0.3, 1.2]]
    torch.manual_seed(0)
    module = GradedMultiheadAttention(e, heads, grading="exponential", base=2.0,
                                      grades=torch.tensor(grades, dtype=F64), variant=variant,
                                      num_kv_heads=kv_heads, batch_first=True, dtype=F64)
    torch.manual_seed(5)
    x = torch.randn(1, 4, e, dtype=F64)
    got, _ = module(x, x, x, need_weights=False)
    w, b = module.in_proj_weight, module.in_proj_bias
    kv = kv_heads * dk
    want = naive_general(w[:e], b[:e], w[e:e + kv], b[e:e + kv], w[e + kv:], b[e + kv:],
                         module.out_proj.weight, module.out_proj.bias, x[0], x[0], x[0], heads,
                         kv_heads, [[2.0**q for q in row] for row in grades], variant)
    torch.testing.assert_close(got[0].detach(), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values"])
def test_graded_cross_attention_with_other_key_and_value_widths_and_padding(variant):
    """Eqs. 72/88/90 with kdim ≠ vdim ≠ embed_dim (separate projections) and a key padding
    mask: the grading acts on head_dim after the projections, whatever they read."""
    grades = torch.tensor(GRADES, dtype=F64)
    torch.manual_seed(0)
    module = GradedMultiheadAttention(E, H, grading="exponential", base=2.0, grades=grades,
                                      variant=variant, kdim=4, vdim=5, batch_first=True,
                                      dtype=F64)
    torch.manual_seed(6)
    xq, xk, xv = (torch.randn(1, 3, E, dtype=F64), torch.randn(1, 5, 4, dtype=F64),
                  torch.randn(1, 5, 5, dtype=F64))
    pad = torch.tensor([[False, False, True, False, True]])
    got, _ = module(xq, xk, xv, key_padding_mask=pad, need_weights=False)
    b = module.in_proj_bias
    want = naive_general(module.q_proj_weight, b[:E], module.k_proj_weight, b[E:2 * E],
                         module.v_proj_weight, b[2 * E:], module.out_proj.weight,
                         module.out_proj.bias, xq[0], xk[0], xv[0], H, H,
                         [[2.0**q for q in row] for row in GRADES], variant, pad=pad[0].tolist())
    torch.testing.assert_close(got[0].detach(), want, rtol=1e-10, atol=1e-10)
