"""Morphic blocks, banded blocks, tools and the state space: the input checks no other test
reaches, and the identity / fixed-query options against hand computations."""

import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from graded.morphic.banded import BandedBlocks, ConjugatedBlocks
from graded.morphic.blocks import (
    FFNBlock,
    FixedLinearBlock,
    LinearBlock,
    RetrievalBlock,
    init_small_,
)
from graded.morphic.state import Grade, GradedStateSpace
from graded.morphic.tools import ArgmaxDecoder, Calculator, ExternalTool, OneHotEncoder

# -- blocks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_in", [0, -2, 2.0])
def test_linear_block_rejects_a_non_positive_int_dim(d_in):
    with pytest.raises(ValueError, match=rf"d_in must be a positive int, got {d_in!r}"):
        LinearBlock(d_in, 3)


def test_identity_init_needs_square_and_is_the_identity():
    with pytest.raises(ValueError, match=r"identity init needs d_in == d_out, got 3 and 4"):
        LinearBlock(3, 4, init="identity")
    block = LinearBlock(3, 3, bias=True, init="identity")
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(block(x), x)  # weight = I, bias zeroed
    with pytest.raises(ValueError, match=r"init must be 'default' or 'identity', got 'ones'"):
        LinearBlock(3, 3, init="ones")


def test_ffn_block_rejects_an_unknown_activation():
    with pytest.raises(ValueError, match=r"activation must be one of \[.*'gelu'.*\], got 'elu'"):
        FFNBlock(2, 2, 4, activation="elu")


@pytest.mark.parametrize("matrix", [torch.ones(3), [[1.0, 0.0]]])
def test_fixed_linear_block_needs_a_2d_tensor(matrix):
    with pytest.raises(ValueError, match=r"matrix must be a 2-D Tensor, got "):
        FixedLinearBlock(matrix)


def test_retrieval_block_checks_keys_and_temperature():
    with pytest.raises(ValueError, match=r"keys must be \(k, d_q\), got shape \(4,\)"):
        RetrievalBlock(torch.ones(4), 2)
    with pytest.raises(ValueError, match=r"temperature σ² must be > 0, got 0"):
        RetrievalBlock(torch.ones(4, 2), 2, temperature=0)
    with pytest.raises(TypeError, match=r"keys must be a floating tensor, got torch.int64"):
        RetrievalBlock(torch.ones(4, 2, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"fixed identity query needs d_in == d_q = 2"):
        RetrievalBlock(torch.ones(4, 2), 3, learn_query=False)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -0.5])
def test_retrieval_block_refuses_a_nan_or_infinite_temperature_by_name(temperature):
    """NaN passed `temperature <= 0` and made every retrieval weight NaN."""
    with pytest.raises(ValueError, match="temperature σ²"):
        RetrievalBlock(torch.ones(4, 2), 2, temperature=temperature)


