"""The node weights of centrality-graded graph attention: LGT's w = 1 + q (000 Def 5.1,
f(q) = q + 1) refuses grades whose weight is not positive, naming the value, and re-weights
attention by w_j exactly; in bfloat16 and float16 every weight is the exact one rounded once,
and a logit bias is added in the logits' dtype."""

import pytest
import torch

from graded.nn.graph import GradedGraphAttention


def _graph():
    torch.manual_seed(0)
    adj = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0], [0, 1, 0, 0]])
    return torch.randn(4, 3), adj


def test_linear_grading_reweights_attention_by_one_plus_the_neighbour_grade():
    layer = GradedGraphAttention(3, 2, grading="linear")
    x, adj = _graph()
    q = torch.tensor([-0.5, 0.0, 2.0, 0.25])
    _, plain = layer.layer(x, adj, need_weights=True)
    expected = plain * (1.0 + q)  # α_ij ∝ (1 + q_j) exp(e_ij)
    expected = expected / expected.sum(-1, keepdim=True)
    _, got = layer(x, adj, grades=q, need_weights=True)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("bad", [-1.0, -3.0])
def test_linear_grading_refuses_a_grade_whose_weight_is_not_positive(bad):
    # 1 + q <= 0 was floored at 1e-6: the node silently dropped out of every neighbourhood
    layer = GradedGraphAttention(3, 2, grading="linear")
    x, adj = _graph()
    with pytest.raises(ValueError, match=rf"weights 1 \+ q need grades q > -1, got {bad} at "
                                         r"index 2"):
        layer(x, adj, grades=[0.0, 0.5, bad, 1.0])
    with pytest.raises(ValueError, match=rf"got {bad} at index \(1, 2\)"):
        layer(x.expand(2, 4, 3), adj, grades=[[0.0] * 4, [0.0, 0.5, bad, 1.0]])


def test_linear_grading_refuses_a_fixed_grade_scale_at_or_below_minus_one():
    with pytest.raises(ValueError, match=r"grade_scale=-2.0 gives the most central node "
                                         r"q = -2.0"):
        GradedGraphAttention(3, 2, grading="linear", grade_scale=-2.0)
    # above -1 it is a valid de-emphasis of central nodes; the exponential map takes any s
    GradedGraphAttention(3, 2, grading="linear", grade_scale=-0.5)
    GradedGraphAttention(3, 2, grading="exponential", grade_scale=-2.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("grading", ["exponential", "linear"])
def test_half_precision_grading_is_the_exact_weight_rounded_once(dtype, grading):
    # w = λ^q or 1 + q computed in float64 and rounded once to the input's dtype is what the
    # layer receives: the features w_i·x_i (apply_to="features") and the logit bias log w_j
    # ("logits"); in bfloat16, q, q·ln λ and exp were each rounded (errors 4x one rounding)
    torch.manual_seed(0)
    x64, adj = _graph()
    x = x64.to(dtype)
    q = torch.tensor([0.3, 1.7, 2.9, 0.55], dtype=torch.float64)
    log_w = q * torch.log(torch.tensor(3.0, dtype=torch.float64)) if grading == "exponential" \
        else torch.log1p(q)
    for apply_to in ("features", "logits"):
        layer = GradedGraphAttention(3, 2, grading=grading, base=3.0, apply_to=apply_to,
                                     dtype=dtype)
        got = layer(x, adj, grades=q)
        if apply_to == "features":
            expected = layer.layer((x.double() * log_w.exp()[:, None]).to(dtype), adj)
        else:
            expected = layer.layer(x, adj, logit_bias=log_w.to(dtype).reshape(1, 1, 1, 4))
        assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype, bias_dtype", [(torch.bfloat16, torch.float32),
                                               (torch.float32, torch.float64)])
def test_a_logit_bias_in_another_dtype_is_added_in_the_logits_dtype(dtype, bias_dtype):
    # a float32 bias on bfloat16 logits promoted the weights to float32, and α @ messages
    # raised "expected scalar type Float but found BFloat16"
    torch.manual_seed(0)
    x, adj = _graph()
    layer = GradedGraphAttention(3, 2, dtype=dtype).layer
    bias = torch.tensor([0.5, -1.0, 2.0, 0.0])
    got = layer(x.to(dtype), adj, logit_bias=bias.to(bias_dtype))
    assert got.dtype == dtype
    assert torch.equal(got, layer(x.to(dtype), adj, logit_bias=bias.to(dtype)))
