"""sequence_cross_entropy: its input checks and its reductions against a hand-written loss."""

import math

import pytest
import torch

from graded.train.losses import sequence_cross_entropy


def _naive(logits, targets, eps, ignore_index=-100):
    """Per-position loss −Σ_v q_v log p_v with q = (1 − ε)·one_hot + ε/V, 0 where ignored."""
    v = logits.shape[-1]
    out = torch.zeros(targets.shape, dtype=torch.float64)
    for idx in torch.cartesian_prod(*[torch.arange(s) for s in targets.shape]).view(
        -1, targets.dim()
    ):
        idx = tuple(idx.tolist())
        t = int(targets[idx])
        if t == ignore_index:
            continue
        logp = torch.log_softmax(logits[idx].double(), -1)
        q = torch.full((v,), eps / v, dtype=torch.float64)
        q[t] += 1 - eps
        out[idx] = -(q * logp).sum()
    return out


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"logits \(2, 3, 5\) and targets \(2, 4\) disagree"):
        sequence_cross_entropy(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize("eps", [-0.1, 1.0])
def test_label_smoothing_out_of_range_is_named(eps):
    with pytest.raises(ValueError, match=rf"label_smoothing must be in \[0, 1\), got {eps}"):
        sequence_cross_entropy(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long),
                               label_smoothing=eps)


def test_unknown_reduction_is_named():
    with pytest.raises(ValueError, match=r"reduction must be 'mean', 'sum' or 'none', got 'max'"):
        sequence_cross_entropy(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long),
                               reduction="max")


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_reductions_equal_a_per_position_sum(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g)
    targets = torch.tensor([[0, 4, -100], [2, -100, 1]])
    ref = _naive(logits, targets, eps)
    none = sequence_cross_entropy(logits, targets, label_smoothing=eps, reduction="none")
    assert none.shape == targets.shape
    torch.testing.assert_close(none.double(), ref, atol=1e-5, rtol=1e-5)
    total = sequence_cross_entropy(logits, targets, label_smoothing=eps, reduction="sum")
    assert math.isclose(float(total), float(ref.sum()), rel_tol=1e-5)
    mean = sequence_cross_entropy(logits, targets, label_smoothing=eps)
    assert math.isclose(float(mean), float(ref.sum()) / 4, rel_tol=1e-5)  # 4 counted positions


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_targets_of_any_integer_dtype_are_class_indices(dtype):
    """int32 targets failed with torch's "expected target dtype to be Long or Byte"."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 5, generator=gen)
    targets = torch.randint(0, 5, (2, 3), generator=gen)
    got = sequence_cross_entropy(logits, targets.to(dtype), label_smoothing=0.1,
                                 reduction="none")
    expected = _naive(logits, targets, 0.1)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_targets_that_are_not_class_indices_are_refused_naming_their_dtype(dtype):
    with pytest.raises(TypeError, match=rf"targets must hold class indices \(an integer tensor\), "
                                        rf"got {dtype}"):
        sequence_cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=dtype))