def test_retrieval_block_with_fixed_query_is_softmax_of_key_scores():
    g = torch.Generator().manual_seed(0)
    keys, x = torch.randn(4, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    block = RetrievalBlock(keys, 3, temperature=0.5, learn_query=False)
    assert not block.query.weight.requires_grad
    scores = torch.einsum("btd,kd->btk", x, keys) / 0.5
    ref = scores.exp() / scores.exp().sum(-1, keepdim=True)
    torch.testing.assert_close(block(x), ref)


def test_init_small_draws_matrices_only_with_the_given_std():
    torch.manual_seed(0)
    module = nn.Linear(400, 300, bias=True)
    with torch.no_grad():
        module.bias.fill_(7.0)
    init_small_(module, std=0.05)
    assert torch.equal(module.bias, torch.full((300,), 7.0))  # vectors untouched
    w = module.weight.detach()
    assert abs(float(w.mean())) < 1e-3 and abs(float(w.std()) - 0.05) < 1e-3


# -- banded blocks -----------------------------------------------------------------------------


def _space(dims=(2, 2, 2)):
    return GradedStateSpace([Grade(f"g{i}", d, i) for i, d in enumerate(dims)])


def test_banded_blocks_need_equal_dims():
    with pytest.raises(ValueError, match=r"equal grade dims, got \[2, 3, 2\]"):
        BandedBlocks(_space((2, 3, 2)), [1])


def test_banded_kind_checks():
    with pytest.raises(ValueError, match=r"kind='ffn' needs hidden=<width>"):
        BandedBlocks(_space(), [1], kind="ffn")
    with pytest.raises(ValueError, match=r"kind must be 'linear' or 'ffn', got 'conv'"):
        BandedBlocks(_space(), [1], kind="conv")


def test_banded_ffn_kernels_are_shared_per_shift():
    banded = BandedBlocks(_space(), [1], kind="ffn", hidden=5)
    blocks = banded.blocks()
    assert len(blocks) == 2  # g0→g1, g1→g2
    x = torch.randn(3, 2)
    torch.testing.assert_close(blocks[0](x), blocks[1](x))  # one K_δ for both edges
    assert isinstance(banded.kernels["1"], FFNBlock)


def test_conjugated_blocks_need_exactly_one_of_base_and_scales():
    with pytest.raises(ValueError, match=r"exactly one of base .* got base=None and scales=None"):
        ConjugatedBlocks(_space(), [1])
    with pytest.raises(ValueError, match=r"got base=2.0 and scales=\{"):
        ConjugatedBlocks(_space(), [1], base=2.0, scales={"g0": torch.ones(2)})


def test_conjugated_scales_are_checked_per_grade():
    ones = torch.ones(2)
    with pytest.raises(ValueError, match=r"scales is missing grade 'g2'"):
        ConjugatedBlocks(_space(), [1], scales={"g0": ones, "g1": ones})
    with pytest.raises(ValueError, match=r"scales\['g1'\] must be positive of shape \(2,\), "
                                         r"got \[1.0, -1.0\]"):
        ConjugatedBlocks(_space(), [1], scales={"g0": ones, "g1": [1.0, -1.0], "g2": ones})
    with pytest.raises(ValueError, match=r"scales\['g0'\] must be positive of shape \(2,\), "
                                         r"got \[1.0, 1.0, 1.0\]"):
        ConjugatedBlocks(_space(), [1], scales={"g0": torch.ones(3), "g1": ones, "g2": ones})


def test_conjugated_block_with_diagonal_scales_is_d_h_k_d_g_inverse():
    scales = {"g0": torch.tensor([1.0, 2.0]), "g1": torch.tensor([3.0, 0.5]),
              "g2": torch.tensor([1.5, 4.0])}
    conj = ConjugatedBlocks(_space(), [1], scales=scales)
    k = conj.kernels["1"].proj.weight
    x = torch.randn(4, 2)
    for block, (src, dst) in zip(conj.blocks(), [("g0", "g1"), ("g1", "g2")]):
        ref = (torch.diag(scales[dst]) @ k @ torch.diag(1 / scales[src]) @ x.T).T
        torch.testing.assert_close(block(x), ref)


# -- tools -------------------------------------------------------------------------------------


def test_one_hot_encoder_checks():
    with pytest.raises(ValueError, match=r"n must be a positive int, got 0"):
        OneHotEncoder(0)
    enc = OneHotEncoder(3)
    with pytest.raises(TypeError, match=r"values must be a LongTensor, got torch.float32"):
        enc(torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"values must lie in \[0, 3\), got range \[-1, 3\]"):
        enc(torch.tensor([-1, 3]))


def test_calculator_and_tool_reject_wrong_types():
    with pytest.raises(TypeError, match=r"expression must be a str, got int"):
        Calculator()(7)
    with pytest.raises(TypeError, match=r"fn must be callable, got int"):
        ExternalTool(3, decode=lambda x: x, encode=lambda x: x)


@pytest.mark.parametrize("result", [2.7, np.float32(0.5), math.nan, math.inf, "2", None])
def test_a_tool_result_that_is_not_an_integer_is_refused_naming_tool_input_and_value(result):
    # int(2.7) == 2: the tool ran on with a truncated result; int(nan) raised a bare ValueError
    tool = ExternalTool(lambda x: result, decode=ArgmaxDecoder(), encode=OneHotEncoder(4),
                        name="halve")
    with pytest.raises(ValueError, match=re.escape(
            f"tool 'halve' returned {result!r} for the input 1; expected an integer (or a float "
            "with an integral value), which encode maps to a token")):
        tool(OneHotEncoder(4)(torch.tensor([[1, 1]])))


@pytest.mark.parametrize("result", [3, 3.0, np.int64(3), np.float64(3.0), True])
def test_a_tool_result_of_integral_value_is_encoded_as_that_token(result):
    tool = ExternalTool(lambda x: result, decode=ArgmaxDecoder(), encode=OneHotEncoder(4))
    out = tool(OneHotEncoder(4)(torch.tensor([[0, 2]])))
    token = 1 if result is True else 3  # int(True) == 1
    expected = torch.zeros(1, 2, 4)
    expected[..., token] = 1.0
    torch.testing.assert_close(out, expected)


# -- state space -------------------------------------------------------------------------------


def test_grade_index_must_be_int():
    with pytest.raises(TypeError, match=r"grade 'a': index must be an int or None, got 1.5"):
        Grade("a", 2, 1.5)


def test_space_checks():
    with pytest.raises(ValueError, match=r"at least one grade, got none"):
        GradedStateSpace({})
    with pytest.raises(ValueError, match=r"grade indices must be unique, got \[0, 0\]"):
        GradedStateSpace([Grade("a", 2, 0), Grade("b", 2, 0)])
    space = GradedStateSpace({"a": 2, "b": 3})
    with pytest.raises(ValueError, match=r"grade 'a' has no integer index"):
        space.index("a")
    with pytest.raises(TypeError, match=r"state must be a Tensor, got list"):
        space.check_state([0.0] * 5)
    with pytest.raises(ValueError, match=r"component for grade 'b' has size 2, expected 3"):
        space.include(torch.ones(2), "b")
    with pytest.raises(ValueError, match=r"missing components for grades \['b'\]"):
        space.join({"a": torch.ones(2)})
    with pytest.raises(ValueError, match=r"unknown grades \['c'\]; expected \['a', 'b'\]"):
        space.join({"a": torch.ones(2), "b": torch.ones(3), "c": torch.ones(1)})


@pytest.mark.parametrize("result", [2**63, -(2**63) - 1, 2**70, 2.0**70, np.uint64(2**63)])
def test_a_tool_result_beyond_int64_is_refused_naming_tool_input_value_and_range(result):
    # torch.tensor raised "Overflow when unpacking long long", naming neither tool nor value
    tool = ExternalTool(lambda x: result, decode=ArgmaxDecoder(), encode=OneHotEncoder(4),
                        name="square")
    with pytest.raises(ValueError, match=re.escape(
            f"tool 'square' returned {result!r} for the input 1, outside the int64 range "
            "[-9223372036854775808, 9223372036854775807] of the token ids encode takes")):
        tool(OneHotEncoder(4)(torch.tensor([[1, 1]])))


@pytest.mark.parametrize("result", [2**63 - 1, -(2**63)])
def test_a_tool_result_at_the_ends_of_int64_reaches_encode(result):
    """The ends of the range are taken: encode receives them as they are (and refuses them
    itself as token ids, naming the value)."""
    seen = []
    tool = ExternalTool(lambda x: result, decode=ArgmaxDecoder(),
                        encode=lambda ids: seen.append(ids.tolist()) or torch.zeros(2, 4))
    tool(OneHotEncoder(4)(torch.tensor([1, 1])))
    assert seen == [[result, result]]
