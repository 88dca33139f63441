"""The convex update of 004 §4.1.4 (notes B6 ``convex_identity``) by hand.

004 §4.1.4: z̃^{(h)} = Σ_{g:(g,h)∈𝓔} φ_{h←g}(z^{(g)}) ∈ V_h and
z^{new} = Σ_h α(h) z̃^{(h)} + (1 − Σ_h α(h)) z, the leftover mass 1 − Σ_h α(h) taken over *all*
destinations (notes B6 writes the same formula). Under a global softmax (Σ_e α_e ≤ 1, the stay
option holding the rest) that formula is a convex combination, and the library's
``convex_identity`` computes it; the per-destination leftover 1 − α(h) is ``gated_replace``.
"""

import torch

from graded.morphic import EdgeSet, GradedStateSpace, Router, apply_update

F64 = torch.float64


def _setup():
    torch.manual_seed(4)
    sp = GradedStateSpace({"a": 2, "b": 3})
    # one edge into each destination, so z̃^{(h)} = φ_e and α(h) = α_e without ambiguity
    es = EdgeSet.explicit(sp, [("a", "b", "ab"), ("b", "a", "ba")])
    z = torch.randn(1, 4, sp.total_dim, dtype=F64)
    cands = [torch.randn(1, 4, sp.dim(e.dest), dtype=F64) for e in es]
    router = Router(sp, es, normalization="global").double()  # α_ab + α_ba + stay = 1
    alpha = router.route(torch.randn(1, 4, 2, dtype=F64)).weights.detach()
    return sp, es, z, cands, alpha


def _paper(sp, z, cands, alpha):
    """Slot by slot: new^{(b)} = α_ab φ_ab + (1 − α_ab − α_ba) z^{(b)}, and the same for a."""
    out = torch.empty_like(z)
    for t in range(z.shape[1]):
        a_ab, a_ba = float(alpha[0, t, 0]), float(alpha[0, t, 1])
        leftover = 1.0 - a_ab - a_ba
        za, zb = z[0, t, :2], z[0, t, 2:]
        out[0, t, :2] = a_ba * cands[1][0, t] + leftover * za
        out[0, t, 2:] = a_ab * cands[0][0, t] + leftover * zb
    return out


def test_convex_identity_is_the_global_leftover_rule_of_section_4_1_4():
    sp, es, z, cands, alpha = _setup()
    got = apply_update("convex_identity", z, cands, alpha, es, sp)
    torch.testing.assert_close(got, _paper(sp, z, cands, alpha), rtol=1e-12, atol=1e-12)


def test_the_per_destination_leftover_is_gated_replace():
    """1 − α(h) in place of 1 − Σ_h α(h): the library's gated_replace, slot by slot."""
    sp, es, z, cands, alpha = _setup()
    out = torch.empty_like(z)
    out[..., :2] = alpha[..., 1:2] * cands[1] + (1 - alpha[..., 1:2]) * z[..., :2]
    out[..., 2:] = alpha[..., 0:1] * cands[0] + (1 - alpha[..., 0:1]) * z[..., 2:]
    got = apply_update("gated_replace", z, cands, alpha, es, sp)
    torch.testing.assert_close(got, out, rtol=1e-12, atol=1e-12)
