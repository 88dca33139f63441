"""The graded transformer's stages, end to end, against a naive recomputation from 000's formulas.

A two-layer LGT/EGT language model with every stage switched on is recomputed with scalar loops
from its parameters and the papers' formulas alone (no library function in the reference):

- input (000 Def 5.19, §6.2): x' = M x on the token embedding, x'' = x'/‖x'‖;
- per-token grading (000 §6.2, Remark 6.16): M_{q_i} with q_i = s_i·p, before the normalisation;
- positions (000 Def 5.21 / Eq. 47, §6.2): Pe(t, 2i) = sin(t/10000^{2i/d}),
  Pe(t, 2i+1) = cos(t/10000^{2i/d}), scaled by 1 − α t (LGT) or λ^{−α t} (EGT);
  z = x'' + Pe', z' = z/‖z‖ (Eq. 48);
- attention (000 Def 5.13 / 6.4, Def 5.22 (1)-(4)) per head, causal;
- feed-forward (000 Def 5.23 / 6.15, Eq. 53/91): Fnn'(x) = M Fnn(x), h' = Fnn'/‖Fnn'‖;
- output (Eq. 54/92): z = W_out (M h) + b_out.

The transformer around the stages is the library's documented pre-norm block (LayerNorm before
each sublayer, residual after it, a final LayerNorm), as in 000 §4 with the GPT-2 placement; the
reference writes it out too.
"""

import math

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.transformer.graded import gradings

F64 = torch.float64
D, H, V, T = 6, 2, 7, 5
DK = D // H
ALPHA = 0.05


def scale(kind: str, q: float, base: float = 2.0) -> float:
    """m(q): λ^q (EGT, 000 Eq. 33) or f(q) = q + 1 (LGT with f = "shift", SPEC C5)."""
    return base**q if kind == "exponential" else q + 1.0


def position_factor(kind: str, t: int, base: float = 2.0) -> float:
    """1 − α t (000 Eq. 47) or λ^{−α t} (000 §6.2)."""
    return 1.0 - ALPHA * t if kind == "linear" else base ** (-ALPHA * t)


