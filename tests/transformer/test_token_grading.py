"""Per-token grading (000 §6.2, Remark 6.16), Def 5.19's ReLU and Eq. 48's normalisation: the
stages through which grading changes the function class, each against a computation written
out token by token."""

import math

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.kinds import get_kind
from graded.tasks.dyck import DyckLM
from graded.train.recipes import get_recipe
from graded.transformer.graded import gradings
from graded.transformer.models import TransformerClassifier

D, V, T = 8, 11, 6


def config(**kw) -> TransformerConfig:
    base = dict(vocab_size=V, d_model=D, n_heads=2, n_layers=1, max_len=16, grading="exponential",
                grading_base=2.0, token_grading=True, grade_input=False, grade_positions=False,
                grade_attention=False, grade_ffn=False, grade_output=False)
    return TransformerConfig(**{**base, **kw})


def lm(**kw) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(config(**kw)).double().eval()


def ids_and_grades(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, V, (2, T), generator=gen),
            torch.randint(0, 4, (2, T), generator=gen).double())


def profile(model):
    (p,) = gradings(model, "token").values()
    return p


def naive_scales(grades, kind: str, p, base: float = 2.0):
    """diag M_{q_i} with q_i = s_i·p, entry by entry, from the profile p."""
    out = torch.empty(*grades.shape, D, dtype=torch.float64)
    for b in range(grades.shape[0]):
        for i in range(grades.shape[1]):
            for k in range(D):
                q = float(grades[b, i]) * float(p[k])
                out[b, i, k] = base ** q if kind == "exponential" else q + 1.0  # f = shift
    return out


@pytest.mark.parametrize("kind", ["exponential", "linear"])
def test_token_grading_matrices_equal_the_written_out_diagonals(kind):
    model = lm(grading=kind)
    ids, grades = ids_and_grades()
    p = profile(model).grades.detach()
    torch.testing.assert_close(p, torch.arange(D, dtype=torch.float64) / (D - 1), rtol=1e-7,
                               atol=0)  # the ramp, drawn in the default (float32) dtype
    got = model.decoder.scales_for(ids, grades)
    torch.testing.assert_close(got, naive_scales(grades, kind, p), rtol=1e-12, atol=0)


def test_each_stage_scales_each_token_by_its_own_matrix():
    """Input (before the positions), feed-forward (after Fnn) and output (before W_out), each
    compared with a loop over tokens on the model's own weights."""
    model = lm()
    ids, grades = ids_and_grades(1)
    m = naive_scales(grades, "exponential", profile(model).grades.detach())
    positions = torch.arange(T).expand(2, T)
    pe = model.decoder.embed.positions(positions, dtype=torch.float64)
    emb = model.decoder.embed(ids, positions, m)
    for b in range(2):
        for i in range(T):
            want = model.decoder.embed.tokens.weight[ids[b, i]] * m[b, i] + pe[b, i]
            torch.testing.assert_close(emb[b, i], want, rtol=1e-12, atol=1e-12)
    ff = model.decoder.stack.blocks[0].ff
    x = torch.randn(2, T, D, dtype=torch.float64)
    got = ff(x, m)
    for b in range(2):
        for i in range(T):
            torch.testing.assert_close(got[b, i], ff.ffn(x[b, i]) * m[b, i], rtol=1e-12,
                                       atol=1e-12)
    h, _ = model.decoder(ids, token_scales=m)
    logits = model(ids, token_grades=grades)
    w, bias = model.head.proj.weight, model.head.proj.bias
    for b in range(2):
        for i in range(T):
            want = w @ (h[b, i] * m[b, i]) + (0 if bias is None else bias)
            torch.testing.assert_close(logits[b, i], want, rtol=1e-10, atol=1e-12)


