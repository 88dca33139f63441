"""``factorize`` takes every integral number that ``weighted_gcd`` takes (NumPy integers too),
and refuses bools and floats by name."""

import math

import numpy as np
import pytest

from graded.algebra import factorize, weighted_gcd


@pytest.mark.parametrize("n", [np.int64(-360), np.uint16(1001), np.int32(2**31 - 1)])
def test_numpy_integers_factor_as_their_int_does(n):
    # np.int64(-360) raised "factorize needs an int", though weighted_gcd takes NumPy integers
    f = factorize(n)
    assert f == factorize(int(n))
    assert math.prod(p**e for p, e in f.items()) == abs(int(n))
    assert all(factorize(p) == {p: 1} for p in f)  # every factor prime
    assert weighted_gcd([n], [1]) == abs(int(n))


@pytest.mark.parametrize("bad, kind", [(True, "bool"), (12.0, "float"), ("12", "str")])
def test_bools_floats_and_strings_are_refused_by_name(bad, kind):
    with pytest.raises(TypeError, match=rf"factorize needs an int, got {bad!r} \({kind}\)"):
        factorize(bad)
