"""Conjugated blocks (004 Def 2.8, Prop 2.9) keep their diagonals D_g exact through casts."""

import io

import pytest
import torch

from graded.morphic.banded import ConjugatedBlocks
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.state import Grade, GradedStateSpace

LAMBDA = 1.1  # λ^index is not a float32 number: 1.1³ = 1.331 is 1.33100008964 in float32


def _space(n: int = 4, d: int = 3) -> GradedStateSpace:
    return GradedStateSpace([Grade(f"g{i}", d, i) for i in range(n)])


def _shift_one_outputs(blocks: ConjugatedBlocks, x: torch.Tensor) -> list[torch.Tensor]:
    return [block(x) for block in blocks.blocks()]


@pytest.mark.parametrize("cast", ["double", "bfloat16_then_double"])
def test_float64_conjugated_blocks_equal_lambda_to_the_shift_times_the_kernel(cast):
    # scalar D_g = λ^g: D_{g+1} K̂ D_g⁻¹ x = λ K̂ x, with λ = 1.1 as a Python float (float64).
    # The D_g were float32 buffers: relative error 2–5·10⁻⁸ in a float64 model, and a cast to
    # bfloat16 and back left D_3 = 1.328125 (−0.2%) for good
    torch.manual_seed(0)
    blocks = ConjugatedBlocks(_space(), [1], base=LAMBDA)
    if cast == "bfloat16_then_double":
        blocks = blocks.bfloat16()
        with torch.no_grad():  # the kernel's weights exact again, so only D_g is compared
            blocks.kernels["1"].proj.weight.copy_(torch.randn(3, 3))
    blocks = blocks.double()
    kernel = blocks.kernels["1"].proj.weight
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    expected = LAMBDA * (x @ kernel.T)  # independent: λ^δ K̂ x, δ = 1
    for y in _shift_one_outputs(blocks, x):
        assert y.dtype == torch.float64
        torch.testing.assert_close(y, expected, rtol=1e-14, atol=0.0)
    for i in range(4):
        assert blocks.scale(f"g{i}").dtype == torch.float64
        assert blocks.scale(f"g{i}").tolist() == [LAMBDA ** i] * 3


def test_conjugated_blocks_compute_in_the_dtype_of_the_state():
    # held in float64, D_g is cast to the dtype each use meets: a float32 or bfloat16 layer's
    # output keeps its dtype (a float64 D_g must not promote it)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        blocks = ConjugatedBlocks(_space(), [1], base=LAMBDA).to(dtype)
        x = torch.randn(2, 5, 3, dtype=dtype)
        kernel = blocks.kernels["1"].proj.weight
        for i, y in enumerate(_shift_one_outputs(blocks, x)):
            assert y.dtype == dtype
            d_src = torch.tensor(LAMBDA ** i, dtype=torch.float64).to(dtype)
            d_dst = torch.tensor(LAMBDA ** (i + 1), dtype=torch.float64).to(dtype)
            torch.testing.assert_close(y, d_dst * ((x / d_src) @ kernel.T), rtol=0.0, atol=0.0)


def test_a_layer_of_conjugated_blocks_keeps_its_function_through_a_bfloat16_round_trip():
    # the layer's blocks hold their own copies of D_g (per edge), held as ConjugatedBlocks' are;
    # their parameters are put back exactly after the cast, so only D_g could differ
    torch.manual_seed(0)
    space = _space()
    blocks = ConjugatedBlocks(space, [0, 1], scales={
        f"g{i}": torch.tensor([1.1, 1.3, 0.7], dtype=torch.float64) ** i for i in range(4)})
    layer = MorphicLayer(space, blocks.edge_set, blocks).double()
    z = torch.randn(2, 5, space.total_dim, dtype=torch.float64)
    expected = layer(z)[0]
    params = {name: p.detach().clone() for name, p in layer.named_parameters()}
    layer.bfloat16().double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(params[name])
    for i, (block, e) in enumerate(zip(layer.blocks, blocks.edge_set)):
        source = int(e.source[1:])
        assert block.scale_src.dtype == torch.float64
        assert torch.equal(block.scale_src,
                           torch.tensor([1.1, 1.3, 0.7], dtype=torch.float64) ** source), i
    torch.testing.assert_close(layer(z)[0], expected, rtol=0.0, atol=0.0)


def test_float32_diagonals_of_an_older_state_dict_load_as_float64():
    space = _space()
    layer = MorphicLayer(space, EdgeSet.banded(space, [1]),
                         ConjugatedBlocks(space, [1], base=LAMBDA))
    old = {k: (v.float() if "scale" in k else v) for k, v in layer.state_dict().items()}
    buf = io.BytesIO()
    torch.save(old, buf)
    buf.seek(0)
    layer.load_state_dict(torch.load(buf))
    for block in layer.blocks:
        assert block.scale_src.dtype == block.scale_dst.dtype == torch.float64
    # the precision the float32 values lost is not recovered (graded._precision)
    assert float(layer.blocks[2].scale_dst[0]) == float(torch.tensor(LAMBDA ** 3))
