"""Every codec round-trips, and every decoder rejects corrupted sequences with a reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.encodings import (
    AdjacencyCodec,
    DecodeError,
    DensePolynomialCodec,
    EdgeListCodec,
    IntegerCodec,
    MatrixCodec,
    PermutationCycleCodec,
    PermutationMatrixCodec,
    PermutationOneLineCodec,
    SparsePolynomialCodec,
    SubsetIndicatorCodec,
    SubsetListCodec,
    UpperTriangleCodec,
    Vocabulary,
    adjacency_from_edges,
    edges_of,
    monomials,
)
from graded.encodings.permutations import check_permutation

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def graphs(draw, max_n=7):
    n = draw(st.integers(0, max_n))
    bits = draw(st.lists(st.integers(0, 1), min_size=n * (n - 1) // 2, max_size=n * (n - 1) // 2))
    adj = np.zeros((n, n), dtype=np.int64)
    adj[np.triu_indices(n, 1)] = bits
    return adj + adj.T


@st.composite
def permutations(draw, max_n=8):
    n = draw(st.integers(0, max_n))
    return n, tuple(draw(st.permutations(range(1, n + 1))))


@st.composite
def polynomials(draw, n_vars=2, max_exp=3):
    exps = st.tuples(*[st.integers(0, max_exp)] * n_vars)
    coeffs = st.integers(-500, 500).filter(bool)
    return draw(st.dictionaries(exps, coeffs, max_size=6))


@st.composite
def codec_and_object(draw):
    """A codec of every kind with a valid object for it."""
    kind = draw(
        st.sampled_from(
            [
                "int",
                "int_rev",
                "sparse",
                "dense",
                "ind",
                "list",
                "one",
                "pmat",
                "cyc",
                "cycfix",
                "adj",
                "upper",
                "upper_canon",
                "edges",
                "bin",
                "intmat",
            ]
        )
    )
    if kind in ("int", "int_rev"):
        base = draw(st.integers(2, 40))
        return IntegerCodec(base, reverse=kind == "int_rev"), draw(st.integers(-(10**9), 10**9))
    if kind == "sparse":
        return SparsePolynomialCodec(2, max_exponent=3), draw(polynomials())
    if kind == "dense":
        poly = draw(polynomials(n_vars=3, max_exp=1))
        return DensePolynomialCodec(3, max_degree=3), poly
    if kind in ("ind", "list"):
        n = draw(st.integers(0, 12))
        subset = frozenset(draw(st.sets(st.integers(1, n))) if n else set())
        return (SubsetIndicatorCodec(n) if kind == "ind" else SubsetListCodec(n)), subset
    if kind in ("one", "pmat", "cyc", "cycfix"):
        n, perm = draw(permutations())
        codec = {
            "one": PermutationOneLineCodec(n),
            "pmat": PermutationMatrixCodec(n),
            "cyc": PermutationCycleCodec(n),
            "cycfix": PermutationCycleCodec(n, include_fixed_points=True),
        }[kind]
        return codec, perm
    if kind in ("adj", "upper", "upper_canon", "edges"):
        adj = draw(graphs())
        n = adj.shape[0]
        codec = {
            "adj": AdjacencyCodec(n),
            "upper": UpperTriangleCodec(n),
            "upper_canon": UpperTriangleCodec(n, canonical=True),
            "edges": EdgeListCodec(n),
        }[kind]
        if kind == "upper_canon":
            from graded.encodings import canonical_graph

            adj = canonical_graph(adj)
        return codec, adj
    rows, cols = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    hi = 1 if kind == "bin" else 999
    values = draw(
        st.lists(st.integers(-hi if hi > 1 else 0, hi), min_size=rows * cols, max_size=rows * cols)
    )
    codec = MatrixCodec(rows, cols, None if kind == "bin" else IntegerCodec(7))
    return codec, np.array(values, dtype=np.int64).reshape(rows, cols)


def same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b)
    return a == b


@SETTINGS
@given(codec_and_object())
def test_every_codec_round_trips_through_tokens_and_ids(case):
    codec, obj = case
    tokens = codec.encode(obj)
    assert set(tokens) <= set(codec.tokens)
    assert same(codec.decode(tokens), obj)
    vocab = codec.vocabulary()
    assert same(codec.decode_ids(codec.encode_ids(obj, vocab), vocab), obj)


@SETTINGS
@given(codec_and_object(), st.data())
def test_decoding_a_corrupted_sequence_never_returns_a_wrong_object(case, data):
    """After a random edit, decode either raises DecodeError with a reason or returns the object
    whose canonical encoding is exactly the edited sequence."""
    codec, obj = case
    tokens = list(codec.encode(obj))
    op = data.draw(st.sampled_from(["replace", "delete", "insert", "swap"]))
    alphabet = [*codec.tokens, "?", "07"]
    if op == "replace" and tokens:
        i = data.draw(st.integers(0, len(tokens) - 1))
        tokens[i] = data.draw(st.sampled_from(alphabet))
    elif op == "delete" and tokens:
        del tokens[data.draw(st.integers(0, len(tokens) - 1))]
    elif op == "insert":
        tokens.insert(data.draw(st.integers(0, len(tokens))), data.draw(st.sampled_from(alphabet)))
    elif op == "swap" and len(tokens) > 1:
        i = data.draw(st.integers(0, len(tokens) - 2))
        tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
    try:
        value = codec.decode(tokens)
    except DecodeError as err:
        assert err.reason and isinstance(err, ValueError)
        return
    assert codec.encode(value) == tokens


# --- worked examples from 003 §3.1 ------------------------------------------------------------


def test_subset_encodings_match_003_example_3_1():
    assert SubsetIndicatorCodec(8).encode({3, 5, 8}) == list("00101001")
    assert SubsetListCodec(8).encode({8, 3, 5}) == ["3", "5", "8"]


def test_permutation_encodings_match_003_example_3_2():
    pi = (4, 5, 2, 3, 1)
    assert PermutationOneLineCodec(5).encode(pi) == ["4", "5", "2", "3", "1"]
    matrix = np.array(PermutationMatrixCodec(5).encode(pi), dtype=int).reshape(5, 5)
    expected = [[0, 0, 0, 1, 0], [0, 0, 0, 0, 1], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0]]
    assert matrix.tolist() == expected
    assert PermutationCycleCodec(5).encode(pi) == ["(", "1", "4", "3", "2", "5", ")"]


@pytest.mark.parametrize("as_array", [
    np.array, lambda pi: np.array(pi, dtype=np.uint8), lambda pi: np.array(pi, dtype=np.int32),
    torch.tensor, lambda pi: torch.tensor(pi, dtype=torch.int16),
])
def test_permutation_codecs_take_a_1d_integer_array_as_the_tuple(as_array):
    pi = (4, 5, 2, 3, 1)  # 003 Example 3.2: cycle form (1, 4, 3, 2, 5)
    assert check_permutation(as_array(pi), 5) == pi
    assert all(type(x) is int for x in check_permutation(as_array(pi), 5))
    assert PermutationCycleCodec(5).encode(as_array(pi)) == ["(", "1", "4", "3", "2", "5", ")"]
    for codec in (PermutationOneLineCodec(5), PermutationMatrixCodec(5)):
        assert codec.encode(as_array(pi)) == codec.encode(pi)


def test_permutation_arrays_of_float_or_bool_dtype_or_not_1d_are_refused_naming_them():
    for arr, dtype in [(np.array([2.0, 1.0]), "float64"),
                       (torch.tensor([2.0, 1.0]), "torch.float32"),
                       (np.array([True, False]), "bool"),
                       (torch.tensor([True, False]), "torch.bool")]:
        with pytest.raises(TypeError, match=rf"a permutation must hold integers, got an array of "
                                            rf"dtype {dtype}"):
            check_permutation(arr, 2)
    with pytest.raises(ValueError, match=r"one-dimensional, got an array of shape \(2, 2\)"):
        check_permutation(torch.tensor([[1, 2], [2, 1]]), 2)
    with pytest.raises(ValueError, match=r"\(1, 1\) is not a permutation of 1..2"):
        check_permutation(np.array([1, 1]), 2)


def test_graph_encodings_match_003_example_3_3():
    adj = adjacency_from_edges(5, [(0, 1), (0, 4), (1, 3), (2, 3), (2, 4)])
    expected = [[0, 1, 0, 0, 1], [1, 0, 0, 1, 0], [0, 0, 0, 1, 1], [0, 1, 1, 0, 0], [1, 0, 1, 0, 0]]
    assert np.array(AdjacencyCodec(5).encode(adj), dtype=int).reshape(5, 5).tolist() == expected
    assert EdgeListCodec(5).to_string(adj) == "[(1,2), (1,5), (2,4), (3,4), (3,5)]"
    assert UpperTriangleCodec(5).encode(adj) == list("1001010110")
    assert edges_of(adj) == [(0, 1), (0, 4), (1, 3), (2, 3), (2, 4)]


# --- integers and polynomials -------------------------------------------------------------------


@SETTINGS
@given(st.integers(-(10**12), 10**12), st.integers(2, 1000), st.booleans())
def test_integer_digits_evaluate_to_the_integer(value, base, reverse):
    tokens = IntegerCodec(base, reverse).encode(value)
    digits = [int(t) for t in tokens[1:]]
    if reverse:
        digits = digits[::-1]
    total = 0
    for d in digits:  # Horner evaluation, independent of the codec's divmod loop
        total = total * base + d
    assert (-total if tokens[0] == "-" else total) == value
    assert all(0 <= d < base for d in digits)


@pytest.mark.parametrize(
    ("tokens", "reason"),
    [
        ([], "sign"),
        (["5"], "sign"),
        (["+"], "no digit"),
        (["+", "0", "5"], "leading zero"),
        (["-", "0"], "negative zero"),
        (["+", "12"], "digit"),
        (["+", "5", "-"], "expected a digit"),
        (["+", "x"], "no digit"),
    ],
)
def test_integer_decoder_rejects_malformed_sequences_with_reason(tokens, reason):
    with pytest.raises(DecodeError, match=reason):
        IntegerCodec(10).decode(tokens)


def test_reversed_integer_puts_least_significant_digit_first():
    assert IntegerCodec(10, reverse=True).encode(-305) == ["-", "5", "0", "3"]
    with pytest.raises(DecodeError, match="leading zero"):
        IntegerCodec(10, reverse=True).decode(["+", "5", "0"])


def test_monomials_are_all_exponents_up_to_the_degree_in_graded_order():
    mons = monomials(2, 2)
    assert mons == [(0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (0, 2)]
    from math import comb

    assert len(monomials(3, 4)) == comb(3 + 4, 4)


def test_dense_polynomial_grading_is_total_degree_of_each_slot():
    codec = DensePolynomialCodec(2, 2)
    assert codec.grading == (0, 1, 1, 2, 2, 2)
    poly = {(2, 0): 3, (0, 0): -1}
    tokens = codec.encode(poly)
    assert tokens == ["-", "1", "+", "0", "+", "0", "+", "3", "+", "0", "+", "0"]
    assert codec.token_grades(poly) == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]


@SETTINGS
@given(polynomials())
def test_sparse_token_grades_are_the_total_degree_of_each_term(poly):
    codec = SparsePolynomialCodec(2, max_exponent=3)
    tokens, grades = codec.encode(poly), codec.token_grades(poly)
    assert len(tokens) == len(grades)
    # independent reading: every exponent token pair closes a term of degree = their sum
    for k, t in enumerate(tokens):
        if t.startswith("e") and k + 1 < len(tokens) and tokens[k + 1].startswith("e"):
            assert grades[k] == int(t[1:]) + int(tokens[k + 1][1:])
    assert sorted(grades, reverse=True) == grades  # terms come in descending degree


@pytest.mark.parametrize(
    ("tokens", "reason"),
    [
        (["+", "3", "e1"], "fewer than 2 exponents"),
        (["+", "0", "e1", "e0"], "zero coefficient"),
        (["+", "3", "e1", "e9"], "outside e0..e3"),
        (["+", "3", "e1", "e0", "+", "2", "e1", "e0"], "repeated"),
        (["+", "3", "e0", "e0", "+", "2", "e1", "e0"], "out of graded-lex order"),
        (["3", "e1", "e0"], "sign"),
        (["+", "3", "x", "e0"], "expected an exponent"),
    ],
)
def test_sparse_polynomial_decoder_rejects_malformed_terms_with_reason(tokens, reason):
    with pytest.raises(DecodeError, match=reason):
        SparsePolynomialCodec(2, max_exponent=3).decode(tokens)


def test_dense_polynomial_decoder_rejects_wrong_number_of_coefficients():
    with pytest.raises(DecodeError, match="wrong number of coefficients 2"):
        DensePolynomialCodec(2, 1).decode(["+", "1", "-", "2"])


def test_polynomial_encoders_reject_bad_input_naming_it():
    with pytest.raises(ValueError, match="exceeds max_degree=1"):
        DensePolynomialCodec(2, 1).encode({(1, 1): 1})
    with pytest.raises(ValueError, match="tuple of 2"):
        SparsePolynomialCodec(2).encode({(1,): 1})


# --- subsets, permutations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codec", "tokens", "reason"),
    [
        (SubsetIndicatorCodec(3), ["0", "1"], "wrong length"),
        (SubsetIndicatorCodec(3), ["0", "2", "1"], "bad token"),
        (SubsetListCodec(5), ["2", "2"], "repeated element 2"),
        (SubsetListCodec(5), ["3", "2"], "out of order"),
        (SubsetListCodec(5), ["6"], "outside 1..5"),
        (PermutationOneLineCodec(3), ["1", "2"], "wrong length"),
        (PermutationOneLineCodec(3), ["1", "2", "2"], "repeated entry 2"),
        (PermutationOneLineCodec(3), ["1", "2", "4"], "outside 1..3"),
        (PermutationMatrixCodec(2), list("1100"), "row 1 has 2 ones"),
        (PermutationMatrixCodec(2), list("1010"), "column 1 has 2 ones"),
        (PermutationMatrixCodec(2), list("100"), "wrong length"),
        (PermutationCycleCodec(4), ["(", "1", "2", ")", "(", "2", "3", ")"], "repeated element 2"),
        (PermutationCycleCodec(4), ["(", "2", "1", ")"], "smallest"),
        (PermutationCycleCodec(4), ["(", "3", "4", ")", "(", "1", "2", ")"], "out of order"),
        (PermutationCycleCodec(4), ["(", "1", "2"], "not closed"),
        (PermutationCycleCodec(4), ["(", ")"], "empty cycle"),
        (PermutationCycleCodec(4), ["(", "1", "1", ")"], "inside one cycle"),
        (PermutationCycleCodec(4), ["(", "3", ")"], "fixed point"),
        (PermutationCycleCodec(3, include_fixed_points=True), ["(", "1", "2", ")"], "appear in no"),
        (PermutationCycleCodec(4), ["1", "(", "2", ")"], "outside a cycle"),
    ],
)
def test_decoders_reject_targeted_corruptions_with_reason(codec, tokens, reason):
    with pytest.raises(DecodeError, match=reason):
        codec.decode(tokens)


@SETTINGS
@given(st.integers(1, 6), st.data())
def test_non_strict_cycle_decoder_composes_cycles_right_to_left(n, data):
    cycles = data.draw(
        st.lists(st.lists(st.integers(1, n), min_size=1, max_size=n, unique=True), max_size=4)
    )
    tokens = [t for c in cycles for t in ["(", *map(str, c), ")"]]
    perm = PermutationCycleCodec(n, strict=False).decode(tokens)
    for x in range(1, n + 1):  # apply the rightmost cycle first, by hand
        y = x
        for c in reversed(cycles):
            if y in c:
                y = c[(c.index(y) + 1) % len(c)]
        assert perm[x - 1] == y


# --- graphs and matrices ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codec", "tokens", "reason"),
    [
        (AdjacencyCodec(2), [*"0110", "0"], "wrong length"),
        (AdjacencyCodec(2), list("1001"), "self-loop"),
        (AdjacencyCodec(2), list("0100"), "not symmetric"),
        (AdjacencyCodec(2), list("01a0"), "bad token"),
        (UpperTriangleCodec(3), list("10"), "wrong length"),
        (UpperTriangleCodec(3, canonical=True), list("110"), "not in canonical form"),
        (EdgeListCodec(4), ["1", "2", "3"], "odd length"),
        (EdgeListCodec(4), ["2", "2"], "self-loop"),
        (EdgeListCodec(4), ["2", "1"], "smaller vertex first"),
        (EdgeListCodec(4), ["1", "2", "1", "2"], "repeated"),
        (EdgeListCodec(4), ["2", "3", "1", "2"], "out of order"),
        (EdgeListCodec(4), ["1", "5"], "outside 1..4"),
        (MatrixCodec(2, 2), list("010"), "wrong length"),
        (MatrixCodec(1, 2, IntegerCodec(10)), ["+", "1"], "wrong number of entries 1"),
        (MatrixCodec(1, 1, IntegerCodec(10)), ["+", "1", "+"], "no digit"),
    ],
)
def test_graph_and_matrix_decoders_reject_targeted_corruptions_with_reason(codec, tokens, reason):
    with pytest.raises(DecodeError, match=reason):
        codec.decode(tokens)


def test_graph_encoders_reject_non_graphs_naming_the_problem():
    codec = AdjacencyCodec(2)
    with pytest.raises(ValueError, match="not symmetric"):
        codec.encode(np.array([[0, 1], [0, 0]]))
    with pytest.raises(ValueError, match="self-loop"):
        codec.encode(np.eye(2, dtype=int))
    with pytest.raises(ValueError, match="expected 2"):
        codec.encode(np.zeros((3, 3), dtype=int))
    with pytest.raises(ValueError, match="0 or 1"):
        codec.encode(np.array([[0, 2], [2, 0]]))


def test_graph_codecs_accept_torch_tensors():
    torch = pytest.importorskip("torch")
    adj = torch.tensor([[0, 1], [1, 0]])
    assert UpperTriangleCodec(2).encode(adj) == ["1"]


# --- vocabulary ---------------------------------------------------------------------------------


def test_vocabulary_maps_specials_first_and_round_trips_through_json(tmp_path):
    vocab = Vocabulary(["a", "b"])
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.id("a"), len(vocab)) == (0, 1, 2, 3, 5)
    vocab.save(tmp_path / "v.json")
    assert Vocabulary.load(tmp_path / "v.json") == vocab
    with pytest.raises(DecodeError, match="outside"):
        vocab.decode([7])
    with pytest.raises(DecodeError, match="special token"):
        vocab.decode([2])
    with pytest.raises(ValueError, match="'z' is not in the vocabulary"):
        vocab.encode(["z"])
    with pytest.raises(ValueError, match="appears twice"):
        Vocabulary(["a", "a"])


def test_decode_ids_strips_bos_stops_at_eos_and_drops_trailing_padding():
    codec = PermutationOneLineCodec(3)
    vocab = codec.vocabulary()
    body = codec.encode_ids((2, 3, 1), vocab)
    bos, eos, pad = vocab.bos_id, vocab.eos_id, vocab.pad_id
    assert codec.decode_ids([bos, *body, eos, *body, pad], vocab) == (2, 3, 1)
    assert codec.decode_ids([*body, pad, pad], vocab) == (2, 3, 1)
    with pytest.raises(DecodeError, match="special token '<pad>'"):
        codec.decode_ids([body[0], pad, *body[1:]], vocab)
    with pytest.raises(DecodeError, match="wrong length 2"):
        codec.decode_ids([bos, *body[:2], eos], vocab)
