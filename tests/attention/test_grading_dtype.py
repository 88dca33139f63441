"""A grading module held in another dtype than the attention module (float64 grades beside
float32 weights) grades the activations in the activations' dtype, as the folded form grades
the weights in theirs: the activation form (``fold_grading=False``, a grading that cannot be
folded) used to promote q, k or v to float64, and the backend refused the mixed dtypes."""

import math

import pytest
import torch
from torch import nn

from graded.attention.graded import GradedMultiheadAttention
from graded.grading import ExponentialGrading, LinearGrading

E, H, D, T = 8, 2, 4, 5
GRADED = {"scores": "q", "multi_head": "q", "queries_keys": "qk", "values": "v"}


class ThroughItsOwnForward(ExponentialGrading):
    """A GradingMap subclass with a forward of its own: never folded (not diagonal)."""

    def forward(self, x, *, head_axis=-3):
        return super().forward(x, head_axis=head_axis)


class Float64Scales(nn.Module):
    """A grading module that is no GradingMap: x ↦ x·exp(w), w a float64 parameter."""

    def __init__(self):
        super().__init__()
        self.dim = D
        self.w = nn.Parameter(torch.linspace(-0.5, 0.7, D, dtype=torch.float64))

    def forward(self, x):
        return x * torch.exp(self.w)

    def scales(self):
        return torch.exp(self.w)


def naive(module, x, scales, variant):
    """Per head, in float64 from the module's weights: q, k, v projected, the variant's parts
    times m (the scales, per head (H, D)), softmax(q kᵀ/√D) v, the output projection."""
    w, b = module.in_proj_weight.double(), module.in_proj_bias.double()
    x = x.double()
    q, k, v = (x @ w[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E] for i in range(3))
    heads = []
    for h in range(H):
        part = slice(h * D, (h + 1) * D)
        qh, kh, vh = q[..., part], k[..., part], v[..., part]
        m = scales[h].double()
        qh = qh * m if "q" in GRADED[variant] else qh
        kh = kh * m if "k" in GRADED[variant] else kh
        vh = vh * m if "v" in GRADED[variant] else vh
        heads.append(torch.softmax(qh @ kh.transpose(-2, -1) / math.sqrt(D), -1) @ vh)
    out = torch.cat(heads, -1)
    return out @ module.out_proj.weight.double().T + module.out_proj.bias.double()


def module_with(grading, variant, fold):
    torch.manual_seed(0)
    return GradedMultiheadAttention(E, H, grading=grading, variant=variant, batch_first=True,
                                    fold_grading=fold)


@pytest.mark.parametrize("variant", sorted(GRADED))
@pytest.mark.parametrize("kind", [LinearGrading, ExponentialGrading])
def test_a_float64_grading_in_a_float32_module_grades_the_activations_as_the_fold_does(
        variant, kind):
    per_head = variant == "multi_head"
    grades = torch.rand((H, D) if per_head else (D,), generator=torch.Generator().manual_seed(1),
                        dtype=torch.float64) * 1.5
    grading = kind(D, grades, num_heads=H if per_head else None, dtype=torch.float64)
    folded, activation = module_with(grading, variant, True), module_with(grading, variant, False)
    x = torch.randn(2, T, E, generator=torch.Generator().manual_seed(2))
    got = activation(x, x, x)[0]
    assert got.dtype == torch.float32
    scales = grading.scales().expand(H, D)
    torch.testing.assert_close(got.double(), naive(activation, x, scales, variant),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, folded(x, x, x)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("grading", [ThroughItsOwnForward, Float64Scales])
@pytest.mark.parametrize("variant", ["scores", "queries_keys", "values"])
def test_a_float64_grading_module_that_cannot_be_folded_runs_in_a_float32_module(
        grading, variant):
    """Not diagonal, so never folded: it failed whatever ``fold_grading`` said."""
    made = (grading(D, torch.tensor([0.0, 0.5, 1.0, 1.5]), dtype=torch.float64)
            if grading is ThroughItsOwnForward else grading())
    module = module_with(made, variant, True)
    x = torch.randn(2, T, E, generator=torch.Generator().manual_seed(3))
    out = module(x, x, x)[0]
    assert out.dtype == torch.float32
    scales = made.scales().expand(H, D)
    torch.testing.assert_close(out.double(), naive(module, x, scales, variant),
                               rtol=1e-5, atol=1e-5)
    if grading is Float64Scales:  # the gradient reaches the float64 parameter
        out.square().sum().backward()
        assert made.w.grad.dtype == torch.float64 and made.w.grad.abs().sum() > 0


def test_apply_grading_casts_the_scales_not_the_product():
    """A diagonal grading's scales are rounded to the activations' dtype first, then
    multiplied, as the fold rounds them to the weight's dtype: x·fl32(m), exactly."""
    from graded.attention.graded import apply_grading

    grading = ExponentialGrading(D, torch.tensor([0.1, 0.7, 1.3, 2.9]), dtype=torch.float64)
    x = torch.randn(3, D)
    got = apply_grading(grading, x)
    assert got.dtype == torch.float32
    assert torch.equal(got, x * grading.scales().float())
    same = ExponentialGrading(D, torch.tensor([0.1, 0.7, 1.3, 2.9]))  # float32: as before
    assert torch.equal(apply_grading(same, x), same(x))
