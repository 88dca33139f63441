"""Empirical Lipschitz constants, bound factors and the ungraded twin."""

from __future__ import annotations

import math

import pytest
import torch
from analysis_helpers import tiny_config

from graded import Seq2SeqTransformer, TransformerLM
from graded.analysis import (
    empirical_lipschitz,
    lipschitz_bound_factors,
    model_lipschitz,
    ungraded_twin,
)
from graded.transformer.graded import gradings


def _linear_map(singular_values):
    g = torch.Generator().manual_seed(6)
    n = len(singular_values)
    u, _ = torch.linalg.qr(torch.randn(n + 2, n, dtype=torch.float64, generator=g))
    v, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=g))
    return u @ torch.diag(torch.tensor(singular_values, dtype=torch.float64)) @ v.T


def test_lipschitz_of_a_linear_map_is_its_spectral_norm():
    w = _linear_map([3.0, 1.0, 0.5, 0.2])
    x = torch.randn(5, 4, dtype=torch.float64)  # five rows, each mapped by W

    def f(z):
        return z @ w.T

    spectral = torch.linalg.matrix_norm(w, ord=2).item()
    est = empirical_lipschitz(f, x, n_random=16, steps=12,
                              generator=torch.Generator().manual_seed(0))
    assert est.random_max <= spectral + 1e-9  # random directions give a lower bound
    assert est.adversarial == pytest.approx(spectral, rel=1e-6)  # power iteration reaches it
    assert est.estimate == pytest.approx(spectral, rel=1e-6)
    assert est.epsilon == pytest.approx(1e-2 * torch.linalg.vector_norm(x).item())


def test_adversarial_ascent_does_not_lose_to_random_directions_on_a_nonlinear_map():
    w = _linear_map([2.0, 1.5, 0.1])

    def f(z):
        return torch.tanh(z @ w.T)

    x = 0.1 * torch.randn(4, 3, dtype=torch.float64)
    est = empirical_lipschitz(f, x, n_random=16, steps=8,
                              generator=torch.Generator().manual_seed(1))
    assert est.random_max <= est.adversarial + 1e-9
    assert est.adversarial <= 2.0 + 1e-6  # tanh is 1-Lipschitz: ‖W‖₂ bounds it


def test_empirical_lipschitz_rejects_bad_arguments():
    with pytest.raises(TypeError, match="floating"):
        empirical_lipschitz(lambda z: z, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="epsilon"):
        empirical_lipschitz(lambda z: z, torch.ones(2), epsilon=-1.0)
    with pytest.raises(ValueError, match="n_random"):
        empirical_lipschitz(lambda z: z, torch.ones(2), n_random=0, steps=0)


def test_bound_factors_use_the_largest_grading_scale():
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="exponential", grading_base=3.0,
                                      grade_init="warm_start", grade_init_value=0.25))
    # warm start q_k = 0.25·k: features d=16 reach q = 3.75, head_dim 8 reaches 1.75
    s = 3.0 ** 3.75
    f = lipschitz_bound_factors(model)
    assert f["max_scale"] == pytest.approx(s, rel=1e-6)  # float32 grades
    assert f["prop_5_12_factor"] == pytest.approx(s ** (2 * 2 + 3), rel=1e-5)
    assert f["prop_3_7_factor"] == pytest.approx(s)
    plain = lipschitz_bound_factors(TransformerLM(tiny_config()))
    assert plain["max_scale"] == 1.0 and plain["prop_5_12_factor"] == 1.0
    seq2seq = Seq2SeqTransformer(tiny_config(n_decoder_layers=3))
    assert lipschitz_bound_factors(seq2seq)["n_layers"] == 2 + 3  # encoder + decoder blocks


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_ungraded_twin_equals_the_ungraded_model_with_the_same_weights(grading, tokens):
    torch.manual_seed(0)
    graded = TransformerLM(tiny_config(grading=grading, grade_init="constant",
                                       grade_init_value=0.7, grade_position_alpha=0.05,
                                       grade_normalize=True))
    twin = ungraded_twin(graded)
    plain = TransformerLM(tiny_config())
    missing, unexpected = plain.load_state_dict(graded.state_dict(), strict=False)
    assert not missing and all("grading" in k for k in unexpected)
    plain.eval()
    twin.eval()
    graded.eval()
    assert torch.allclose(twin(tokens), plain(tokens), atol=1e-6)
    assert not torch.allclose(graded(tokens), plain(tokens), atol=1e-3)
    assert all(float(g.grades.abs().max()) == 0.0 for g in gradings(twin).values())
    assert float(next(iter(gradings(graded).values())).grades.max()) == pytest.approx(0.7)


