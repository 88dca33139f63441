"""Integers in base b: a sign token followed by the digits (optionally least significant first).

003 §3.1 lists no integer encoding; this is the positional encoding used for arithmetic with
transformers: ``-305`` in base 10 is ``["-", "3", "0", "5"]``, and with ``reverse=True``
``["-", "5", "0", "3"]`` (least significant digit first, which makes carries local in the sense
of 003 §3.1 "locality"). A digit token is the decimal string of the digit value, so any base
b >= 2 works (base 1000 has the 1000 tokens "0".."999").
"""

from __future__ import annotations

from collections.abc import Sequence

from graded.checks import check_bool, check_int
from graded.encodings.base import Codec, DecodeError, short_repr

SIGNS = ("+", "-")


def is_digit_token(token: object) -> bool:
    return isinstance(token, str) and token.isascii() and token.isdigit()


class IntegerCodec(Codec[int]):
    """Signed integers in base ``base``; zero is ``["+", "0"]``.

    Decoding rejects: a missing sign, no digits, a digit >= base, a leading zero, ``-0``.
    """

    def __init__(self, base: int = 10, reverse: bool = False) -> None:
        self.base = check_int("base", base, minimum=2)
        self.reverse = check_bool("reverse", reverse)

    @property
    def tokens(self) -> tuple[str, ...]:
        return (*SIGNS, *(str(d) for d in range(self.base)))

    def digits(self, value: int) -> list[int]:
        """Digits of ``|value|``, most significant first (``[0]`` for zero)."""
        value = abs(check_int("value", value))
        out = []
        while True:
            value, d = divmod(value, self.base)
            out.append(d)
            if value == 0:
                break
        return out[::-1]

    def encode(self, obj: int) -> list[str]:
        value = check_int("integer", obj)
        digits = self.digits(value)
        if self.reverse:
            digits = digits[::-1]
        return ["-" if value < 0 else "+", *(str(d) for d in digits)]

    def read(self, tokens: Sequence[str], pos: int) -> tuple[int, int]:
        """Read one integer starting at ``pos``; return (value, position after its last digit).

        The digits run until the end or the first token that is not a decimal digit string, so
        integers can be embedded in longer sequences (polynomials, matrices).
        """
        if pos >= len(tokens):
            raise DecodeError(f"expected a sign token at position {pos}, found the end")
        sign = tokens[pos]
        if sign not in SIGNS:
            raise DecodeError(f"bad token {sign!r} at position {pos}: expected a sign '+' or '-'")
        end = pos + 1
        digits = []
        while end < len(tokens) and is_digit_token(tokens[end]):
            token = tokens[end]  # its length is checked before int(), which stops at 4300 digits
            if (len(token) > len(str(self.base - 1)) or (len(token) > 1 and token[0] == "0")
                    or int(token) >= self.base):
                raise DecodeError(
                    f"bad digit token {short_repr(token)} at position {end}: base {self.base} "
                    f"digits are 0..{self.base - 1}"
                )
            digits.append(int(token))
            end += 1
        if not digits:
            raise DecodeError(f"sign at position {pos} is followed by no digit")
        if self.reverse:
            digits = digits[::-1]
        if len(digits) > 1 and digits[0] == 0:
            raise DecodeError(f"leading zero in the integer at position {pos}")
        value = 0
        for d in digits:
            value = value * self.base + d
        if sign == "-" and value == 0:
            raise DecodeError(f"negative zero at position {pos}")
        return (-value if sign == "-" else value), end

    def decode(self, tokens: Sequence[str]) -> int:
        value, end = self.read(tokens, 0)
        if end != len(tokens):
            raise DecodeError(f"bad token {tokens[end]!r} at position {end}: expected a digit")
        return value
