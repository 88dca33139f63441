"""Permutation encodings of 003 §3.1 Example 3.2 against sympy's combinatorics, for every
permutation of small n (``test_codecs.py`` checks the worked example π = 45231 and round trips)."""

import itertools

import pytest

from graded.encodings.permutations import PermutationCycleCodec, PermutationMatrixCodec

combinatorics = pytest.importorskip("sympy.combinatorics")


@pytest.mark.parametrize("n", [1, 3, 5])
def test_cycle_notation_is_sympys_cyclic_form_003_example_3_2(n):
    """003 Ex 3.2: cycle notation, π = 45231 ↦ "(1, 4, 3, 2, 5)": each cycle from its smallest
    element, cycles in order of it, fixed points left out (sympy's ``cyclic_form``, 0-indexed),
    and with ``include_fixed_points`` every element once (sympy's ``full_cyclic_form``)."""
    for one_line in itertools.permutations(range(1, n + 1)):
        perm = combinatorics.Permutation([x - 1 for x in one_line])
        for codec, form in ((PermutationCycleCodec(n), perm.cyclic_form),
                            (PermutationCycleCodec(n, include_fixed_points=True),
                             perm.full_cyclic_form)):
            expected = [t for cycle in form for t in ("(", *(str(x + 1) for x in cycle), ")")]
            assert codec.encode(one_line) == expected


@pytest.mark.parametrize("n", [2, 4])
def test_permutation_matrix_has_its_one_in_row_i_at_column_pi_i_003_example_3_2(n):
    """003 Ex 3.2: the flattened matrix with M[i, π(i)] = 1, which is sympy's
    ``Permutation.array_form`` read as column indices (no transpose)."""
    for one_line in itertools.permutations(range(1, n + 1)):
        cols = combinatorics.Permutation([x - 1 for x in one_line]).array_form
        expected = ["1" if c == cols[r] else "0" for r in range(n) for c in range(n)]
        assert PermutationMatrixCodec(n).encode(one_line) == expected
