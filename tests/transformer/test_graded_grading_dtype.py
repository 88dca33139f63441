"""A graded model whose gradings are held in float64 beside float32 weights runs its
activation-graded stages in float32 (the input and feed-forward stages, the per-token scales,
the attention parts graded on the activations), as the folded stages do: under
:func:`graded.folding.activation_grading` (or ``fold_grading=False``) the float64 scales used to
promote the activations, and the next layer refused them."""

import copy

import pytest
import torch

from graded import TransformerConfig, TransformerLM
from graded.folding import activation_grading
from graded.transformer.graded import gradings

V, T = 11, 6


def models(**kw):
    """The model with float32 gradings, and its twin with the same grades held in float64
    (exactly: float32 values widen without rounding)."""
    base = dict(vocab_size=V, d_model=8, n_heads=2, n_layers=2, d_ff=16, max_len=16,
                grading="exponential", grade_init="warm_start", grade_output=False,
                token_grading=True, token_grade_stages=["input", "ffn"])
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(**{**base, **kw})).eval()
    twin = copy.deepcopy(model)
    for grading in gradings(twin).values():
        grading.double()
    assert all(g.grades.dtype == torch.float64 for g in gradings(twin).values())
    return model, twin


def inputs():
    gen = torch.Generator().manual_seed(1)
    return (torch.randint(0, V, (2, T), generator=gen),
            torch.randint(0, 4, (2, T), generator=gen).float())


@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values", "multi_head"])
def test_float64_gradings_under_activation_grading_give_the_float32_models_outputs(variant):
    model, twin = models(grade_attention_variant=variant)
    ids, grades = inputs()
    with torch.no_grad():
        folded = model(ids, token_grades=grades)  # float32 gradings, folded where it can be
        with activation_grading(model):
            activation32 = model(ids, token_grades=grades)
        with activation_grading(twin):
            got = twin(ids, token_grades=grades)
        twin_folded = twin(ids, token_grades=grades)
    assert got.dtype == twin_folded.dtype == torch.float32
    # the scales are computed in float64 and rounded: the float32 computation's values
    torch.testing.assert_close(got, activation32, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, folded, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(twin_folded, folded, rtol=1e-5, atol=1e-5)


def test_float64_gradings_built_unfolded_train_their_float64_grades():
    """``fold_grading=False`` from the config: a training step's gradients reach the float64
    grades, equal (to float32 rounding) to the float32 model's."""
    model, twin = models(fold_grading=False, learnable_grades=True)
    ids, grades = inputs()
    for m in (model, twin):
        m(ids, token_grades=grades).square().mean().backward()
    for (name, g32), g64 in zip(gradings(model).items(), gradings(twin).values(), strict=True):
        assert g64.grades.grad.dtype == torch.float64, name
        torch.testing.assert_close(g64.grades.grad.float(), g32.grades.grad, rtol=1e-4,
                                   atol=1e-6, msg=name)


def test_a_float64_input_grading_of_a_features_model_grades_in_the_models_dtype():
    """Raw features (000 Def 5.19) graded by a float64 input grading of a float32 classifier:
    graded in the wider of the features' and the model's dtypes (float32 here), as a float32
    grading grades them, not promoted to float64 (refused by the projection)."""
    from graded import TransformerClassifier

    cfg = TransformerConfig(vocab_size=None, input_dim=5, d_model=8, n_heads=2, n_layers=1,
                            max_len=8, grading="exponential", grade_init="warm_start",
                            grade_input=True)
    torch.manual_seed(0)
    model = TransformerClassifier(cfg, 3).eval()
    twin = copy.deepcopy(model)
    for grading in gradings(twin).values():
        grading.double()
    x = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(x)
        for m in (model, twin):
            with activation_grading(m):
                got = m(x)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(twin(x), want, rtol=1e-5, atol=1e-6)
