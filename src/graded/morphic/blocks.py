"""Block maps φ_{h←g}: V_g → V_h (004 Defs 2.2, 2.5; §4.1.3) other than attention.

Every block is called as ``block(x_src, x_dst) -> y`` with x_src = z^{(g)} (B, T, d_g),
x_dst = z^{(h)} (B, T, d_h) and y of shape (B, T, d_h). Blocks that are maps of the source only
ignore ``x_dst``; grade-typed attention (``attention_block.py``) reads both. A block whose
``differentiable`` attribute is False (external tools) gets no gradient through its output.
A block whose ``token_local`` attribute is True computes each token's output from that token's
rows alone, so a routed layer may run it on the routed rows only (sparse execution, ``layer.py``);
blocks without it (attention mixes tokens) run on the whole sequence. A block whose ``reads_dest``
attribute is False ignores ``x_dst`` (sparse execution then does not gather it); a block without
the attribute is assumed to read it. A block whose ``d_in`` and ``d_out`` attributes are set
declares the grade dimensions it maps between; ``MorphicLayer`` checks them against its edges
when it is built, and checks every block's output width when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from graded._precision import held_precision, widen_loaded
from graded.checks import check_finite, check_float

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "tanh": torch.tanh}


class _FixedBuffers:
    """A block whose fixed maps (the buffers named in ``_built``, with the dtype each was
    built in) are never held in a narrower dtype than that, whatever the block is cast to
    (``graded._precision``, as the conjugating diagonals D_g of :mod:`graded.morphic.banded`):
    a wider cast (``.double()`` of a float32 tool) is followed, a narrower one keeps the
    buffer, and each use casts it to the dtype it meets. Cast with the block, a float64 tool
    taken to bfloat16 and back kept 1/3 as 0.333984375 for good."""

    _built: dict[str, torch.dtype]

    def _held(self) -> dict[str, Callable[[torch.dtype], torch.dtype]]:
        built = self.__dict__.get("_built", {})  # none in a block pickled before it existed
        return {name: (lambda dtype, at=at: torch.promote_types(dtype, at))
                for name, at in built.items()}

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> nn.Module:
        with held_precision(self, self._held()):
            super()._apply(fn, recurse)
        return self

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        widen_loaded(state_dict, prefix, self._held())  # a narrower tool of an older state dict
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _check_dims(**dims: int) -> None:
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


class LinearBlock(nn.Module):
    """Linear block φ(x) = A x (+ b); bias off by default so blocks stay linear (004 Def 2.2).

    004 App. B uses ``nn.Linear`` with bias; an affine block breaks the linear-block theory
    (block-orthogonality, conjugation invariance), hence the default.
    """

    differentiable = True
    token_local = True
    reads_dest = False

    def __init__(self, d_in: int, d_out: int, *, bias: bool = False, init: str = "default") -> None:
        super().__init__()
        _check_dims(d_in=d_in, d_out=d_out)
        self.d_in, self.d_out = d_in, d_out
        self.proj = nn.Linear(d_in, d_out, bias=bias)
        if init == "identity":
            if d_in != d_out:
                raise ValueError(f"identity init needs d_in == d_out, got {d_in} and {d_out}")
            with torch.no_grad():
                self.proj.weight.copy_(torch.eye(d_in))
                if bias:
                    self.proj.bias.zero_()
        elif init != "default":
            raise ValueError(f"init must be 'default' or 'identity', got {init!r}")

    def forward(self, x_src: Tensor, x_dst: Tensor | None = None) -> Tensor:
        return self.proj(x_src)


class FFNBlock(nn.Module):
    """Per-edge FFN φ^{ff}_{h←g} = W_2 σ(W_1 x) (004 §2.1.2, §4.1.3), biases off by default."""

    differentiable = True
    token_local = True
    reads_dest = False

    def __init__(
        self, d_in: int, d_out: int, hidden: int, *, activation: str = "gelu", bias: bool = False
    ) -> None:
        super().__init__()
        _check_dims(d_in=d_in, d_out=d_out, hidden=hidden)
        self.d_in, self.d_out = d_in, d_out
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.w1 = nn.Linear(d_in, hidden, bias=bias)
        self.w2 = nn.Linear(hidden, d_out, bias=bias)
        self.act = _ACTIVATIONS[activation]

    def forward(self, x_src: Tensor, x_dst: Tensor | None = None) -> Tensor:
        return self.w2(self.act(self.w1(x_src)))


class FixedLinearBlock(_FixedBuffers, nn.Module):
    """A frozen linear morphism x ↦ M x (a buffer, not a parameter): an internalised tool.

    ``FixedLinearBlock.cyclic_shift(p, k)`` is the adder A_k of 004 App. A.3 (A_k e_d = e_{d+k}).
    M is held in the dtype it is built in at least, whatever the block is cast to: a float64
    tool stays float64 through ``.bfloat16()`` and is exact again after ``.double()``; a
    float32 one follows a cast to float64. Each call casts M to the input's dtype.
    """

    differentiable = True
    token_local = True
    reads_dest = False

    def __init__(self, matrix: Tensor) -> None:
        super().__init__()
        if not isinstance(matrix, Tensor) or matrix.dim() != 2 or 0 in matrix.shape:
            raise ValueError(f"matrix must be a 2-D Tensor, got "
                             f"{getattr(matrix, 'shape', matrix)}; expected a (d_out, d_in) "
                             f"matrix with d_out, d_in >= 1")
        check_finite(matrix, "matrix")
        # a floating matrix keeps its precision (a float64 tool stays exact in a float64 model);
        # an integer one (a permutation) becomes the default float dtype
        matrix = matrix if matrix.is_floating_point() else matrix.to(torch.get_default_dtype())
        self.register_buffer("matrix", matrix.detach().clone())
        self._built = {"matrix": matrix.dtype}  # never held narrower (_FixedBuffers)
        self.d_out, self.d_in = matrix.shape

    @classmethod
    def cyclic_shift(cls, p: int, k: int) -> FixedLinearBlock:
        _check_dims(p=p)
        return cls(torch.roll(torch.eye(p), shifts=k, dims=0))

    def forward(self, x_src: Tensor, x_dst: Tensor | None = None) -> Tensor:
        return x_src @ self.matrix.to(x_src.dtype).T


class RetrievalBlock(_FixedBuffers, nn.Module):
    """Finite-memory retrieval φ_{ret←sem}(z) = softmax(Qᵀ W_q z / σ²) (004 §5.3.2).

    ``keys`` is (k, d_q); the output lies in V_ret = ℝ^k (the retrieval weights r). With a key
    margin γ at i* the mass obeys r_{i*} ≥ 1/(1 + (k−1)e^{−γ/σ²}); 004 Prop 5.7 prints
    1 − e^{−γ/σ²}, which omits the factor (k − 1) (notes G9). The keys, a fixed memory, are
    held in the dtype they are given in at least, as :class:`FixedLinearBlock`'s matrix is.
    """

    differentiable = True
    token_local = True
    reads_dest = False

    def __init__(
        self, keys: Tensor, d_in: int, *, temperature: float = 1.0, learn_query: bool = True
    ) -> None:
        super().__init__()
        if not isinstance(keys, Tensor) or keys.dim() != 2 or 0 in keys.shape:
            got = (f"shape {tuple(keys.shape)}" if isinstance(keys, Tensor)
                   else type(keys).__name__)
            raise ValueError(f"keys must be (k, d_q), got {got}; expected a 2-D Tensor with "
                             f"k, d_q >= 1")
        _check_dims(d_in=d_in)
        # NaN compares false with 0: the one check of a number refuses it (and ±inf) by name
        temperature = check_float("temperature σ²", temperature, minimum=0, strict_min=True)
        if not keys.is_floating_point():
            raise TypeError(f"keys must be a floating tensor, got {keys.dtype}")
        check_finite(keys, "keys")
        self.register_buffer("keys", keys.detach().clone())
        self._built = {"keys": keys.dtype}  # never held narrower (_FixedBuffers)
        self.d_in, self.d_out = d_in, keys.shape[0]
        self.temperature = float(temperature)
        self.query = nn.Linear(d_in, keys.shape[1], bias=False)
        if not learn_query:
            if d_in != keys.shape[1]:
                raise ValueError(f"a fixed identity query needs d_in == d_q = {keys.shape[1]}")
            with torch.no_grad():
                self.query.weight.copy_(torch.eye(d_in))
            self.query.weight.requires_grad_(False)

    def forward(self, x_src: Tensor, x_dst: Tensor | None = None) -> Tensor:
        q = self.query(x_src)
        scores = q @ self.keys.to(q.dtype).T  # keys given in another dtype, as FixedLinearBlock
        return torch.softmax(scores / self.temperature, dim=-1)


def init_small_(module: nn.Module, std: float = 0.02) -> None:
    """N(0, std²) initialisation of every weight matrix (004 App. B uses 0.02 for W_{h←g})."""
    for p in module.parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, std=std)
