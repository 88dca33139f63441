import itertools

import pytest
import torch
from torch.nn import functional as F

from graded.morphic import (
    UPDATE_MODES,
    EdgeSet,
    GradedStateSpace,
    GradewiseNorm,
    LinearBlock,
    MorphicLayer,
    Router,
    apply_update,
)


def setup():
    torch.manual_seed(0)
    sp = GradedStateSpace({"a": 3, "b": 4, "c": 2})  # c has no incoming edge
    es = EdgeSet.explicit(sp, [("a", "b"), ("b", "b"), ("c", "a"), ("a", "a")])
    z = torch.randn(2, 3, sp.total_dim)
    cands = [torch.randn(2, 3, sp.dim(e.dest)) for e in es]
    alpha = torch.rand(2, 3, len(es)) * 0.5
    return sp, es, z, cands, alpha


def naive(mode, sp, es, z, cands, alpha, norm=None, eta=0.3):
    """Per-token, per-edge formulas of notes B6 written with explicit sums."""
    out = torch.empty_like(z)
    for b in range(z.shape[0]):
        for t in range(z.shape[1]):
            zt = z[b, t]
            a = alpha[b, t]
            parts = {}
            for h in sp.labels:
                zh = sp.project(zt, h)
                into = [i for i, e in enumerate(es) if e.dest == h]
                mix = sum((a[i] * cands[i][b, t] for i in into), torch.zeros_like(zh))
                if mode in ("gated_replace", "sample_one"):
                    parts[h] = zh + sum((a[i] * (cands[i][b, t] - zh) for i in into),
                                        torch.zeros_like(zh))
                elif mode == "residual_typed":
                    parts[h] = zh + sum((a[i] * (cands[i][b, t] - (zh if es[i].source == h else 0))
                                         for i in into), torch.zeros_like(zh))
                elif mode == "eta_step":
                    parts[h] = zh + eta * sum((a[i] * (cands[i][b, t] - zh) for i in into),
                                              torch.zeros_like(zh))
                elif mode == "convex_identity":  # the leftover of all of 𝓔, on every grade
                    parts[h] = mix + (1 - sum(float(a[i]) for i in range(len(es)))) * zh
                elif mode == "simplex_dest":
                    parts[h] = mix
                elif mode == "routed_LN":
                    parts[h] = norm.grade(zh + (mix - zh), h) if into else zh
            out[b, t] = sp.join(parts)
    return out


@pytest.mark.parametrize("mode", UPDATE_MODES)
def test_each_update_mode_matches_its_formula(mode):
    sp, es, z, cands, alpha = setup()
    norm = GradewiseNorm(sp) if mode == "routed_LN" else None
    got = apply_update(mode, z, cands, alpha, es, sp, norm=norm, eta=0.3)
    torch.testing.assert_close(got, naive(mode, sp, es, z, cands, alpha, norm), atol=1e-6,
                               rtol=1e-6)


def test_routed_ln_cancels_the_residual():
    sp, es, z, cands, alpha = setup()
    norm = GradewiseNorm(sp)
    got = apply_update("routed_LN", z, cands, alpha, es, sp, norm=norm)
    for h in ("a", "b"):
        mix = sum(alpha[..., i : i + 1] * cands[i] for i in es.incoming(h))
        torch.testing.assert_close(sp.project(got, h), F.layer_norm(mix, (sp.dim(h),)), atol=1e-5,
                                   rtol=1e-5)


def test_gated_replace_keeps_the_skip_path_and_hard_weights_give_the_replacement_update():
    sp, es, z, cands, _ = setup()
    zero = torch.zeros(2, 3, len(es))
    torch.testing.assert_close(apply_update("gated_replace", z, cands, zero, es, sp), z)
    one = zero.clone()
    one[..., 0] = 1.0  # the edge b <- a alone: z − z^{(b)} + φ
    torch.testing.assert_close(apply_update("gated_replace", z, cands, one, es, sp),
                               sp.replace(z, "b", cands[0]))


def test_unknown_update_mode_is_rejected():
    sp, es, z, cands, alpha = setup()
    with pytest.raises(ValueError, match="'sideways'"):
        apply_update("sideways", z, cands, alpha, es, sp)


