"""Update rules and grade-typed attention: the checks no other test reaches, and precomputed
per-destination mixes against the same rule summed from the candidates."""

import pytest
import torch

from graded.morphic import EdgeSet, GradedStateSpace, apply_update
from graded.morphic.attention_block import GradeTypedAttention


def _setup():
    torch.manual_seed(0)
    sp = GradedStateSpace({"a": 3, "b": 4, "c": 2})  # c has no incoming edge
    es = EdgeSet.explicit(sp, [("a", "b"), ("b", "b"), ("c", "a"), ("a", "a")])
    z = torch.randn(2, 3, sp.total_dim)
    cands = [torch.randn(2, 3, sp.dim(e.dest)) for e in es]
    alpha = torch.rand(2, 3, len(es)) * 0.5
    return sp, es, z, cands, alpha


def test_routed_ln_needs_a_norm_and_alpha_one_weight_per_edge():
    sp, es, z, cands, alpha = _setup()
    with pytest.raises(ValueError, match=r"routed_LN needs a GradewiseNorm \(norm=\.\.\.\)"):
        apply_update("routed_LN", z, cands, alpha, es, sp)
    with pytest.raises(ValueError, match=r"alpha has 3 edge weights, expected 4"):
        apply_update("gated_replace", z, cands, alpha[..., :3], es, sp)


@pytest.mark.parametrize("mode", ["gated_replace", "eta_step", "convex_identity"])
def test_mixes_given_per_destination_equal_the_mixes_summed_from_candidates(mode):
    sp, es, z, cands, alpha = _setup()
    mixes = {h: sum(alpha[..., i:i + 1] * cands[i] for i, e in enumerate(es) if e.dest == h)
             for h in ("a", "b")}
    given = apply_update(mode, z, [], alpha, es, sp, eta=0.3, mixes=mixes)
    summed = apply_update(mode, z, cands, alpha, es, sp, eta=0.3)
    torch.testing.assert_close(given, summed)
    if mode == "gated_replace":  # slot h: z_h + mix_h − (Σ_{e→h} α_e) z_h; c unchanged
        parts = sp.split(z)
        mass_b = alpha[..., 0:1] + alpha[..., 1:2]
        torch.testing.assert_close(sp.split(given)["b"],
                                   parts["b"] + mixes["b"] - mass_b * parts["b"])
        torch.testing.assert_close(sp.split(given)["c"], parts["c"])


@pytest.mark.parametrize("name, kwargs", [("d_src", {"d_src": 0}), ("num_heads",
                                                                   {"num_heads": 1.5})])
def test_attention_block_sizes_must_be_positive_ints(name, kwargs):
    args = {"d_src": 4, "d_dst": 4, **kwargs}
    with pytest.raises(ValueError, match=rf"{name} must be a positive int, got {kwargs[name]!r}"):
        GradeTypedAttention(args.pop("d_src"), args.pop("d_dst"), **args)


def test_attention_block_sources_and_identity_values_are_checked():
    with pytest.raises(ValueError, match=r"key_source must be 'dest' or 'source', got 'both'"):
        GradeTypedAttention(4, 4, key_source="both")
    with pytest.raises(ValueError, match=r"identity_values needs the value grade dim \(3\) to "
                                         r"equal d_dst \(5\)"):
        GradeTypedAttention(3, 5, value_source="source", identity_values=True)


@pytest.mark.parametrize("change, message", [
    # a (1, 1, d) candidate broadcast silently over the tokens; the others failed in torch.cat
    # or a broadcast, naming no edge
    (lambda z, c, a, m: (z, [c[0], c[1][:1, :1], *c[2:]], a, None),
     r"candidate 1 \(edge 'b<-b', b <- b\) has shape \(1, 1, 4\); expected \(2, 3, 4\): the "
     r"rows \(2, 3\) of z, d_b = 4 columns"),
    (lambda z, c, a, m: (z, [c[0][..., :3], *c[1:]], a, None),
     r"candidate 0 \(edge 'b<-a', b <- a\) has shape \(2, 3, 3\); expected \(2, 3, 4\)"),
    (lambda z, c, a, m: (z, [c[0], c[1], c[2], c[3][:, :2]], a, None),
     r"candidate 3 \(edge 'a<-a', a <- a\) has shape \(2, 2, 3\); expected \(2, 3, 3\)"),
    (lambda z, c, a, m: (z, c[:3], a, None),
     r"3 candidates for 4 edges; expected one candidate φ_e per edge"),
    (lambda z, c, a, m: (z, c, a[:1], None),
     r"alpha has shape \(1, 3, 4\); expected \(2, 3, 4\), one weight per edge for each of the "
     r"rows \(2, 3\) of z"),
    (lambda z, c, a, m: (z[..., :8], c, a, None),
     r"z has shape \(2, 3, 8\); expected \(…, D\) with D = Σ d_g = 9"),
    (lambda z, c, a, m: (z, [], a, {"a": m["a"]}),
     r"mixes has no mix for grade 'b', which edges enter; expected one for each of \['a', 'b'\]"),
    (lambda z, c, a, m: (z, [], a, {"a": m["a"], "b": m["b"][:1]}),
     r"mixes\['b'\] has shape \(1, 3, 4\); expected \(2, 3, 4\)"),
    (lambda z, c, a, m: (z, [], a, z[:, :1]),
     r"mixes has shape \(2, 1, 9\); expected \(2, 3, 9\): the rows \(2, 3\) of z, D = 9 columns"),
], ids=["broadcast_candidate", "narrow_candidate", "short_candidate", "missing_candidate",
        "alpha_rows", "z_width", "missing_mix", "mix_rows", "mixes_rows"])
@pytest.mark.parametrize("mode", ["gated_replace", "residual_typed", "simplex_dest"])
def test_apply_update_names_a_tensor_of_the_wrong_shape(mode, change, message):
    sp, es, z, cands, alpha = _setup()
    mixes = {h: sum(alpha[..., i:i + 1] * cands[i] for i, e in enumerate(es) if e.dest == h)
             for h in ("a", "b")}
    z, cands, alpha, mixes = change(z, cands, alpha, mixes)
    with pytest.raises(ValueError, match=message):
        apply_update(mode, z, cands, alpha, es, sp, mixes=mixes)


def test_apply_update_with_well_shaped_candidates_is_the_slotwise_gated_replace():
    sp, es, z, cands, alpha = _setup()
    got = apply_update("gated_replace", z, cands, alpha, es, sp)
    parts, expected = sp.split(z), torch.empty_like(z)
    for b in range(2):  # slot h of token t: z_h + Σ_{e→h} α_e (φ_e − z_h), one token at a time
        for t in range(3):
            for h, cols in sp.slices.items():
                new = parts[h][b, t].clone()
                for i, e in enumerate(es):
                    if e.dest == h:
                        new += alpha[b, t, i] * (cands[i][b, t] - parts[h][b, t])
                expected[b, t, cols] = new
    torch.testing.assert_close(got, expected)