def test_zero_grades_give_the_ungraded_model_and_stages_can_be_chosen():
    model = lm()
    plain = TransformerLM(TransformerConfig(vocab_size=V, d_model=D, n_heads=2, n_layers=1,
                                            max_len=16)).double().eval()
    plain.load_state_dict(model.state_dict(), strict=False)
    ids, grades = ids_and_grades(2)
    torch.testing.assert_close(model(ids, token_grades=torch.zeros_like(grades)), plain(ids),
                               rtol=1e-12, atol=1e-12)
    only_input = lm(token_grade_stages=["input"])
    only_input.load_state_dict(model.state_dict(), strict=False)
    assert not only_input.decoder.stack.blocks[0].ff.per_token
    assert not only_input.head.per_token
    assert not torch.allclose(only_input(ids, token_grades=grades), model(ids, token_grades=grades))


def test_per_token_grading_is_not_a_reparametrisation():
    """One token id at grades 0 and 2 gets representations that are not multiples of each
    other coordinate-wise by a common factor: no fixed rescaling of the embedding (what a fixed
    grading amounts to) maps the token to both."""
    model = lm()
    ids = torch.full((1, 2), 3)
    grades = torch.tensor([[0.0, 2.0]], dtype=torch.float64)
    m = model.decoder.scales_for(ids, grades)
    x = model.decoder.embed.input_grading(model.decoder.embed.tokens(ids), m)
    ratio = (x[0, 1] / x[0, 0]).detach()
    assert ratio.max() / ratio.min() == pytest.approx(4.0)  # λ^{2·p}: from 1 to 2² = 4
    same = model(ids, token_grades=torch.zeros_like(grades))
    graded = model(ids, token_grades=grades)
    assert torch.allclose(same[0, 0], graded[0, 0])  # position 0: grade 0 both times
    assert not torch.allclose(same[0, 1], graded[0, 1])


def test_errors_name_what_was_expected():
    model = lm()
    ids, grades = ids_and_grades()
    with pytest.raises(ValueError, match=r"pass token_grades of shape .* = \(2, 6\)"):
        model(ids)
    with pytest.raises(ValueError, match=r"expected \(batch, length\) = \(2, 6\)"):
        model(ids, token_grades=grades[:, :3])
    with pytest.raises(ValueError, match=">= 0"):
        model(ids, token_grades=-grades - 1)
    with pytest.raises(ValueError, match="generate is refused for a token-graded model"):
        model.generate(ids, 2)
    plain = TransformerLM(TransformerConfig(vocab_size=V, d_model=D, n_heads=2, n_layers=1))
    with pytest.raises(ValueError, match="does not grade tokens"):
        plain(ids, token_grades=grades)
    with pytest.raises(ValueError, match=r"token_grading=True is invalid.*set grading"):
        TransformerConfig(vocab_size=V, d_model=D, n_heads=2, token_grading=True)
    with pytest.raises(ValueError, match="token_grade_stages"):
        config(token_grade_stages=[])
    with pytest.raises(ValueError, match=r"token_grade_stages.*'attention' is invalid"):
        config(token_grade_stages=["attention"])
    with pytest.raises(ValueError, match=r"grade_input_activation='tanh' is invalid"):
        config(grade_input_activation="tanh")
    with pytest.raises(ValueError, match=r"grading_f='identity' is invalid.*f\(0\) = 0"):
        config(grading="linear", grading_f="identity")


