"""Bad inputs the diagnostics must refuse by name (non-finite values, gaps in a grade CSV, a
model without values) and input forms they must accept (α as a tensor)."""

import copy
import math

import pytest
import torch
from analysis_helpers import tiny_config
from torch import nn

from graded import Seq2SeqTransformer, TransformerLM
from graded.analysis import (
    attention_maps,
    attention_modules,
    capture_attention,
    diagnose,
    empirical_lipschitz,
    feature_concentration,
    grade_trajectories,
    js_divergence,
    lipschitz_bound_factors,
    model_lipschitz,
    plot_attention_maps,
    plot_rollout,
    positional_bias_sweep,
    ungraded_twin,
)
from graded.transformer.models import InputEmbedding

SCALES = torch.tensor([1.0, 2.0, 3.0])
GRADES = torch.tensor([0.0, 1.0, 2.0])


def test_feature_concentration_refuses_a_nan_vector_instead_of_dropping_it():
    x = torch.tensor([[1.0, float("nan"), 1.0], [1.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match=r"x must be finite, got values in \[nan, nan\]"):
        feature_concentration(x, SCALES, GRADES)


@pytest.mark.parametrize("name", ["scales", "grades"])
def test_feature_concentration_names_a_non_finite_grading(name):
    bad = {"scales": SCALES.clone(), "grades": GRADES.clone()}
    bad[name][1] = float("inf")
    with pytest.raises(ValueError, match=rf"{name} must be finite, got values in \["):
        feature_concentration(torch.ones(2, 3), bad["scales"], bad["grades"])


def test_empirical_lipschitz_refuses_a_non_finite_point():
    with pytest.raises(ValueError, match=r"x must be finite, got values in \[nan, nan\]"):
        empirical_lipschitz(lambda t: 2 * t, torch.tensor([1.0, float("nan")]))


def test_empirical_lipschitz_refuses_a_function_non_finite_at_the_point():
    with pytest.raises(ValueError, match=r"f\(x\) must be finite, got values in \[inf, inf\]"):
        empirical_lipschitz(lambda t: t / 0, torch.ones(2))


def test_empirical_lipschitz_names_the_dtype_of_an_integer_point():
    with pytest.raises(TypeError, match=r"x must be a floating tensor, got torch\.int64"):
        empirical_lipschitz(lambda t: 2 * t, torch.ones(2, dtype=torch.long))


def test_grade_csv_with_a_gap_in_the_indices_is_refused(tmp_path):
    # indices 0 and 2: the grade at index 1 is missing, the second column would be index 2's
    path = tmp_path / "grades.csv"
    path.write_text("step,module,index,grade\n0,a,0,1.0\n0,a,2,2.0\n")
    with pytest.raises(ValueError, match=r"module 'a' at step 0 has grade indices \[0, 2\]; "
                                         r"expected 0\.\.1"):
        grade_trajectories(path)


def test_grade_csv_with_a_repeated_row_is_refused(tmp_path):
    path = tmp_path / "grades.csv"
    path.write_text("step,module,index,grade\n0,a,0,1.0\n0,a,0,2.0\n")
    with pytest.raises(ValueError, match=r"grades\.csv:3: a second grade for step=0, "
                                         r"module='a', index=0"):
        grade_trajectories(path)


@pytest.mark.parametrize("grades", [["x", 1.0], {"b": 1.0}])
def test_a_non_numeric_grade_names_its_module_and_step(grades):
    with pytest.raises(ValueError, match=r"module 'attn' at step 5: grades must be a number or "
                                         r"a nested list of numbers, got "):
        grade_trajectories([{"step": 5, "grades": {"attn": grades}}])


def test_positional_bias_sweep_takes_alphas_as_a_tensor(tokens):
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="exponential"))
    sweep = positional_bias_sweep(model, tokens, torch.tensor([0.0]), k=2)
    # α = 0 is the factor λ^0 = 1: the model with its position grading removed
    plain = copy.deepcopy(model)
    for m in plain.modules():
        if isinstance(m, InputEmbedding):
            m.position_grading = None
    for key, w in attention_maps(plain, tokens).items():
        b, h, t, _ = w.shape
        naive = sum(float(w[i, j, q, :2].sum()) for i in range(b) for j in range(h)
                    for q in range(2, t)) / (b * h * (t - 2))
        assert sweep["alphas"] == [0.0]
        assert sweep["layers"][key][0] == pytest.approx(naive, rel=1e-5)


def test_a_model_on_the_meta_device_is_named_not_run(tokens):
    with torch.device("meta"):
        model = TransformerLM(tiny_config(grading="exponential"))
    message = r"'decoder\.embed\.tokens\.weight' is on the meta device"
    with pytest.raises(ValueError, match=message):
        attention_maps(model, tokens.to("meta"))
    with pytest.raises(ValueError, match=message):
        model_lipschitz(model, tokens.to("meta"), n_random=1, steps=1)
    with pytest.raises(ValueError, match=message):
        lipschitz_bound_factors(model)


