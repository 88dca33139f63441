import pytest
import torch
from torch.nn import functional as F

from graded.morphic import UPDATE_MODES, EdgeSet, GradedStateSpace, GradewiseNorm, apply_update


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
                elif mode == "convex_identity":
                    parts[h] = mix + (1 - a.sum()) * zh
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