def test_def_5_19_relu_on_feature_and_token_inputs():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=None, input_dim=3, d_model=D, n_heads=2, n_layers=1,
                            max_len=16, grading="linear", input_grades=[0.0, 1.0, 2.0],
                            grade_input_activation="relu", grade_normalize=True)
    model = TransformerClassifier(cfg, num_outputs=1).double()
    x = torch.randn(2, T, 3, dtype=torch.float64)
    positions = torch.arange(T).expand(2, T)
    emb = model.encoder.embed
    got = emb(x, positions)
    pe = emb.positions(positions, dtype=torch.float64)
    for b in range(2):
        for i in range(T):
            mx = x[b, i] * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)  # f(q) = q + 1
            mx = mx / mx.norm()
            want = torch.relu(emb.tokens.weight @ mx + emb.tokens.bias) + pe[b, i]
            torch.testing.assert_close(got[b, i], want, rtol=1e-12, atol=1e-12)
    model = lm(grade_input_activation="relu", token_grading=False, grade_input=True)
    emb = model.decoder.embed
    ids, _ = ids_and_grades()
    got = emb(ids, positions)
    pe = emb.positions(positions, dtype=torch.float64)
    want = torch.relu(emb.input_map(emb.tokens.weight[ids])) + pe
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_eq_48_normalises_after_the_graded_positions():
    model = lm(token_grading=False, grade_positions=True, grade_position_alpha=0.1,
               grade_position_normalize=True)
    emb = model.decoder.embed
    ids, _ = ids_and_grades()
    positions = torch.arange(T).expand(2, T)
    got = emb(ids, positions)
    for b in range(2):
        for t in range(T):
            pe = emb.positions(positions, dtype=torch.float64)[b, t] * 2.0 ** (-0.1 * t)
            z = emb.tokens.weight[ids[b, t]] + pe
            torch.testing.assert_close(got[b, t], z / z.norm(), rtol=1e-12, atol=1e-12)
            assert math.isclose(float(got[b, t].detach().norm()), 1.0, rel_tol=1e-12)


