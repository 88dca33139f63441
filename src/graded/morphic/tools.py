"""External tools as typed morphisms (004 §3, Prop 3.14, Ex. 3.17).

A tool τ: X → Y (a Python callable) becomes the block φ_{h←g} = Enc_h ∘ τ ∘ Dec_g, with typed maps
Dec_g: V_g → X and Enc_h: Y → V_h such that Dec ∘ Enc = Id on the finite domain (notes B13). The
block is not differentiable: its output carries no gradient, but its utility ΔL_t is computed like
any other edge's, so the router learns when calling it helps.
"""

from __future__ import annotations

import ast
import math
import numbers
import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from graded.checks import check_float, check_int


class OneHotEncoder:
    """Enc: {0..n−1} → ℝ^n, x ↦ scale·e_x."""

    def __init__(self, n: int, scale: float = 1.0) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"n must be a positive int, got {n!r}")
        # scale ≤ 0 or NaN would break Dec ∘ Enc = Id (argmax of −e_x or of NaN), ±inf give NaN
        self.n, self.scale = n, check_float("scale", scale, minimum=0, strict_min=True)

    def __call__(self, values: Tensor) -> Tensor:
        if values.dtype != torch.long:
            raise TypeError(f"values must be a LongTensor, got {values.dtype}")
        if values.numel() and (int(values.min()) < 0 or int(values.max()) >= self.n):
            raise ValueError(f"values must lie in [0, {self.n}), got range "
                             f"[{int(values.min())}, {int(values.max())}]")
        return torch.nn.functional.one_hot(values, self.n).float() * self.scale


class ArgmaxDecoder:
    """Dec: ℝ^n → {0..n−1}, x ↦ argmax_i x_i (left inverse of ``OneHotEncoder`` for scale > 0)."""

    def __call__(self, x: Tensor) -> Tensor:
        return x.argmax(dim=-1)


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class Calculator:
    """An integer calculator: evaluates expressions like ``"(7 + 3) % 11"`` (+, −, ×, //, %).

    It parses with ``ast`` and evaluates only integer literals and those operators, so it never
    runs arbitrary code.
    """

    def __call__(self, expression: str) -> int:
        if not isinstance(expression, str):
            raise TypeError(f"expression must be a str, got {type(expression).__name__}")
        return self._eval(ast.parse(expression, mode="eval").body)

    def _eval(self, node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:  # not True / False
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self._eval(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](self._eval(node.left), self._eval(node.right))
        raise ValueError(f"unsupported expression element {ast.dump(node)}; expected int "
                         "literals, unary - and the operators + - * // %")


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # the results are gathered in a long tensor


class ExternalTool(nn.Module):
    """φ_{h←g}(x) = encode(fn(decode(x))) per token, run outside autograd (004 Ex. 3.17).

    ``fn`` is called once per distinct decoded value in a call (a finite domain keeps this cheap).
    ``calls`` counts those calls and ``rows`` the token rows decoded, over the tool's lifetime; a
    routed layer with sparse execution hands the tool only the tokens routed to it.

    ``fn`` returns an integer, the value that ``encode`` maps to V_h (a token id or class index
    of a ``OneHotEncoder``): an int, a NumPy integer or bool, or a float with an integral value
    (3.0 is 3), within the int64 range. Any other result raises a ValueError naming the tool,
    its input and the value; ``int(...)`` truncated 2.7 to 2, so a tool computing the wrong
    thing ran on silently.
    """

    differentiable = False
    token_local = True
    reads_dest = False

    def __init__(
        self, fn: Callable[[Any], Any], *, decode: Callable[[Tensor], Tensor],
        encode: Callable[[Tensor], Tensor], name: str = "tool",
    ) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self.fn, self.decode, self.encode, self.name = fn, decode, encode, name
        self.calls = 0
        self.rows = 0

    def forward(self, x_src: Tensor, x_dst: Tensor | None = None) -> Tensor:
        with torch.no_grad():
            values = self.decode(x_src)
            unique, inverse = torch.unique(values, return_inverse=True)
            results = torch.tensor([self._integer(int(v)) for v in unique.tolist()],
                                   dtype=torch.long, device=values.device)
            self.calls += unique.numel()
            self.rows += values.numel()
            try:
                out = self.encode(results[inverse])
            except ValueError as exc:  # e.g. a result outside the encoder's domain {0..n−1}
                pairs = dict(zip(unique.tolist(), results.tolist()))
                raise ValueError(f"tool {self.name!r}: encode refused its results {pairs} "
                                 f"(input: result): {exc}") from exc
        return out.to(x_src.dtype)

    def _integer(self, x: int) -> int:
        """fn(x) as the int it equals; a ValueError for a result that is not an integer, or
        one outside the int64 range of the tensor the results are gathered in."""
        value = self.fn(x)
        try:
            integer = operator.index(value)  # int, bool, NumPy integers
        except TypeError:
            if not (isinstance(value, numbers.Real) and math.isfinite(value)
                    and float(value).is_integer()):
                raise ValueError(
                    f"tool {self.name!r} returned {value!r} for the input {x}; expected an "
                    "integer (or a float with an integral value), which encode maps to a token"
                ) from None
            integer = int(value)
        if not _INT64_MIN <= integer <= _INT64_MAX:
            raise ValueError(
                f"tool {self.name!r} returned {value!r} for the input {x}, outside the int64 "
                f"range [{_INT64_MIN}, {_INT64_MAX}] of the token ids encode takes"
            )
        return integer


def calculator_adder(k: int, p: int, *, scale: float = 1.0, calculator: Calculator | None = None
                     ) -> ExternalTool:
    """The tool x ↦ (x + k) mod p computed by ``Calculator`` on the string "(x + k) % p".

    ``k`` and ``p`` are checked here, as ints (p ≥ 1): a float k was written into the string
    and refused by the calculator only at the first forward pass, as an "unsupported
    expression element" naming neither k nor the tool."""
    k, p = check_int("k", k), check_int("p", p, minimum=1)
    calc = calculator or Calculator()
    return ExternalTool(
        lambda x: calc(f"({x} + {k}) % {p}"),
        decode=ArgmaxDecoder(), encode=OneHotEncoder(p, scale), name=f"calc_add_{k}",
    )


def round_trip_mismatches(
    tool: ExternalTool, fn: Callable[[int], int], domain: Iterable[int], encode_input:
    Callable[[Tensor], Tensor]
) -> list[int]:
    """Inputs x of the domain with Dec(φ(Enc x)) ≠ fn(x) (Prop 3.14: the block realises fn)."""
    xs = torch.tensor(list(domain), dtype=torch.long)
    out = tool.decode(tool(encode_input(xs)))
    return [int(x) for x, y in zip(xs.tolist(), out.tolist()) if y != fn(int(x))]
