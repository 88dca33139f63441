"""Polynomial arithmetic and degree-weighted regression: formats, targets, grades, splits."""

import random

import pytest
import torch

from graded.tasks import PolynomialArithmetic, PolynomialArithmeticSeq2Seq, PolynomialRegression


def evaluate(coeffs, x):
    return sum(c * x**k for k, c in enumerate(coeffs))


@pytest.mark.parametrize("operation", ["product", "composition"])
def test_answers_agree_with_evaluation_at_more_points_than_the_degree(operation):
    task = PolynomialArithmetic(operation=operation, max_degree=3, coeff_range=2)
    data = task.generate(40, seed=0)
    for toks in task.examples(data):
        p, q, r = task.parse_example(toks)
        for x in range(-len(r), len(r) + 1):  # deg r + 1 points determine r
            expected = evaluate(p, x) * evaluate(q, x) if operation == "product" else \
                evaluate(p, evaluate(q, x))
            assert evaluate(r, x) == expected
        assert r[-1] != 0 and len(r) - 1 == ((len(p) - 1) + (len(q) - 1) if operation ==
                                             "product" else (len(p) - 1) * (len(q) - 1))


def test_documented_example_round_trips():
    task = PolynomialArithmetic()
    tokens = task.format_example([3, -1, 2], [1, 0, -4])
    text = "<bos> 3 -1 2 * 1 0 -4 = 3 -1 -10 4 -8 <eos>"
    assert " ".join(tokens) == text
    assert task.vocab.decode_str(task.vocab.encode(text)) == text
    assert task.parse_example(text.split()) == ([3, -1, 2], [1, 0, -4], [3, -1, -10, 4, -8])
    with pytest.raises(ValueError, match="malformed"):
        task.parse_example(["<bos>", "3", "x", "2", "*", "1", "=", "3", "<eos>"])


def test_dataset_decodes_to_its_generated_examples_and_scores_only_the_answer():
    task = PolynomialArithmetic(max_degree=2)
    data = task.generate(10, seed=5)
    rng = random.Random(5)
    for i, toks in enumerate(task.examples(data)):
        p, q = task._random_poly(rng), task._random_poly(rng)
        assert toks == task.format_example(p, q)
        scored = data.tensors["loss_mask"][i]
        n_answer = len(toks) - toks.index("=") - 1  # answer coefficients and <eos>
        assert int(scored.sum()) == n_answer
        assert task.vocab.decode(data.targets[i][scored]) == toks[toks.index("=") + 1:]


def test_token_grades_are_monomial_degrees():
    task = PolynomialArithmetic(max_degree=2)
    data = task.generate(6, seed=1)
    for i, toks in enumerate(task.examples(data)):
        expected, degree = [], 0
        for t in toks[:-1]:  # grades align with inputs
            if t.lstrip("-").isdigit():
                expected.append(degree)
                degree += 1
            else:
                expected.append(0)
                degree = 0
        n = len(expected)
        assert data.tensors["token_grades"][i, :n].tolist() == expected


def test_vocabulary_too_large_is_rejected_naming_the_bound():
    with pytest.raises(ValueError, match="lower max_degree or coeff_range"):
        PolynomialArithmetic(operation="composition", max_degree=4, coeff_range=5)


@pytest.mark.parametrize("operation", ["product", "composition"])
def test_relabelling_substitutes_minus_x_and_is_an_involution(operation):
    task = PolynomialArithmetic(operation=operation, max_degree=2, coeff_range=3)
    data = task.generate(20, seed=2)
    flipped = task.relabel(data, seed=0)
    for a, b in zip(task.examples(data), task.examples(flipped)):
        p, q, r = task.parse_example(a)
        p2, q2, r2 = task.parse_example(b)
        for x in range(-3, 4):
            assert evaluate(q2, x) == evaluate(q, -x) and evaluate(r2, x) == evaluate(r, -x)
            assert evaluate(p2, x) == (evaluate(p, -x) if operation == "product" else
                                       evaluate(p, x))
    again = task.relabel(flipped, seed=0)
    assert torch.equal(again.inputs, data.inputs) and torch.equal(again.targets, data.targets)