@pytest.mark.parametrize("backend, options", [("sliding_window", {"window": 2}), ("linear", {})])
def test_capture_refuses_a_cached_step_it_cannot_record(backend, options, tokens):
    # these backends decode cached positions through their own state, not through attend:
    # the step used to go unrecorded, leaving an empty list of calls
    model = TransformerLM(tiny_config(grading="exponential", attn_backend=backend,
                                      attn_backend_options=options)).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens[:, :6], cache=cache)
        message = (r"cannot record attention layer 'decoder\.stack\.blocks\.0\.self_attn\.attn': "
                   rf"its backend '{backend}' decodes cached")
        with pytest.raises(ValueError, match=message), capture_attention(model):
            model(tokens[:, 6:], cache=cache, positions=torch.full((3, 1), 6))
    # the capture is undone: no instance attribute is left on any attention module
    assert not [n for n, m in attention_modules(model).items()
                if {"attend", "attend_incremental"} & set(m.__dict__)]


def test_ungraded_twin_of_a_softplus_token_graded_lgt_ignores_the_token_grades(tokens):
    # softplus(s·p) = 1 for no profile p at every grade s: a neutral profile left M_{q_i} ≠ I
    torch.manual_seed(0)
    config = tiny_config(grading="linear", grading_f="softplus", token_grading=True,
                         grade_init="warm_start", grade_init_value=0.3)
    model = TransformerLM(config)
    twin = ungraded_twin(model).eval()
    # the reference: the same weights under f = shift, whose neutral profile p = 0 gives
    # f(s·0) = 1 at every grade s
    shift = TransformerLM(config.model_copy(update={"grading_f": "shift"}))
    shift.load_state_dict(model.state_dict())
    reference = ungraded_twin(shift).eval()
    with torch.no_grad():
        for s in (0.0, 3.0):
            grades = torch.full(tokens.shape, s)
            torch.testing.assert_close(twin(tokens, token_grades=grades),
                                       reference(tokens, token_grades=grades))


def test_js_divergence_of_bfloat16_rows_is_summed_in_float32():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 64, generator=gen), -1).bfloat16()
    r = torch.softmax(torch.randn(4, 64, generator=gen), -1).bfloat16()
    # the reference: the same (rounded) rows, JS by a naive loop in float64
    expected = []
    for pi, ri in zip(p.double().tolist(), r.double().tolist(), strict=True):
        js = 0.0
        for a, b in zip(pi, ri, strict=True):
            m = 0.5 * (a + b)
            js += 0.5 * (a * math.log(a / m) if a > 0 else 0.0)
            js += 0.5 * (b * math.log(b / m) if b > 0 else 0.0)
        expected.append(js)
    got = js_divergence(p, r)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sample", [0.5, True])
def test_plots_name_a_sample_that_is_not_an_int(sample, tmp_path):
    weights = torch.full((2, 1, 3, 3), 1 / 3)
    with pytest.raises(ValueError, match=rf"sample must be an int in \[0, 2\) .* got "
                                         rf"sample={sample!r}"):
        plot_attention_maps({"layer": weights}, tmp_path, sample=sample)
    with pytest.raises(ValueError, match=rf"sample={sample!r}"):
        plot_rollout(weights[:, 0], tmp_path, sample=sample)


def test_diagnose_refuses_alphas_that_share_a_metric_key(tokens):
    # 0.1 and 0.10001 both print as "alpha=0.1": the second mass used to replace the first
    model = TransformerLM(tiny_config(grading="exponential"))
    with pytest.raises(ValueError, match=r"alphas=\[0\.1, 0\.10001\] give the metric keys .*"
                                         r"some twice"):
        diagnose(model, tokens, alphas=[0.1, 0.10001], lipschitz_steps=1, n_random=1)


def _forward_counter(model: nn.Module) -> list[int]:
    calls = [0]

    def count(module, args):
        calls[0] += 1

    model.register_forward_pre_hook(count)
    return calls


@pytest.mark.parametrize(("k", "message"), [
    (7, r"k=7 leaves no query beyond the first k positions in a sequence of 7; use 1 <= k < 7"),
    (9, r"k=9 leaves no query .* sequence of 7"),
    (0, r"k must be a positive int .* got 0"),
    (True, r"k must be a positive int .* got True"),
])
def test_diagnose_refuses_k_before_any_diagnostic_runs(tokens, k, message):
    # k >= the length of 7 failed in the positional sweep, after the rank, head and
    # Lipschitz diagnostics had run the model many times; now no forward pass runs
    model = TransformerLM(tiny_config(grading="linear"))
    forwards = _forward_counter(model)
    with pytest.raises(ValueError, match=message):
        diagnose(model, tokens, k=k, lipschitz_steps=1, n_random=1)
    assert forwards[0] == 0


def test_diagnose_checks_k_against_the_shortest_sequence_of_a_seq2seq_model():
    # the decoder's self-attention has the target's 3 queries: k=3 leaves none beyond it
    model = Seq2SeqTransformer(tiny_config(grading="linear", n_decoder_layers=1))
    src, tgt = torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 3))
    forwards = _forward_counter(model)
    with pytest.raises(ValueError, match=r"k=3 leaves no query .* sequence of 3"):
        diagnose(model, (src, tgt), k=3, lipschitz_steps=1, n_random=1)
    assert forwards[0] == 0
    with pytest.raises(ValueError, match=r"k=3 leaves no query .* sequence of 3"):
        positional_bias_sweep(model, (src, tgt), [0.0], k=3)
    assert forwards[0] == 0
    report = diagnose(model, (src, tgt), k=2, lipschitz_steps=1, n_random=1)
    assert "positional/uniform" in report.metrics