def sinusoid(t: int) -> torch.Tensor:
    """Pe(t, 2i) = sin(t/10000^{2i/d}), Pe(t, 2i+1) = cos(…) (000 Def 5.21), written out."""
    pe = torch.empty(D, dtype=torch.float64)
    for i in range(D // 2):
        pe[2 * i] = math.sin(t / 10000 ** (2 * i / D))
        pe[2 * i + 1] = math.cos(t / 10000 ** (2 * i / D))
    return pe


def test_the_whole_token_input_stage_in_the_order_of_000_section_6_2():
    """x' = M_q M_{q_i} E[t_i] (a non-neutral feature grading and the per-token one),
    x'' = x'/‖x'‖, h = ReLU(W x'' + b), z = h + λ^{−αt} Pe(t), z' = z/‖z‖ (Eq. 48), token by
    token from the model's weights, the grades and the sinusoids written out."""
    model = lm(grade_input=True, grade_init="warm_start", grade_init_value=0.125,
               grade_normalize=True, grade_input_activation="relu", grade_positions=True,
               grade_position_alpha=0.05, grade_position_normalize=True)
    emb = model.decoder.embed
    ids, grades = ids_and_grades(5)
    p = profile(model).grades.detach()
    got = emb(ids, torch.arange(T).expand(2, T), model.decoder.scales_for(ids, grades))
    w, bias = emb.input_map.weight.detach(), emb.input_map.bias.detach()
    for b in range(2):
        for t in range(T):
            x = emb.tokens.weight[ids[b, t]].detach().clone()
            for k in range(D):
                x[k] *= 2.0 ** (0.125 * k) * 2.0 ** (float(grades[b, t]) * float(p[k]))
            x = x / x.norm()
            z = torch.relu(w @ x + bias) + 2.0 ** (-0.05 * t) * sinusoid(t)
            torch.testing.assert_close(got[b, t], z / z.norm(), rtol=1e-12, atol=1e-12)


def test_feature_inputs_grade_each_token_after_the_projection_and_its_relu():
    """Over real features the input grading acts on the raw features and M_{q_i} (over
    d_model) on h = ReLU(W x'' + b), before the positions are added."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=None, input_dim=3, d_model=D, n_heads=2, n_layers=1,
                            max_len=16, grading="exponential", input_grades=[0.0, 1.0, 2.0],
                            grade_input_activation="relu", token_grading=True,
                            grade_attention=False, grade_ffn=False, grade_output=False)
    model = TransformerClassifier(cfg, num_outputs=1).double()
    emb = model.encoder.embed
    x = torch.randn(2, T, 3, dtype=torch.float64)
    _, grades = ids_and_grades(6)
    p = profile(model).grades.detach()
    got = emb(x, torch.arange(T).expand(2, T), model.encoder.token_grading(grades, 2, T))
    for b in range(2):
        for t in range(T):
            mx = x[b, t] * torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)  # λ^q
            h = torch.relu(emb.tokens.weight @ mx + emb.tokens.bias)
            m = torch.tensor([2.0 ** (float(grades[b, t]) * float(p[k])) for k in range(D)],
                             dtype=torch.float64)
            torch.testing.assert_close(got[b, t], h * m + sinusoid(t), rtol=1e-12, atol=1e-12)


def test_graded_and_normalised_ffn_with_per_token_matrices():
    """000 Eq. 91 with token i's matrix: h' = M_q M_{q_i} Fnn(x) / ‖…‖."""
    model = lm(grade_ffn=True, grade_init="warm_start", grade_init_value=0.125,
               grade_normalize=True, token_grade_stages=["ffn"])
    ids, grades = ids_and_grades(7)
    ff = model.decoder.stack.blocks[0].ff
    x = torch.randn(2, T, D, dtype=torch.float64)
    got = ff(x, model.decoder.scales_for(ids, grades))
    p = profile(model).grades.detach()
    for b in range(2):
        for i in range(T):
            y = ff.ffn(x[b, i]).detach().clone()
            for k in range(D):
                y[k] *= 2.0 ** (0.125 * k) * 2.0 ** (float(grades[b, i]) * float(p[k]))
            torch.testing.assert_close(got[b, i], y / y.norm(), rtol=1e-12, atol=1e-12)


def test_the_task_kinds_pass_token_grades_to_token_graded_models_only():
    torch.manual_seed(0)
    model = TransformerClassifier(config(), num_outputs=3).double().eval()
    ids, grades = ids_and_grades(8)
    batch = {"inputs": ids, "token_grades": grades}
    kind = get_kind("classification")
    torch.testing.assert_close(kind.forward(model, batch), model(ids, token_grades=grades))
    plain = TransformerClassifier(TransformerConfig(vocab_size=V, d_model=D, n_heads=2,
                                                    n_layers=1), num_outputs=3)
    assert kind.forward(plain, batch).shape == (2, 3)  # the grades stay in the batch


def test_a_token_graded_lm_trains_through_its_task_kind_and_learns_its_profile():
    task = DyckLM(k=2, max_length=12)
    data = task.generate(16, seed=0)
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(vocab_size=len(task.vocab), d_model=16, n_heads=2,
                                            n_layers=1, max_len=16, grading="exponential",
                                            token_grading=True, learnable_grades=True))
    kind = get_kind("lm")
    batch = dict(data.tensors)
    loss = kind.loss(model, batch)
    (loss.total / loss.count).backward()
    token_profile = profile(model)
    assert float(token_profile.grades.grad.abs().sum()) > 0
    recipe = get_recipe("egt-alg7.1")
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-2, weight_decay=0.0))
    recipe.on_step(model, opt, 0, 10)  # anneals λ on the profile too
    assert float(token_profile.base) == pytest.approx(1.0 + (2.0 - 1.0) * 1 / 10)
    without = dict(batch)
    del without["token_grades"]
    with pytest.raises(ValueError, match="batch has no 'token_grades'"):
        kind.loss(model, without)


def test_seq2seq_grades_source_and_target_tokens_separately():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(config()).double().eval()
    src, src_grades = ids_and_grades(3)
    tgt, tgt_grades = ids_and_grades(4)
    out = model(src, tgt[:, :4], token_grades=src_grades, decoder_token_grades=tgt_grades[:, :4])
    assert out.shape == (2, 4, V)
    other = model(src, tgt[:, :4], token_grades=src_grades + 1,
                  decoder_token_grades=tgt_grades[:, :4])
    assert not torch.allclose(out, other)
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        model(src, tgt[:, :4], token_grades=src_grades)