def test_model_lipschitz_of_a_neutral_graded_model_equals_its_twin(tokens):
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="exponential"))  # q = 0: M = I everywhere
    out = model_lipschitz(model, tokens, n_random=2, steps=3)
    assert out["graded/estimate"] == pytest.approx(out["ungraded/estimate"], rel=1e-5)
    assert out["ratio"] == pytest.approx(1.0, rel=1e-5)
    assert out["max_scale"] == 1.0
    assert all(math.isfinite(v) for v in out.values())
    assert out["graded/random_max"] <= out["graded/estimate"]


def test_model_lipschitz_restores_training_mode_and_leaves_weights_alone(egt_lm, tokens):
    egt_lm.train()
    before = {k: v.clone() for k, v in egt_lm.state_dict().items()}
    model_lipschitz(egt_lm, tokens, n_random=1, steps=2)
    assert egt_lm.training
    assert all(torch.equal(before[k], v) for k, v in egt_lm.state_dict().items())
    assert all(p.grad is None for p in egt_lm.parameters())


def test_bound_factor_beyond_float_range_is_reported_as_infinite():
    model = TransformerLM(tiny_config(n_layers=10, n_heads=4, grading="exponential",
                                      grading_base=4.0, grade_init="constant",
                                      grade_init_value=30.0))
    f = lipschitz_bound_factors(model)  # (4^30)^(10·4+3) ≈ 10^774
    assert f["max_scale"] == pytest.approx(4.0**30, rel=1e-5)
    assert f["prop_5_12_factor"] == math.inf


def test_a_non_positive_relative_epsilon_is_refused_by_its_name():
    with pytest.raises(ValueError, match=r"relative_epsilon must be > 0.0, got -0\.1"):
        empirical_lipschitz(lambda x: 2 * x, torch.ones(3), relative_epsilon=-0.1)


def test_a_feature_model_is_perturbed_on_its_raw_features_as_a_brute_force_search_finds():
    """001 Def 3.1: T_G(X) = T(φ(X)), the input grading acting on the raw features before the
    projection (000 Def 5.19). One token of 2 features: the estimate at radius ε must come close
    to the largest ratio over a fine circle of directions in the 2-d feature plane, for the graded
    model and its twin. Perturbing after the projection measured the same downstream map for
    both (the grading left out), at two different points."""
    from graded import TransformerClassifier, TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=None, input_dim=2, d_model=8, n_heads=2, n_layers=1,
                               d_ff=16, max_len=4, positional="none", grading="exponential",
                               grading_base=2.0, input_grades=[0.0, 2.0], grade_attention=False,
                               grade_ffn=False, grade_output=False, grade_positions=False)
    model = TransformerClassifier(config, num_outputs=3).double().eval()
    x = torch.tensor([[[0.7, -0.4]]], dtype=torch.float64)
    est = model_lipschitz(model, x, n_random=4, steps=30)
    eps = est["epsilon"]
    assert eps == pytest.approx(1e-2 * float(x.norm()))  # 1% of the raw features' norm
    angles = torch.linspace(0, 2 * math.pi, 7201, dtype=torch.float64)[:-1]
    circle = eps * torch.stack([angles.cos(), angles.sin()], -1)[:, None, :]  # (K, 1, 2)
    for label, m in (("graded", model), ("ungraded", ungraded_twin(model))):
        with torch.no_grad():
            brute = float((m(x + circle) - m(x)).norm(dim=-1).max()) / eps
        # a lower bound (every iterate lies on the circle) within 1% of the largest ratio
        assert 0.99 * brute <= est[f"{label}/estimate"] <= brute * (1 + 1e-6), label


@pytest.mark.parametrize("variant,applications", [("scores", 1), ("values", 1),
                                                  ("multi_head", 1), ("queries_keys", 2)])
def test_the_bound_counts_each_graded_side_of_a_head(variant, applications):
    # 000 Prop 5.12's proof counts one M per head (s^{Nh+3}); "queries_keys" scales its
    # scores by Q M² Kᵀ, up to s² per head, so s^{Nh+3} would undercount it
    model = TransformerLM(tiny_config(grading="exponential", grading_base=2.0,
                                      grade_init="warm_start", grade_init_value=0.25,
                                      grade_attention_variant=variant))
    f = lipschitz_bound_factors(model)
    s = f["max_scale"]
    assert f["attention_applications"] == applications
    assert f["prop_5_12_factor"] == pytest.approx(s ** (2 * 2 * applications + 3), rel=1e-5)
    ungraded_attention = lipschitz_bound_factors(TransformerLM(tiny_config(
        grading="exponential", grading_base=2.0, grade_init="warm_start",
        grade_init_value=0.25, grade_attention=False)))
    assert ungraded_attention["attention_applications"] == 1  # the proof's count, an upper bound
