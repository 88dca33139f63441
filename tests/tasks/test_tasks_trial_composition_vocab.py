"""The vocabulary of polynomial composition holds the integers answers reach, not an l1 bound.

The l1 bound c Σ_i (c(d+1))^i (42 105 at the defaults d = 3, c = 5) is 5.3 times the largest
coefficient any p(q(x)) can have (7 875): the vocabulary was 5 times too large, and the default
``operation="composition"`` was refused for a vocabulary it does not need.
"""

from __future__ import annotations

import itertools

import pytest

from graded.tasks.polynomials import MAX_VOCAB, PolynomialArithmetic, poly_compose


def _all_polys(degree: int, c: int) -> list[list[int]]:
    """Every integer polynomial of degree 0..degree with |coefficients| <= c, nonzero lead."""
    out = []
    for d in range(degree + 1):
        for low in itertools.product(range(-c, c + 1), repeat=d):
            out.extend([*low, lead] for lead in range(-c, c + 1) if lead)
    return out


def _naive_compose(p: list[int], q: list[int]) -> list[int]:
    """p(q(x)) as Σ_i p_i q^i, powers by repeated schoolbook products."""
    out = [0] * ((len(p) - 1) * (len(q) - 1) + 1)
    power = [1]
    for a in p:
        for k, v in enumerate(power):
            out[k] += a * v
        power = [sum(power[i] * q[k - i] for i in range(len(power)) if 0 <= k - i < len(q))
                 for k in range(len(power) + len(q) - 1)]
    return out


@pytest.mark.parametrize(("degree", "c"), [(2, 2), (1, 3)])
def test_the_vocabulary_bound_is_the_largest_coefficient_of_any_composition(degree, c):
    polys = _all_polys(degree, c)
    largest = max(max(map(abs, _naive_compose(p, q))) for p in polys for q in polys)
    task = PolynomialArithmetic(operation="composition", max_degree=degree, coeff_range=c)
    assert task.coeff_bound == largest
    assert len(task.vocab) == 6 + 2 * largest + 1  # specials and -largest..largest


def test_the_default_composition_configuration_is_accepted_and_encodes_its_answers():
    task = PolynomialArithmetic(operation="composition")  # max_degree=3, coeff_range=5
    c = [5, 5, 5, 5]
    assert task.coeff_bound == max(_naive_compose(c, c)) == 7875
    assert len(task.vocab) == 6 + 2 * 7875 + 1 < MAX_VOCAB
    data = task.generate(50, seed=1)
    for tokens in task.examples(data):
        p, q, r = task.parse_example(tokens)
        assert r == _naive_compose(p, q) == poly_compose(p, q)


def test_a_composition_beyond_the_vocabulary_is_refused_quickly_naming_a_reached_value():
    with pytest.raises(ValueError, match=r"max_degree=4 and coeff_range=5 reach at least "
                                         r"±275125, more than the 20000"):
        PolynomialArithmetic(operation="composition", max_degree=4, coeff_range=5)
    # a huge degree is refused from c³(d+1), the x^d coefficient of c·C², without expanding
    with pytest.raises(ValueError, match=r"reach at least ±81027,"):
        PolynomialArithmetic(operation="composition", max_degree=3000, coeff_range=3)
