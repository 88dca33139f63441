"""Shape checks of the grading maps: ``scales_at`` (the per-token grading M_{s·q} of 000 §6.2,
Remark 6.16) takes shared grades (dim,), and ``forward`` takes a head axis within the input."""

import pytest
import torch

from graded.grading import ExponentialGrading, LinearGrading


@pytest.mark.parametrize("cls", [LinearGrading, ExponentialGrading])
def test_scales_at_refuses_per_head_grades_instead_of_pairing_tokens_with_heads(cls):
    # s of shape (2,) against grades (2, 3) gave row t = head t at multiplier s_t (EGT:
    # [[1, 2, 4], [4, 4, 4]] for s = (1, 2)), a tensor of the right size and no meaning
    g = cls(3, [[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match=r"scales_at needs shared grades of shape \(3,\), one "
                                         r"grade per feature; this grading has per-head grades "
                                         r"of shape \(2, 3\)"):
        g.scales_at(torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("cls", [LinearGrading, ExponentialGrading])
def test_scales_at_names_a_multiplier_that_is_not_a_tensor(cls):
    with pytest.raises(TypeError, match=r"scales_at takes a tensor of multipliers s \(or None\), "
                                        r"got float"):
        cls(3, [0.0, 1.0, 2.0]).scales_at(2.0)


def test_scales_at_of_shared_grades_is_the_grading_of_the_scaled_grades():
    # M_{s·q} by hand: λ^{s q_k} (EGT, λ = 2) and s q_k + 1 (LGT, f = shift)
    s = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    q = [0.0, 1.0, 3.0]
    egt = ExponentialGrading(3, q, base=2.0, dtype=torch.float64).scales_at(s)
    lgt = LinearGrading(3, q, dtype=torch.float64).scales_at(s)
    expected_egt = [[[2.0 ** (si * qk) for qk in q] for si in row] for row in s.tolist()]
    expected_lgt = [[[si * qk + 1.0 for qk in q] for si in row] for row in s.tolist()]
    torch.testing.assert_close(egt, torch.tensor(expected_egt, dtype=torch.float64))
    torch.testing.assert_close(lgt, torch.tensor(expected_lgt, dtype=torch.float64))


def test_forward_refuses_a_head_axis_out_of_range_instead_of_wrapping_it():
    # head_axis=4 of a 4-d input was taken modulo 4: axis 0, the batch of 2, read as 2 heads
    g = ExponentialGrading(3, [[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]], base=2.0)
    x = torch.ones(2, 5, 4, 3)
    for bad in (4, -5):
        with pytest.raises(ValueError, match=rf"need 2 heads at axis head_axis={bad}, which is "
                                             r"out of range for an input of 4 dimensions"):
            g(x, head_axis=bad)
    y = torch.ones(5, 2, 4, 3)  # heads at axis 1 (= -3): row h scaled by 2^{q_h}
    rows = torch.tensor([[1.0, 2.0, 4.0], [2.0, 2.0, 2.0]])
    expected = rows.reshape(1, 2, 1, 3).expand(5, 2, 4, 3)
    torch.testing.assert_close(g(y, head_axis=1), expected)
    torch.testing.assert_close(g(y, head_axis=-3), expected)
