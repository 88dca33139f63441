import math

import pytest
import torch
from torch.nn import functional as F

from graded.morphic import (
    ArgmaxDecoder,
    BandedBlocks,
    Calculator,
    ConjugatedBlocks,
    ExternalTool,
    FixedLinearBlock,
    Grade,
    GradedStateSpace,
    GradeTypedAttention,
    GradewiseNorm,
    LinearBlock,
    OneHotEncoder,
    calculator_adder,
)
from graded.morphic.tools import round_trip_mismatches


def test_linear_block_has_no_bias_by_default_and_is_linear():
    blk = LinearBlock(3, 4)
    assert blk.proj.bias is None
    x, y = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    torch.testing.assert_close(blk(2 * x - y), 2 * blk(x) - blk(y))


def test_cyclic_shift_adders_form_the_group_z_mod_p():
    p = 7
    for k in range(p):
        a = FixedLinearBlock.cyclic_shift(p, k).matrix
        for d in range(p):
            assert int(a[:, d].argmax()) == (d + k) % p
        torch.testing.assert_close(a.T, FixedLinearBlock.cyclic_shift(p, -k).matrix)
    a2, a3 = (FixedLinearBlock.cyclic_shift(p, k).matrix for k in (2, 3))
    torch.testing.assert_close(a2 @ a3, FixedLinearBlock.cyclic_shift(p, 5).matrix)


@pytest.mark.parametrize("value_source", ["dest", "source"])
def test_grade_typed_attention_matches_the_per_position_formula(value_source):
    torch.manual_seed(0)
    d_src, d_dst, heads, dh = 3, 5, 2, 4
    att = GradeTypedAttention(d_src, d_dst, num_heads=heads, head_dim=dh, value_source=value_source)
    xs, xd = torch.randn(2, 6, d_src), torch.randn(2, 6, d_dst)
    got = att(xs, xd)
    wq = att.q.weight.view(heads, dh, d_src)
    wk = att.k.weight.view(heads, dh, d_dst)
    wv = att.v.weight.view(heads, dh, -1)
    u = att.out.weight.view(d_dst, heads, dh)
    xv = xd if value_source == "dest" else xs
    want = torch.zeros_like(got)
    for b in range(2):
        for t in range(6):
            for a in range(heads):
                q = wq[a] @ xs[b, t]
                scores = torch.stack([q @ (wk[a] @ xd[b, s]) for s in range(t + 1)]) / math.sqrt(dh)
                w = torch.softmax(scores, 0)
                want[b, t] += sum(w[s] * (u[:, a] @ (wv[a] @ xv[b, s])) for s in range(t + 1))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_grade_typed_attention_is_causal():
    att = GradeTypedAttention(3, 3, num_heads=2, head_dim=4)
    xs, xd = torch.randn(1, 6, 3), torch.randn(1, 6, 3)
    y1 = att(xs, xd)
    xs2, xd2 = xs.clone(), xd.clone()
    xs2[:, 4:] += 5
    xd2[:, 4:] -= 5
    torch.testing.assert_close(att(xs2, xd2)[:, :4], y1[:, :4])


def test_identity_value_attention_is_a_convex_combination_of_destination_states():
    att = GradeTypedAttention(3, 4, identity_values=True)
    xd = torch.zeros(1, 3, 4)
    xd[0, 0, 2] = 1.0
    y = att(torch.randn(1, 3, 3), xd)
    assert y[0, 0].argmax() == 2 and torch.all(y[0, :, [0, 1, 3]] == 0)


def test_gradewise_norm_equals_layer_norm_per_slice():
    sp = GradedStateSpace({"a": 3, "b": 5})
    norm = GradewiseNorm(sp, "layer")
    z = torch.randn(4, 8)
    want = torch.cat([F.layer_norm(z[:, :3], (3,)), F.layer_norm(z[:, 3:], (5,))], -1)
    torch.testing.assert_close(norm(z), want)
    rms = GradewiseNorm(sp, "rms")
    want = torch.cat([z[:, :3] / z[:, :3].pow(2).mean(-1, keepdim=True).add(1e-5).sqrt(),
                      z[:, 3:] / z[:, 3:].pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()], -1)
    torch.testing.assert_close(rms(z), want)


def banded_space():
    return GradedStateSpace([Grade(f"g{i}", 4, i) for i in range(4)])


def test_banded_blocks_share_one_kernel_per_shift():
    sp = banded_space()
    bb = BandedBlocks(sp, [0, 1])
    blocks = bb.blocks()
    x = torch.randn(2, 4)
    for e, blk in zip(bb.edge_set, blocks):
        delta = sp.index(e.dest) - sp.index(e.source)
        torch.testing.assert_close(blk(x), x @ bb.kernels[str(delta)].proj.weight.T)
    assert len({id(p) for p in bb.parameters()}) == 2


def test_conjugated_blocks_equal_d_h_k_d_g_inverse_and_scalar_case_is_banded():
    sp = banded_space()
    lam = 1.7
    cb = ConjugatedBlocks(sp, [0, 1], base=lam)
    x = torch.randn(3, 4)
    for e, blk in zip(cb.edge_set, cb.blocks()):
        delta = sp.index(e.dest) - sp.index(e.source)
        k = cb.kernels[str(delta)].proj.weight
        d_g = torch.diag(torch.full((4,), lam ** sp.index(e.source)))
        d_h = torch.diag(torch.full((4,), lam ** sp.index(e.dest)))
        torch.testing.assert_close(blk(x), x @ (d_h @ k @ torch.linalg.inv(d_g)).T)
        torch.testing.assert_close(blk(x), lam**delta * (x @ k.T))  # = banded with λ^δ K̂_δ
    scales = {g: torch.rand(4) + 0.5 for g in sp.labels}
    cg = ConjugatedBlocks(sp, [1], scales=scales)
    for e, blk in zip(cg.edge_set, cg.blocks()):
        k = cg.kernels["1"].proj.weight
        want = x @ (torch.diag(scales[e.dest]) @ k @ torch.diag(1 / scales[e.source])).T
        torch.testing.assert_close(blk(x), want)


def test_calculator_evaluates_integer_arithmetic_and_refuses_code():
    calc = Calculator()
    assert calc("(7 + 8) % 11") == 4
    assert calc("3 * -4 // 5") == 3 * -4 // 5
    with pytest.raises(ValueError, match="unsupported"):
        calc("__import__('os')")


def test_external_tool_realises_the_callable_and_passes_no_gradient():
    p = 11
    tool = calculator_adder(3, p)
    assert not tool.differentiable
    enc = OneHotEncoder(p)
    assert round_trip_mismatches(tool, lambda x: (x + 3) % p, range(p), enc) == []
    x = enc(torch.arange(p)).requires_grad_(True)
    y = tool(x)
    assert not y.requires_grad
    torch.testing.assert_close(ArgmaxDecoder()(y), (torch.arange(p) + 3) % p)


def test_external_tool_calls_the_callable_once_per_distinct_value():
    seen = []
    tool = ExternalTool(lambda v: seen.append(v) or v, decode=ArgmaxDecoder(),
                        encode=OneHotEncoder(4))
    tool(OneHotEncoder(4)(torch.tensor([[1, 1, 2, 1]])))
    assert sorted(seen) == [1, 2]