def hand_alpha(norm, logits, es):
    """Soft α under ``norm`` with the default stay option, written out per token and edge."""
    alpha = torch.zeros_like(logits)
    for idx in itertools.product(*map(range, logits.shape[:-1])):
        x = logits[idx]
        for i, e in enumerate(es):
            into = [j for j, f in enumerate(es) if f.dest == e.dest]
            if norm == "dest":
                alpha[idx][i] = x[i].exp() / (1 + sum(x[j].exp() for j in into))
            elif norm == "global":
                alpha[idx][i] = x[i].exp() / (1 + x.exp().sum())
            else:
                g = torch.sigmoid(x)
                closed = torch.prod(torch.stack([1 - g[j] for j in into]))
                alpha[idx][i] = g[i] / (sum(g[j] for j in into) + closed)
    return alpha


@pytest.mark.parametrize("norm", ["dest", "global", "logistic"])
@pytest.mark.parametrize("mode", UPDATE_MODES)
def test_each_update_mode_matches_its_formula_under_each_default_normalisation(mode, norm):
    sp, es, z, cands, _ = setup()
    router = Router(sp, es, normalization=norm)
    logits = torch.randn(2, 3, len(es)) * 2
    alpha = router.route(logits).weights
    torch.testing.assert_close(alpha, hand_alpha(norm, logits, es))
    norm_mod = GradewiseNorm(sp) if mode == "routed_LN" else None
    got = apply_update(mode, z, cands, alpha, es, sp, norm=norm_mod, eta=0.3)
    torch.testing.assert_close(got, naive(mode, sp, es, z, cands, alpha, norm_mod), atol=1e-6,
                               rtol=1e-6)


@pytest.mark.parametrize("norm", ["dest", "global", "logistic"])
def test_default_gated_replace_keeps_identity_mass_and_is_not_the_bare_mixture(norm):
    sp, _, z, _, _ = setup()
    one = EdgeSet.explicit(sp, [("a", "b", "ab"), ("b", "b", "bb"), ("c", "a", "ca")])
    cands = [torch.randn(2, 3, sp.dim(e.dest)) for e in one]
    router = Router(sp, one, normalization=norm)
    alpha = router.route(torch.randn(2, 3, len(one)) * 2).weights
    got = apply_update("gated_replace", z, cands, alpha, one, sp)
    for h in one.dests:
        into = one.incoming(h)
        stay = 1 - alpha[..., into].sum(-1, keepdim=True)
        assert torch.all(stay > 0)  # the skip path keeps mass at every token
        mix = sum(alpha[..., i : i + 1] * cands[i] for i in into)
        torch.testing.assert_close(sp.project(got, h), mix + stay * sp.project(z, h))
        assert (sp.project(got, h) - mix).abs().max() > 1e-3
    # the single edge c -> a into a is routed, not ≡ 1
    a_edge = alpha[..., one.position("ca")]
    assert torch.all((a_edge > 0) & (a_edge < 1))


def test_convex_identity_leaves_the_global_leftover_on_every_grade():
    """004 §4.1.4 with a global router: new^{(h)} = Σ_{e→h} α_e φ_e + (1 − Σ_{e∈𝓔} α_e) z^{(h)},
    the stay option's mass on every grade (c, with no incoming edge, too); without a stay option
    the leftover is 0 and the state is the routed mixtures alone."""
    sp, es, z, cands, _ = setup()
    for stay in (True, False):
        router = Router(sp, es, normalization="global", stay=stay)
        alpha = router.route(torch.randn(2, 3, len(es))).weights
        got = apply_update("convex_identity", z, cands, alpha, es, sp)
        leftover = 1 - alpha.sum(-1, keepdim=True)
        assert torch.all(leftover >= -1e-6)
        if not stay:
            torch.testing.assert_close(leftover, torch.zeros_like(leftover))
        for h in sp.labels:
            into = es.incoming(h)
            mix = sum((alpha[..., i : i + 1] * cands[i] for i in into),
                      torch.zeros_like(sp.project(z, h)))
            torch.testing.assert_close(sp.project(got, h), mix + leftover * sp.project(z, h))
        # unlike gated_replace, whose leftover is per destination
        assert not torch.allclose(got, apply_update("gated_replace", z, cands, alpha, es, sp))


@pytest.mark.parametrize("norm", ["dest", "logistic"])
def test_convex_identity_is_refused_when_the_routed_mass_can_pass_one(norm):
    sp, es, _, _, _ = setup()
    blocks = [LinearBlock(sp.dim(e.source), sp.dim(e.dest)) for e in es]
    with pytest.raises(ValueError, match=f"normalization='global', got normalization='{norm}'"):
        MorphicLayer(sp, es, blocks, router={"normalization": norm}, update="convex_identity")
