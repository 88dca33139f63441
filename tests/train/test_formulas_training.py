"""002 §6.1-6.2 training formulas against the worked numbers of seed_002 (§2.8, §2.9, §8.2 items
16-17), computed there independently of this library."""

import pytest
import torch

from graded.train import inverse_sqrt, sequence_cross_entropy


@pytest.mark.parametrize(("d_model", "warmup", "step", "lr"), [
    (512, 4000, 1, 1.747e-7),
    (512, 4000, 4000, 6.9877e-4),
    (512, 4000, 100_000, 1.3975e-4),
    (512, 8000, 8000, 4.9411e-4),
    (768, 4000, 4000, 5.7054e-4),
    (1024, 4000, 4000, 4.9411e-4),
])
def test_inverse_sqrt_schedule_matches_the_notes_table_002_eq_6_6(d_model, warmup, step, lr):
    """002 Def 6.3 Eq 6.6, lr(t) = d_model^{−0.5}·min(t^{−0.5}, t·warmup^{−1.5}) with t counted
    from 1: the notes' table (lr(1), the peak at t = warmup, lr(100k)) to the printed digits.
    LambdaLR counts steps from 0, so step t is multiplier(t − 1)."""
    assert inverse_sqrt(warmup, d_model=d_model)(step - 1) == pytest.approx(lr, rel=5e-4)


def test_label_smoothing_target_has_true_class_mass_0_91_for_ten_classes_002_eq_6_4():
    """002 Def 6.2 Eqs 6.4-6.5 with ε = 0.1 and |V| = 10: ỹ = 1 − ε + ε/|V| = 0.91 on the true
    class and ε/|V| = 0.01 elsewhere. The loss −Σ_v ỹ_v log p_v has gradient p − ỹ in the
    logits, so ỹ = softmax(z) − ∂L/∂z recovers the target the library smooths to."""
    logits = torch.randn(3, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    logits.requires_grad_()
    targets = torch.tensor([0, 4, 9])
    loss = sequence_cross_entropy(logits, targets, label_smoothing=0.1, reduction="sum")
    (grad,) = torch.autograd.grad(loss, logits)
    smoothed = torch.softmax(logits.detach(), dim=-1) - grad
    expected = torch.full((3, 10), 0.01, dtype=torch.float64)
    expected[torch.arange(3), targets] = 0.91
    torch.testing.assert_close(smoothed, expected)
    torch.testing.assert_close(smoothed.sum(-1), torch.ones(3, dtype=torch.float64))
