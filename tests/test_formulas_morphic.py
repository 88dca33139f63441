"""Routing formulas of the morphic transformer (004) not checked elsewhere, against scalar
computations from the paper's formulas and the router's documented normalisations.

- 004 Lemma 4.5: logits are −∞ outside the admissible (here: enabled) edges, so the routing
  distribution is supported exactly on them; the weights of the enabled edges are the
  normalisation's formula over what is left (``tests/morphic/test_masking_and_inputs.py``
  checks the entropy of that distribution, not the weights).
- 004 Def 2.3 / §4.1: the banded edge set 𝓔 = {(g, h) : h = g + δ, δ ∈ Δ} on integer grade
  indices, shifts leaving G dropped, enumerated by hand.
- 004 §4.2.3: α_t is recomputed from the utility-augmented logits ℓ̃ = ℓ + β(ΔL − τ_e) with the
  temperature T: α = softmax(ℓ̃/T) per group, written out.
"""

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.morphic import EdgeSet, Grade, GradedStateSpace, Router
from graded.morphic.objective import utility_augmented_logits

F64 = torch.float64
T_ = 0.8  # router temperature


def router(norm: str) -> Router:
    sp = GradedStateSpace({"a": 2, "b": 3})
    # b ← a, b ← b, b ← a (a second tool), a ← a: destination b has three edges, a has one
    es = EdgeSet.explicit(sp, [("a", "b", "x"), ("b", "b", "y"), ("a", "b", "w"),
                               ("a", "a", "z")])
    torch.manual_seed(0)
    return Router(sp, es, rank=3, normalization=norm, temperature=T_)


GROUPS = {"b": [0, 1, 2], "a": [3]}


def hand(norm: str, logits: list[float], disabled: set[int]) -> list[float]:
    """α per edge with the stay option (logit 0) of the module docstring of
    :mod:`graded.morphic.router`, disabled edges removed (logit −∞, gate 0)."""
    x = [v / T_ for v in logits]
    alpha = [0.0] * len(x)
    if norm == "global":
        live = [e for e in range(len(x)) if e not in disabled]
        z = 1.0 + sum(math.exp(x[e]) for e in live)
        for e in live:
            alpha[e] = math.exp(x[e]) / z
    elif norm == "dest":
        for group in GROUPS.values():
            live = [e for e in group if e not in disabled]
            z = 1.0 + sum(math.exp(x[e]) for e in live)
            for e in live:
                alpha[e] = math.exp(x[e]) / z
    else:  # logistic: α_e = g_e / D_h, D_h = Σ g + Π(1 − g)
        for group in GROUPS.values():
            g = {e: (0.0 if e in disabled else 1.0 / (1.0 + math.exp(-x[e]))) for e in group}
            closed = math.prod(1.0 - v for v in g.values())
            d = sum(g.values()) + closed
            for e in group:
                alpha[e] = g[e] / d
    return alpha


@pytest.mark.parametrize("disabled", [{1}, {0, 2}, {3}, {0, 1, 2, 3}])
@pytest.mark.parametrize("norm", ["global", "dest", "logistic"])
def test_disabled_edges_get_no_mass_and_the_rest_are_the_formula_lemma_4_5(norm, disabled):
    r = router(norm)
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 4, generator=gen, dtype=F64) * 2
    got = r.route(logits, disabled=disabled).weights
    for n in range(5):
        want = hand(norm, logits[n].tolist(), disabled)
        for e in range(4):
            if e in disabled:
                assert got[n, e].item() == 0.0
            else:
                assert got[n, e].item() == pytest.approx(want[e], rel=1e-12, abs=1e-15)
        # what is not routed into a destination stays on its skip path: s_h ≥ 0, sums to 1
        for group in GROUPS.values():
            routed = sum(got[n, e].item() for e in group)
            assert 0.0 <= routed <= 1.0 + 1e-12


@pytest.mark.parametrize("norm", ["global", "dest"])
def test_routing_from_utility_augmented_logits_section_4_2_3(norm):
    """ℓ̃_t(e) = ℓ_t(e) + β(ΔL_t(e) − τ_e) (004 §4.2.3, notes B7), then α from ℓ̃ with
    temperature T, stay option at logit 0: both steps written out per token."""
    r = router(norm)
    gen = torch.Generator().manual_seed(2)
    ell = torch.randn(2, 3, 4, generator=gen, dtype=F64)
    util = torch.randn(2, 3, 4, generator=gen, dtype=F64)
    tau = torch.tensor([0.1, 0.0, 0.3, 0.2], dtype=F64)
    beta = 4.0
    tilde = utility_augmented_logits(ell, util, beta, tau)
    alpha = r.route(tilde).weights
    for b in range(2):
        for t in range(3):
            lt = [float(ell[b, t, e]) + beta * (float(util[b, t, e]) - float(tau[e]))
                  for e in range(4)]
            assert tilde[b, t].tolist() == pytest.approx(lt, rel=1e-12)
            assert alpha[b, t].tolist() == pytest.approx(hand(norm, lt, set()), rel=1e-12)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(indices=st.lists(st.integers(-3, 6), min_size=1, max_size=5, unique=True),
       shifts=st.lists(st.integers(-3, 3), min_size=1, max_size=3, unique=True))
def test_banded_edges_are_the_pairs_h_equals_g_plus_delta_def_2_3(indices, shifts):
    """004 Def 2.3 / §4.1: (g, h) ∈ 𝓔 iff index(h) − index(g) ∈ Δ, over grades with any
    integer indices (gaps and negative ones); 𝓔 = ∅ is refused, and the shifts that give no
    edge beside ones that do are named in a warning."""
    space = GradedStateSpace([Grade(f"g{i}", 2, i) for i in indices])
    want = {(f"g{i}", f"g{i + d}") for i in indices for d in shifts if i + d in indices}
    if not want:
        with pytest.raises(ValueError, match="no edge"):
            EdgeSet.banded(space, shifts)
        return
    idle = [d for d in shifts if not any(i + d in indices for i in indices)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = {(e.source, e.dest) for e in EdgeSet.banded(space, shifts)}
    assert got == want
    named = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert named == ([] if not idle else [
        f"banded shift{'s' if len(idle) > 1 else ''} {idle} of {shifts} "
        f"give{'' if len(idle) > 1 else 's'} no edge: index(g) + δ is no grade's index for any "
        f"grade g (indices {indices}); {'they add' if len(idle) > 1 else 'it adds'} nothing"])
