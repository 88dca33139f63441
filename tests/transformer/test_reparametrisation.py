"""A fixed diagonal grading next to a linear map is a reparametrisation (see
docs/what_grading_changes.md).

For each stage the graded model is compared with an UNGRADED model whose weights are rescaled
here by hand, from the grades alone (m = λ^q for EGT, m = q + 1 for LGT's f = "shift"), without
the library's grading code: the outputs agree to float64 rounding. The normalised input of 000
Def 5.19 is shown not to be one.
"""

import pytest
import torch

from graded import TransformerConfig
from graded.transformer.models import TransformerClassifier, TransformerLM


def scales(grades: torch.Tensor, grading: str, base: float) -> torch.Tensor:
    return base ** grades if grading == "exponential" else grades + 1.0


def config(grading, variant, **kw):
    base = dict(vocab_size=13, d_model=8, n_heads=2, n_layers=2, max_len=12, dropout=0.0,
                grading=grading, grading_base=1.7, grade_attention_variant=variant,
                grade_init="warm_start", grade_init_value=0.35)
    base.update(kw)
    return TransformerConfig(**base)


def ungraded_twin(model, cls, cfg, *args):
    """The ungraded model with the graded model's weights, each grading folded in by hand."""
    plain_cfg = cfg.model_copy(update={"grading": None})
    twin = cls(plain_cfg, *args).double()
    graded = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    state = {k: v.detach().clone() for k, v in graded.items()}
    # λ as the model stores it (a buffer in the grading's dtype, so 1.7 rounded to float32)
    base = float(buffers["feature_grading.base"]) if cfg.grading == "exponential" else None
    feature = next(v for k, v in buffers.items() if k.endswith("feature_grading.grades")) \
        if any(k.endswith("feature_grading.grades") for k in buffers) else None
    m = scales(feature, cfg.grading, base) if feature is not None else None
    d = cfg.d_model
    for name in list(state):
        if name.endswith("tokens.weight") and cfg.vocab_size is not None and cfg.grade_input:
            state[name] = state[name] * m  # E' = E diag(m): M E[t]; tied output E M h
        if name.endswith("tokens.weight") and cfg.vocab_size is None and cfg.grade_input:
            q_in = buffers[name.replace("tokens.weight", "input_grading.grading.grades")]
            state[name] = state[name] * scales(q_in, cfg.grading, base)  # W_in diag(m_in)
        if name.endswith("ff.ffn.fc_out.weight") and cfg.grade_ffn:
            state[name] = m[:, None] * state[name]  # M (W2 h + b2)
        if name.endswith("ff.ffn.fc_out.bias") and cfg.grade_ffn:
            state[name] = m * state[name]
        if name.endswith("head.proj.weight") and cfg.grade_output:
            state[name] = state[name] * m  # W_out (M h)
        if cfg.grade_attention and name.endswith(("attn.in_proj_weight", "attn.in_proj_bias")):
            q_h = buffers[name.rsplit(".", 1)[0] + ".grading.grades"]
            mh = scales(q_h, cfg.grading, base).repeat(cfg.n_heads)  # one tuple shared by heads
            rows = {"scores": [0], "queries_keys": [0, 1], "values": [2]}[
                cfg.grade_attention_variant]
            w = state[name]
            for block in rows:
                part = w[block * d:(block + 1) * d]
                part = part * (mh[:, None] if w.dim() == 2 else mh)
                w = torch.cat([w[:block * d], part, w[(block + 1) * d:]])
            state[name] = w
    missing, unexpected = twin.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return twin


@pytest.mark.parametrize("grading", ["linear", "exponential"])
@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values"])
def test_graded_lm_equals_an_ungraded_lm_with_rescaled_weights(grading, variant):
    torch.manual_seed(0)
    cfg = config(grading, variant)
    model = TransformerLM(cfg).double().eval()
    twin = ungraded_twin(model, TransformerLM, cfg).eval()
    ids = torch.randint(0, 13, (3, 10))
    torch.testing.assert_close(model(ids), twin(ids), rtol=0, atol=1e-10)
    # and the grading really acts: the same weights without folding give other logits
    plain = TransformerLM(cfg.model_copy(update={"grading": None})).double().eval()
    plain.load_state_dict(dict(model.named_parameters()), strict=False)
    assert (model(ids) - plain(ids)).abs().max() > 1e-3


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_graded_feature_classifier_equals_rescaled_twin(grading):
    torch.manual_seed(1)
    cfg = config(grading, "queries_keys", vocab_size=None, input_dim=5,
                 input_grades=[0.0, 0.5, 1.0, 1.5, 2.0])
    model = TransformerClassifier(cfg, 3).double().eval()
    twin = ungraded_twin(model, TransformerClassifier, cfg, 3).eval()
    x = torch.randn(4, 7, 5, dtype=torch.float64)
    torch.testing.assert_close(model(x), twin(x), rtol=0, atol=1e-10)


def test_normalised_input_is_not_a_rescaling():
    # x'' = Mx / max(‖Mx‖, ε) is invariant to the scale of x; an ungraded model with a linear
    # input map (and the same weights) is not, so no rescaling of weights reproduces it
    torch.manual_seed(2)
    cfg = config("exponential", "scores", vocab_size=None, input_dim=5, grade_normalize=True)
    model = TransformerClassifier(cfg, 3).double().eval()
    x = torch.randn(4, 7, 5, dtype=torch.float64)
    torch.testing.assert_close(model(x), model(3.0 * x), rtol=0, atol=1e-10)
    twin = ungraded_twin(model, TransformerClassifier,
                         cfg.model_copy(update={"grade_normalize": False}), 3).eval()
    assert (twin(x) - twin(3.0 * x)).abs().max() > 1e-3
