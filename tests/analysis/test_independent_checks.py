"""Diagnostics against independent computations: torch's attention weights, an exact Jacobian,
naive loops over low-precision maps; mode and hook hygiene; refused inputs."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from analysis_helpers import tiny_config
from torch import nn

from graded import TransformerLM
from graded.analysis import (
    attention_entropy,
    attention_maps,
    attention_rank,
    attention_rollout,
    capture_attention,
    compare_attention_rank,
    diagnose,
    early_attention_mass,
    embedding_perturbation,
    empirical_lipschitz,
    feature_concentration,
    grade_trajectories,
    head_diversity,
    js_divergence,
    lipschitz_bound_factors,
    model_feature_concentration,
    model_lipschitz,
    plot_grade_trajectories,
    positional_bias_sweep,
)
from graded.analysis.lipschitz import _embedding_function
from graded.attention.multihead import MultiheadAttention


def _egt(**changes: object) -> TransformerLM:
    torch.manual_seed(0)
    base = dict(grading="exponential", grade_init="warm_start", grade_init_value=0.2)
    base.update(changes)
    return TransformerLM(tiny_config(**base))


class _Wrapped(nn.Module):
    def __init__(self, attn: MultiheadAttention) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None):
        return self.attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0]


def test_captured_maps_equal_torch_multihead_attention_weights_for_the_same_weights():
    torch.manual_seed(0)
    ours = MultiheadAttention(8, 2, batch_first=True)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 8)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 3:] = True
    (maps,) = attention_maps(_Wrapped(ours), x, key_padding_mask=pad).values()
    with torch.no_grad():
        _, expected = theirs(x, x, x, key_padding_mask=pad, need_weights=True,
                             average_attn_weights=False)
    torch.testing.assert_close(maps, expected, rtol=0, atol=1e-6)


def test_adversarial_lipschitz_estimate_reaches_the_exact_jacobian_spectral_norm():
    model = _egt(n_layers=1, d_model=8).double().eval()
    tokens = torch.randint(0, 11, (1, 4), generator=torch.Generator().manual_seed(1))
    f, x = _embedding_function(model, tokens)
    jac = torch.autograd.functional.jacobian(f, x).reshape(f(x).numel(), x.numel())
    exact = float(torch.linalg.matrix_norm(jac, 2))
    est = model_lipschitz(model, tokens, compare_ungraded=False, relative_epsilon=1e-4,
                          steps=40)
    assert est["graded/estimate"] == pytest.approx(exact, rel=1e-3)
    assert est["graded/random_max"] <= exact * (1 + 1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lipschitz_of_a_low_precision_model_is_that_of_its_weights_in_float32(dtype):
    model = _egt().eval()
    tokens = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(2))
    expected = model_lipschitz(model, tokens, steps=10)
    low = copy.deepcopy(model).to(dtype)
    got = model_lipschitz(low, tokens, steps=10)
    # 16-bit finite differences at ‖Δ‖ = 1% of ‖X‖ measured rounding (4x the float32 value)
    assert got["graded/estimate"] == pytest.approx(expected["graded/estimate"], rel=0.05)
    assert got["ungraded/estimate"] == pytest.approx(expected["ungraded/estimate"], rel=0.05)
    assert all(p.dtype == dtype for p in low.parameters())  # the model itself is untouched


def _entropy_loop(w: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(w.shape[:-1], dtype=torch.float64)
    for idx in itertools.product(*map(range, w.shape[:-1])):
        out[idx] = -sum(float(p) * math.log(float(p)) for p in w[idx] if float(p) > 0)
    return out


def test_entropy_and_rollout_of_bfloat16_maps_equal_a_float64_loop_over_the_same_weights():
    model = _egt(n_layers=3).to(torch.bfloat16)
    tokens = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(3))
    maps = attention_maps(model, tokens)
    first = next(iter(maps.values()))
    assert first.dtype == torch.bfloat16
    entropy = attention_entropy(first)
    torch.testing.assert_close(entropy.double(), _entropy_loop(first), rtol=0, atol=1e-5)
    rollout = attention_rollout(maps)
    for b in range(first.shape[0]):
        expected = torch.eye(12, dtype=torch.float64)
        for w in maps.values():  # Abnar & Zuidema: mean over heads, A + I, rows normalised
            a = w[b].double().mean(dim=0) + torch.eye(12, dtype=torch.float64)
            expected = (a / a.sum(dim=-1, keepdim=True)) @ expected
        torch.testing.assert_close(rollout[b].double(), expected, rtol=0, atol=1e-5)


def test_early_mass_of_bfloat16_weights_equals_a_float64_loop():
    g = torch.Generator().manual_seed(4)
    w = torch.softmax(torch.randn(2, 2, 40, 40, generator=g), dim=-1).to(torch.bfloat16)
    k = 3
    expected = sum(float(w[b, h, i, :k].double().sum()) for b in range(2) for h in range(2)
                   for i in range(k, 40)) / (2 * 2 * (40 - k))
    assert early_attention_mass(w, k) == pytest.approx(expected, abs=1e-6)


def _mixed_mode_model() -> TransformerLM:
    model = _egt(dropout=0.5)
    model.train()
    model.decoder.embed.eval()  # e.g. a frozen embedding kept in eval mode
    return model


@pytest.mark.parametrize("run", [
    lambda m, x: attention_maps(m, x),
    lambda m, x: attention_rank(m, x),
    lambda m, x: head_diversity(m, x),
    lambda m, x: model_lipschitz(m, x, n_random=1, steps=1),
    lambda m, x: positional_bias_sweep(m, x, [0.0]),
    lambda m, x: model_feature_concentration(m, x),
    lambda m, x: diagnose(m, x, n_random=1, lipschitz_steps=1),
], ids=["maps", "rank", "heads", "lipschitz", "positional", "concentration", "diagnose"])
def test_diagnostics_restore_each_submodules_own_mode(run):
    model = _mixed_mode_model()
    tokens = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(5))
    before = {name: m.training for name, m in model.named_modules()}
    run(model, tokens)
    assert {name: m.training for name, m in model.named_modules()} == before


def test_maps_of_a_model_in_training_mode_are_its_eval_maps_without_dropout():
    model = _egt(dropout=0.5)
    tokens = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(6))
    model.train()
    train_maps = attention_maps(model, tokens)
    model.eval()
    for key, w in attention_maps(model, tokens).items():
        torch.testing.assert_close(train_maps[key], w)


def _hook_state(model: nn.Module) -> tuple[int, int]:
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    patched = sum("attend" in m.__dict__ for m in model.modules())
    return hooks, patched


def test_a_forward_that_raises_leaves_no_hook_patch_or_mode_change_behind():
    model = _egt(dropout=0.5)
    model.train()
    tokens = torch.randint(0, 11, (1, 4))

    def boom(*_: object) -> None:
        raise RuntimeError("boom")

    handle = model.decoder.stack.blocks[1].register_forward_pre_hook(boom)
    before = _hook_state(model)
    positions = model.decoder.embed.position_grading
    runs = [lambda: attention_maps(model, tokens), lambda: attention_rank(model, tokens),
            lambda: head_diversity(model, tokens),
            lambda: model_lipschitz(model, tokens, compare_ungraded=False),
            lambda: positional_bias_sweep(model, tokens, [0.1]),
            lambda: diagnose(model, tokens)]
    for run in runs:
        with pytest.raises(RuntimeError, match="boom"):
            run()
        assert _hook_state(model) == before
        assert model.training
        assert model.decoder.embed.position_grading is positions  # the sweep's α undone
    for context in (capture_attention, embedding_perturbation):
        with pytest.raises(RuntimeError, match="boom"), context(model):
            model(tokens)
        assert _hook_state(model) == before
    handle.remove()


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: empirical_lipschitz(lambda x: x, torch.ones(3), epsilon=math.inf), ValueError,
     r"epsilon must be a finite number, got inf \(expected > 0"),
    (lambda: empirical_lipschitz(lambda x: x, torch.ones(3), relative_epsilon=math.inf),
     ValueError, r"relative_epsilon must be a finite number, got inf \(expected > 0"),
    (lambda: empirical_lipschitz(lambda x: x, torch.ones(3), n_random=2.5), TypeError,
     r"n_random must be an int, got 2\.5 \(float\)"),
    (lambda: empirical_lipschitz(lambda x: x, torch.ones(3), steps=True), TypeError,
     r"steps must be an int, got True \(bool\)"),
    (lambda: feature_concentration(torch.randn(4, 3), torch.ones(3), torch.arange(3.0),
                                   delta=math.nan), ValueError,
     r"delta must be a finite number, got nan \(expected >= 0"),
    (lambda: attention_entropy(torch.tensor([[math.nan, 1.0]])), ValueError,
     r"attention weights must be finite and >= 0, got values in \[nan"),
    (lambda: js_divergence(torch.tensor([math.nan, 1.0]), torch.tensor([0.5, 0.5])),
     ValueError, r"p must be finite and >= 0, got values in \[nan"),
    (lambda: attention_rollout([torch.full((1, 1, 2, 2), math.nan)]), ValueError,
     r"layer 0 weights must be finite and >= 0, got values in \[nan"),
    (lambda: attention_rollout([torch.rand(1, 1, 3, 3)], residual="no"), TypeError,
     r"residual must be True or False, got 'no'"),
], ids=["epsilon-inf", "relative-epsilon-inf", "n-random-float", "steps-bool", "delta-nan",
        "entropy-nan", "js-nan", "rollout-nan", "residual-str"])
def test_bad_arguments_are_refused_naming_the_value_and_what_was_expected(call, error,
                                                                          message):
    with pytest.raises(error, match=message):
        call()


def test_bound_factor_counts_a_block_shared_across_depth_once_per_application():
    model = _egt(n_layers=3)
    blocks = model.decoder.stack.blocks
    blocks[1] = blocks[0]
    blocks[2] = blocks[0]  # three applications of one block
    with capture_attention(model) as calls:
        model(torch.randint(0, 11, (1, 4)))
    applications = len(calls)  # one self-attention call per block application
    factors = lipschitz_bound_factors(model)
    assert applications == 3
    assert factors["n_layers"] == applications
    s = factors["max_scale"]
    assert factors["prop_5_12_factor"] == pytest.approx(s ** (applications * 2 + 3))


@pytest.mark.parametrize("step", [1.5, "2", True])
def test_a_snapshot_whose_step_is_not_an_int_is_refused_naming_it(step):
    with pytest.raises(ValueError, match=r"a grade snapshot is \{'step': int"):
        grade_trajectories([{"step": 0, "grades": {"a": [1.0]}},
                            {"step": step, "grades": {"a": [2.0]}}])


@pytest.mark.parametrize("max_modules", [0, -1, 1.5])
def test_plot_grade_trajectories_refuses_a_non_positive_panel_count(tmp_path, max_modules):
    error = TypeError if isinstance(max_modules, float) else ValueError
    with pytest.raises(error, match=rf"max_modules must be (an int|>= 1), got {max_modules}"):
        plot_grade_trajectories([{"step": 0, "grades": {"a": [1.0]}}], tmp_path,
                                max_modules=max_modules)


def _js_loop(p: list[float], r: list[float]) -> float:
    out = 0.0
    for a, b in zip(p, r, strict=True):
        m = 0.5 * (a + b)
        out += 0.5 * (a * math.log(a / m) if a > 0 else 0.0)
        out += 0.5 * (b * math.log(b / m) if b > 0 else 0.0)
    return out


def test_head_diversity_of_a_model_is_its_formula_written_out_over_the_captured_heads():
    model = _egt(grades_per_head=True)
    tokens = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(7))
    model.eval()
    with torch.no_grad(), capture_attention(model) as calls:
        model(tokens)
    result = head_diversity(model, tokens)
    for call, (key, got) in zip(calls, result.items(), strict=True):
        w = call.weights.double()
        b_, h_, t_, _ = w.shape
        js = [[sum(_js_loop(w[b, i, t].tolist(), w[b, j, t].tolist())
                   for b in range(b_) for t in range(t_)) / (b_ * t_) for j in range(h_)]
              for i in range(h_)]
        torch.testing.assert_close(got["js_matrix"], torch.tensor(js, dtype=torch.float64))
        pairs = [js[i][j] for i in range(h_) for j in range(h_) if i != j]
        assert got["mean_js"] == pytest.approx(sum(pairs) / len(pairs)), key
        ranks = []
        for b in range(b_):
            concat = torch.cat([call.heads[b, h] for h in range(h_)], dim=-1).double()
            s = torch.linalg.svdvals(concat)
            ranks.append(int((s > 1e-3 * s[0]).sum()))
        assert got["numerical_rank"] == pytest.approx(sum(ranks) / len(ranks)), key


def test_diagnose_refuses_a_model_without_attention_naming_it():
    with pytest.raises(ValueError, match=r"diagnose needs a model with attention layers: "
                                         r"Linear made no attention call"):
        diagnose(nn.Linear(3, 3), torch.randn(2, 4, 3))


@pytest.mark.parametrize(("name", "mask", "error", "message"), [
    ("keep", torch.ones(3, 3, dtype=torch.bool), ValueError,
     r"keep must broadcast to the scores' shape \(B, H, Tq, Tk\) = \(1, 2, 4, 4\), "
     r"got shape \(3, 3\)"),
    ("keep", torch.ones(4, 4), TypeError, r"keep must be a bool mask .* got torch.float32"),
    ("bias", torch.zeros(2, 3, 4, 4), ValueError,
     r"bias must broadcast to the scores' shape .* got shape \(2, 3, 4, 4\)"),
], ids=["keep-shape", "keep-float", "bias-shape"])
def test_rank_masks_that_do_not_fit_the_scores_are_refused_naming_both_shapes(
        name, mask, error, message):
    q, k = torch.randn(2, 1, 2, 4, 8).unbind(0)
    with pytest.raises(error, match=message):
        compare_attention_rank(q, k, None, **{name: mask})
