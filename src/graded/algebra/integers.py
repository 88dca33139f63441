"""Integer arithmetic for exact weighted projective normal forms.

The weighted greatest common divisor wgcd_q(x) of an integer tuple x is the largest positive
integer d with d^{q_i} | x_i for every i (the normalisation used for rational points of weighted
projective spaces). Deciding it needs the prime factors of gcd(x_i) (a square part cannot be
found without factoring), so :func:`factorize` uses trial division, a Miller–Rabin test
(deterministic below 3.3·10^24, with 13 prime bases; beyond that its error probability is below
4^-13 per composite) and Pollard–Brent rho.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Sequence

__all__ = ["factorize", "is_probable_prime", "weighted_gcd"]

_SMALL_PRIMES = [p for p in range(2, 1000) if all(p % d for d in range(2, math.isqrt(p) + 1))]
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_probable_prime(n: int) -> bool:
    """Miller–Rabin primality test (exact for n < 3.3·10^24)."""
    if n < 2:
        return False
    for p in _SMALL_PRIMES[:25]:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _pollard_brent(n: int, rng: random.Random) -> int:
    """A non-trivial factor of the composite odd n."""
    while True:
        y, c, m = rng.randrange(1, n), rng.randrange(1, n), 128
        g, r, q = 1, 1, 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(m, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = math.gcd(q, n)
                k += m
            r *= 2
        if g == n:
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = math.gcd(abs(x - ys), n)
        if g != n:
            return g


def factorize(n: int) -> dict[int, int]:
    """Prime factorisation {p: e} of a non-zero integer (sign ignored); {} for ±1.

    Takes any integral number (a NumPy integer too, as :func:`weighted_gcd` does), not a bool
    and not a float: a float's value may already be rounded (2.0**60 + 1 is 2.0**60)."""
    if not isinstance(n, numbers.Integral) or isinstance(n, bool):
        raise TypeError(f"factorize needs an int, got {n!r} ({type(n).__name__})")
    n = int(n)
    if n == 0:
        raise ValueError("factorize(0) is undefined: 0 has no prime factorisation")
    n = abs(n)
    out: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
    rng = random.Random(0)
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if is_probable_prime(m):
            out[m] = out.get(m, 0) + 1
            continue
        r = math.isqrt(m)
        f = r if r * r == m else _pollard_brent(m, rng)
        stack.extend([f, m // f])
    return dict(sorted(out.items()))


def weighted_gcd(x: Sequence[int], grades: Sequence[int]) -> int:
    """The largest d >= 1 with d^{q_i} | x_i for all i (zeros impose nothing).

    Needs positive integer grades; the zero tuple has no weighted gcd (ValueError).
    """
    if len(x) != len(grades):
        raise ValueError(f"x has {len(x)} coordinates but there are {len(grades)} grades")
    for i, q in enumerate(grades):
        if not _is_integral(q) or q <= 0:
            raise ValueError(f"weighted_gcd needs positive integer grades, got {q!r} at index {i}")
    for i, v in enumerate(x):
        if not _is_integral(v):
            raise ValueError(f"weighted_gcd needs integer coordinates, got {v!r} at index {i}")
    support = [(int(v), int(q)) for v, q in zip(x, grades) if v != 0]
    if not support:
        raise ValueError(f"the zero tuple {tuple(x)!r} has no weighted gcd")
    g = 0
    for v, _ in support:
        g = math.gcd(g, v)
    d = 1
    for p, _ in factorize(g).items():
        e = min(_valuation(v, p) // q for v, q in support)
        d *= p**e
    return d


def _is_integral(v: object) -> bool:
    """An int, or a real number with an integer value (2.0); not a bool."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return False
    return isinstance(v, numbers.Integral) or (math.isfinite(v) and float(v).is_integer())


def _valuation(v: int, p: int) -> int:
    v, k = abs(v), 0
    while v % p == 0:
        v //= p
        k += 1
    return k