def test_regression_target_matches_a_naive_loop():
    task = PolynomialRegression(degree=3, min_polys=2, max_polys=5, emphasis=2.0)
    data = task.generate(8, seed=0)
    w = [2.0**k for k in range(4)]
    w = [v / sum(w) for v in w]
    for i in range(8):
        rows = [r for r, pad in zip(data.inputs[i].tolist(),
                                    data.tensors["key_padding_mask"][i].tolist()) if not pad]
        m = len(rows)
        s = [sum(r[k] for r in rows) / m**0.5 for k in range(4)]
        expected = sum(w[k] * s[k] ** 2 for k in range(4))
        assert data.targets[i, 0].item() == pytest.approx(expected, rel=1e-5)
    assert task.degree_weights[3] / task.degree_weights.sum() == pytest.approx(8 / 15)


def test_linear_regression_target_and_relabelling_recompute_correctly():
    task = PolynomialRegression(target="linear")
    data = task.generate(16, seed=0)
    moved = task.relabel(data, seed=1)
    pad = data.tensors["key_padding_mask"]
    assert torch.allclose(moved.targets.double(), task.target_of(moved.inputs, pad), atol=1e-5)
    # same multiset of |coefficients| per example: a permutation and sign changes
    for i in range(16):
        a = sorted(data.inputs[i].abs().flatten().tolist())
        b = sorted(moved.inputs[i].abs().flatten().tolist())
        assert a == pytest.approx(b)


def test_graded_energy_is_invariant_under_the_relabelling():
    task = PolynomialRegression()
    data = task.generate(32, seed=0)
    moved = task.relabel(data, seed=3)
    assert not torch.equal(moved.inputs, data.inputs)
    recomputed = task.target_of(moved.inputs, moved.tensors["key_padding_mask"])
    assert torch.allclose(recomputed.float(), data.targets, atol=1e-5)


def test_seq2seq_variant_holds_the_same_examples_with_shifted_decoder_inputs():
    lm = PolynomialArithmetic(max_degree=2)
    s2s = PolynomialArithmeticSeq2Seq(max_degree=2)
    data = s2s.generate(15, seed=4)
    assert s2s.examples(data) == lm.examples(lm.generate(15, seed=4))
    dec, tgt, pad = data.tensors["decoder_inputs"], data.targets, data.tensors[
        "decoder_key_padding_mask"]
    assert bool((dec[:, 0] == s2s.vocab.id("<bos>")).all())
    real = ~pad[:, 1:]
    assert torch.equal(dec[:, 1:][real], tgt[:, :-1][real])
    assert torch.equal(data.tensors["loss_mask"], tgt != -100)
    moved = s2s.relabel(data, seed=0)
    for a, b in zip(s2s.examples(data), s2s.examples(moved)):
        r, r2 = s2s.parse_example(a)[2], s2s.parse_example(b)[2]
        assert all(evaluate(r2, x) == evaluate(r, -x) for x in range(-3, 4))


@pytest.mark.parametrize("operation", ["product", "composition"])
def test_answers_are_sympys_expansion_including_constant_polynomials(operation):
    sympy = pytest.importorskip("sympy")
    x = sympy.Symbol("x")
    task = PolynomialArithmetic(operation=operation, min_degree=0, max_degree=2, coeff_range=3)
    degrees = set()
    for toks in task.examples(task.generate(120, seed=4)):
        p, q, r = task.parse_example(toks)
        sp, sq = (sum(c * x**k for k, c in enumerate(a)) for a in (p, q))
        answer = sympy.Poly(sympy.expand(sp * sq if operation == "product" else
                                         sp.subs(x, sq)), x)
        assert r == [int(c) for c in reversed(answer.all_coeffs())]
        degrees.add((len(p) - 1, len(q) - 1))
    assert {(0, 0), (0, 2), (2, 0), (2, 2)} <= degrees  # constants on either side occur