def pe(t: int, i: int) -> float:
    """000 Def 5.21: Pe(t, 2i) = sin(t/10000^{2i/d}), Pe(t, 2i+1) = cos(t/10000^{2i/d})."""
    w = t / 10000 ** (2 * (i // 2) / D)
    return math.sin(w) if i % 2 == 0 else math.cos(w)


def unit(x: list[float]) -> list[float]:
    n = math.sqrt(sum(v * v for v in x))
    return [v / n for v in x]


def layer_norm(x: list[float], ln: torch.nn.LayerNorm) -> list[float]:
    mu = sum(x) / len(x)
    var = sum((v - mu) ** 2 for v in x) / len(x)
    w, b = ln.weight.tolist(), ln.bias.tolist()
    return [(v - mu) / math.sqrt(var + ln.eps) * w[k] + b[k] for k, v in enumerate(x)]


def affine(w: torch.Tensor, b: torch.Tensor | None, x: list[float]) -> list[float]:
    """W x + b for an nn.Linear's weight (out, in)."""
    rows = w.tolist()
    bias = b.tolist() if b is not None else [0.0] * len(rows)
    return [sum(r[c] * x[c] for c in range(len(x))) + bias[o] for o, r in enumerate(rows)]


def naive_inputs(embed, ids: list[int], kind: str, m: list[float],
                 token_s: list[float] | None = None, profile: list[float] | None = None
                 ) -> list[list[float]]:
    """Def 5.19 and Eqs. 47-48 (§6.2 for EGT), token by token: z'_t of each position t."""
    emb = embed.tokens.weight.detach()
    z = []
    for t, tok in enumerate(ids):
        x = [m[k] * float(emb[tok, k]) for k in range(D)]  # x' = M x
        if token_s is not None:  # M_{q_t}, q_t = s_t·p
            x = [x[k] * scale(kind, token_s[t] * profile[k]) for k in range(D)]
        x = unit(x)  # x'' (Def 5.19)
        zt = [x[k] + position_factor(kind, t) * pe(t, k) for k in range(D)]  # Eq. 47/48
        z.append(unit(zt))  # z' (Eq. 48)
    return z


def naive_attention(attn, xq: list[list[float]], xkv: list[list[float]], mh: list[list[float]],
                    variant: str, causal: bool) -> list[list[float]]:
    """Def 5.22 (1)-(4) / Eqs. 87-90 per head with the head's scales ``mh[h]``, then W^O."""
    w_in, b_in = attn.in_proj_weight.detach(), attn.in_proj_bias.detach()
    q = [affine(w_in[:D], b_in[:D], x) for x in xq]
    k = [affine(w_in[D:2 * D], b_in[D:2 * D], x) for x in xkv]
    v = [affine(w_in[2 * D:], b_in[2 * D:], x) for x in xkv]
    heads = [[0.0] * D for _ in q]
    for h in range(H):
        g = mh[h]
        sl = range(h * DK, (h + 1) * DK)
        for i in range(len(q)):
            keys = range(i + 1) if causal else range(len(k))
            scores = []
            for j in keys:
                if variant in ("scores", "multi_head"):  # Eq. 49: Σ_c m_c q_ic k_jc
                    s = sum(g[c - h * DK] * q[i][c] * k[j][c] for c in sl)
                elif variant == "queries_keys":  # Eq. 50: Q' = M Q, K' = M K
                    s = sum((g[c - h * DK] * q[i][c]) * (g[c - h * DK] * k[j][c]) for c in sl)
                else:  # values, Eq. 52: ungraded scores
                    s = sum(q[i][c] * k[j][c] for c in sl)
                scores.append(s / math.sqrt(DK))
            top = max(scores)
            e = [math.exp(s - top) for s in scores]
            for j in keys:
                for c in sl:
                    vj = v[j][c] * (g[c - h * DK] if variant == "values" else 1.0)  # Eq. 52
                    heads[i][c] += e[j] / sum(e) * vj
    out = attn.out_proj
    return [affine(out.weight.detach(), out.bias.detach(), hv) for hv in heads]


def naive_ffn(ffn, x: list[float], m: list[float]) -> list[float]:
    """Eq. 53/91: Fnn(x) = ReLU(x W_1 + b_1) W_2 + b_2, Fnn' = M Fnn, h' = Fnn'/‖Fnn'‖."""
    hid = [max(0.0, u) for u in affine(ffn.fc_in.weight.detach(), ffn.fc_in.bias.detach(), x)]
    fnn = affine(ffn.fc_out.weight.detach(), ffn.fc_out.bias.detach(), hid)
    return unit([m[c] * fnn[c] for c in range(D)])


def naive_stack(stack, z: list[list[float]], m: list[float], mhs, variant: str, causal: bool,
                memory: list[list[float]] | None = None, cross_mhs=None) -> list[list[float]]:
    """Pre-norm blocks x + Sublayer(LN(x)), then the final LayerNorm."""
    add = lambda a, b: [u + w for u, w in zip(a, b)]  # noqa: E731
    for r, block in enumerate(stack.blocks):
        a = [layer_norm(x, block.res_attn.norm) for x in z]
        z = [add(x, y) for x, y in zip(z, naive_attention(block.self_attn.attn, a, a, mhs[r],
                                                          variant, causal))]
        if memory is not None:
            a = [layer_norm(x, block.res_cross.norm) for x in z]
            z = [add(x, y) for x, y in zip(z, naive_attention(block.cross_attn.attn, a, memory,
                                                              cross_mhs[r], variant, False))]
        z = [add(x, naive_ffn(block.ff.ffn, layer_norm(x, block.res_ff.norm), m)) for x in z]
    return [layer_norm(x, stack.final_norm) for x in z]


def naive_lm(model: TransformerLM, ids: list[int], kind: str, feature_q: list[float],
             head_q: list[list[list[float]]], variant: str, token_s: list[float] | None = None,
             profile: list[float] | None = None) -> torch.Tensor:
    """Logits (T, V) of the graded LM by the formulas of the module docstring; ``head_q`` holds
    one (heads, d_k) grade tuple per layer."""
    m = [scale(kind, q) for q in feature_q]
    mhs = [[[scale(kind, q) for q in row] for row in layer] for layer in head_q]
    dec = model.decoder
    z = naive_inputs(dec.embed, ids, kind, m, token_s, profile)
    final = naive_stack(dec.stack, z, m, mhs, variant, causal=True)
    w_out = model.head.proj.weight.detach()  # tied to the embedding
    logits = [affine(w_out, None, [m[c] * hv[c] for c in range(D)]) for hv in final]  # Eq. 54
    return torch.tensor(logits, dtype=F64)


def build(kind: str, variant: str, *, fold: bool, token: bool = False) -> TransformerLM:
    config = TransformerConfig(
        vocab_size=V, d_model=D, n_heads=H, n_layers=2, max_len=8, d_ff=10, activation="relu",
        grading=kind, grading_base=2.0, grading_f="shift", grade_normalize=True,
        grade_position_alpha=ALPHA, grade_position_normalize=True,
        grade_attention_variant=variant, grades_per_head=True, fold_grading=fold,
        token_grading=token, token_grade_stages=["input"] if token else ["input", "ffn",
                                                                          "output"],
    )
    torch.manual_seed(0)
    return TransformerLM(config).double().eval()


FEATURE_Q = [0.0, 0.3, 0.6, 1.0, 1.4, 2.0]
HEAD_Q = [[[0.0, 0.5, 1.5], [1.2, 0.4, 0.0]], [[0.9, 0.0, 0.3], [0.0, 1.7, 0.6]]]  # per layer


def set_grades(model: TransformerLM, profile: list[float] | None = None) -> None:
    """The feature grades, each attention layer's own per-head grades, the token profile."""
    blocks = model.decoder.stack.blocks
    assert len(blocks) == len(HEAD_Q)
    with torch.no_grad():
        for g in gradings(model).values():
            if g.role == "feature":
                g.grades.copy_(torch.tensor(FEATURE_Q, dtype=F64))
            elif g.role == "token":
                g.grades.copy_(torch.tensor(profile, dtype=F64))
        for block, q in zip(blocks, HEAD_Q):
            block.self_attn.attn.grading.grades.copy_(torch.tensor(q, dtype=F64))


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_every_stage_of_a_graded_lm_is_its_formula(kind, variant):
    """000 Defs 5.19, 5.21, 5.22, 5.23 (LGT) and §6.2, Def 6.15 (EGT), each attention layer
    with its own per-head grades (Def 5.13's M_q^i of head i in layer l), folded into the weights
    (the default) and on the activations: the logits of the naive recomputation."""
    ids = [3, 0, 6, 1, 3]
    for fold in (True, False):
        model = build(kind, variant, fold=fold)
        set_grades(model)
        got = model(torch.tensor([ids]))[0].detach()
        want = naive_lm(model, ids, kind, FEATURE_Q, HEAD_Q, variant)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_per_token_input_grading_is_m_of_s_times_the_profile(kind):
    """000 §6.2: token i has its own M_{q_i}; q_i = s_i·p (SPEC C5), applied with the feature
    grading before the normalisation of Def 5.19."""
    ids, s = [2, 5, 5, 0, 4], [0.0, 1.0, 2.0, 0.5, 3.0]
    profile = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    model = build(kind, "scores", fold=True, token=True)
    set_grades(model, profile)
    got = model(torch.tensor([ids]), token_grades=torch.tensor([s], dtype=F64))[0].detach()
    want = naive_lm(model, ids, kind, FEATURE_Q, HEAD_Q, "scores", token_s=s, profile=profile)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_lgt_and_egt_are_the_transformer_on_the_graded_inputs_def_5_1_and_6_1(kind):
    """000 Def 5.1 / 6.1: Ψ_q(X) = T(M x_1, …, M x_n). With only the input stage graded, the
    graded LM equals the ungraded LM (same weights) fed the embeddings M·E[t]: here the
    ungraded twin's embedding rows rescaled by m, untied from its readout."""
    base = dict(vocab_size=V, d_model=D, n_heads=H, n_layers=2, max_len=8, d_ff=10,
                tie_embeddings=False)
    torch.manual_seed(0)
    graded = TransformerLM(TransformerConfig(
        **base, grading=kind, grade_positions=False, grade_attention=False, grade_ffn=False,
        grade_output=False)).double().eval()
    with torch.no_grad():
        gradings(graded, "feature").popitem()[1].grades.copy_(torch.tensor(FEATURE_Q, dtype=F64))
    plain = TransformerLM(TransformerConfig(**base)).double().eval()
    plain.load_state_dict({k: v for k, v in graded.state_dict().items()
                           if "grading" not in k})
    m = torch.tensor([scale(kind, q) for q in FEATURE_Q], dtype=F64)
    with torch.no_grad():
        plain.decoder.embed.tokens.weight.mul_(m)
    ids = torch.tensor([[1, 4, 4, 0, 6]])
    torch.testing.assert_close(graded(ids), plain(ids), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values"])
@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_graded_seq2seq_is_the_formulas_in_encoder_and_decoder(kind, variant):
    """The encoder-decoder shape (SPEC C5: LGT/EGT as every C4 shape): the graded input,
    positions and FFN stages in both stacks (one shared feature grading), bidirectional graded
    self-attention in the encoder, causal graded self-attention and graded cross-attention (each
    with its own grades) in the decoder, the graded output."""
    config = TransformerConfig(
        vocab_size=V, d_model=D, n_heads=H, n_layers=1, max_len=8, d_ff=10, activation="relu",
        grading=kind, grading_base=2.0, grade_normalize=True, grade_position_alpha=ALPHA,
        grade_position_normalize=True, grade_attention_variant=variant, grades_per_head=True)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(config).double().eval()
    enc_q, self_q, cross_q = HEAD_Q[0], HEAD_Q[1], [[0.4, 0.4, 0.0], [2.0, 0.1, 0.8]]
    with torch.no_grad():
        gradings(model, "feature").popitem()[1].grades.copy_(torch.tensor(FEATURE_Q, dtype=F64))
        for attn, q in ((model.encoder.stack.blocks[0].self_attn.attn, enc_q),
                        (model.decoder.stack.blocks[0].self_attn.attn, self_q),
                        (model.decoder.stack.blocks[0].cross_attn.attn, cross_q)):
            attn.grading.grades.copy_(torch.tensor(q, dtype=F64))
    src, tgt = [4, 1, 6, 2], [0, 5, 3]
    got = model(torch.tensor([src]), torch.tensor([tgt]))[0].detach()
    m = [scale(kind, q) for q in FEATURE_Q]
    ms = [[[scale(kind, q) for q in row] for row in tup] for tup in (enc_q, self_q, cross_q)]
    memory = naive_stack(model.encoder.stack, naive_inputs(model.encoder.embed, src, kind, m), m,
                         [ms[0]], variant, causal=False)
    final = naive_stack(model.decoder.stack, naive_inputs(model.decoder.embed, tgt, kind, m), m,
                        [ms[1]], variant, causal=True, memory=memory, cross_mhs=[ms[2]])
    w_out = model.head.proj.weight.detach()
    want = torch.tensor([affine(w_out, None, [m[c] * hv[c] for c in range(D)]) for hv in final],
                        dtype=F64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
