"""Fixed blocks keep their tool exact through casts: the matrix of :class:`FixedLinearBlock`
and the keys of :class:`RetrievalBlock` are never held narrower than they were built.

Cast with the block, a float64 matrix taken to bfloat16 and back kept 1/3 as 0.333984375 for
good, and every output of the float64 model after it was off by up to 0.2%.
"""

import io
import math

import pytest
import torch
from torch import nn

from graded.morphic import FixedLinearBlock, RetrievalBlock

F64 = torch.float64
MATRIX = [[1 / 3, 0.1, -2.7], [0.2, 1 + 1e-9, math.pi]]  # none a bfloat16 (or float32) number

CASTS = {
    "to(bfloat16)": lambda m: m.to(torch.bfloat16),
    "bfloat16()": lambda m: m.bfloat16(),
    "half()": lambda m: m.half(),
    "float()": lambda m: m.float(),
    "to(device=cpu, dtype=bfloat16)": lambda m: m.to(device="cpu", dtype=torch.bfloat16),
}


def by_hand(matrix, x):
    """M x for each row x, a naive float64 loop."""
    return torch.tensor([[sum(matrix[i][j] * float(row[j]) for j in range(len(row)))
                          for i in range(len(matrix))] for row in x.reshape(-1, x.shape[-1])],
                        dtype=F64).reshape(*x.shape[:-1], len(matrix))


@pytest.mark.parametrize("cast", list(CASTS))
def test_a_float64_tool_survives_a_narrow_cast_and_back(cast):
    # inside a model: the cast reaches the block through its parent
    model = nn.Sequential(FixedLinearBlock(torch.tensor(MATRIX, dtype=F64)), nn.Linear(2, 2))
    CASTS[cast](model)
    narrow = model[1].weight.dtype
    assert model[0].matrix.dtype == F64  # held at the precision it was built in
    x = torch.randn(2, 5, 3).to(narrow)
    y = model[0](x)
    assert y.dtype == narrow  # each use casts it to the input's dtype
    model.double()
    block = model[0]
    assert block.matrix.dtype == F64
    assert torch.equal(block.matrix, torch.tensor(MATRIX, dtype=F64))  # bit for bit
    x = torch.randn(2, 5, 3, dtype=F64)
    torch.testing.assert_close(block(x), by_hand(MATRIX, x), rtol=1e-15, atol=1e-15)


def test_a_float32_tool_follows_a_wider_cast_and_keeps_float32_through_a_narrower_one():
    block = FixedLinearBlock(torch.tensor(MATRIX))
    block.double()
    assert block.matrix.dtype == F64  # widened (exactly) with the model
    block.bfloat16()
    assert block.matrix.dtype == torch.float32
    assert torch.equal(block.matrix, torch.tensor(MATRIX))
    block.double()
    assert torch.equal(block.matrix, torch.tensor(MATRIX).double())
    shift = FixedLinearBlock.cyclic_shift(5, 2).half()  # the adder A_k: exact in any dtype
    assert shift.matrix.dtype == torch.float32
    x = torch.eye(5, dtype=torch.float16)
    assert torch.equal(shift(x), torch.roll(torch.eye(5), 2, dims=0).T.half())


def test_the_state_dict_of_a_float64_tool_cast_to_bfloat16_is_still_exact():
    block = FixedLinearBlock(torch.tensor(MATRIX, dtype=F64)).bfloat16()
    buffer = io.BytesIO()
    torch.save(block.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert torch.equal(loaded["matrix"], torch.tensor(MATRIX, dtype=F64))
    other = FixedLinearBlock(torch.zeros(2, 3, dtype=F64))
    other.load_state_dict(loaded, assign=True)
    assert torch.equal(other.matrix, torch.tensor(MATRIX, dtype=F64))
    # an older state dict with a bfloat16 matrix loads widened into the float64 buffer (the
    # precision it lost is not recovered)
    old = {"matrix": torch.tensor(MATRIX, dtype=torch.bfloat16)}
    other.load_state_dict(old, assign=True)
    assert other.matrix.dtype == F64
    assert torch.equal(other.matrix, old["matrix"].double())


def test_float64_retrieval_keys_survive_a_narrow_cast_and_back():
    keys = torch.tensor(MATRIX, dtype=F64)  # (k = 2, d_q = 3)
    block = RetrievalBlock(keys, 3, temperature=0.5, learn_query=False)
    block.bfloat16()
    assert block.keys.dtype == F64 and block.query.weight.dtype == torch.bfloat16
    assert block(torch.randn(4, 3, dtype=torch.bfloat16)).dtype == torch.bfloat16
    block.double()
    assert torch.equal(block.keys, keys)
    x = torch.randn(4, 3, dtype=F64)
    scores = by_hand(MATRIX, x) / 0.5  # identity query: Qᵀ z / σ²
    torch.testing.assert_close(block(x), torch.softmax(scores, dim=-1), rtol=1e-15, atol=1e-15)
