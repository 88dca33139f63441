"""One routed morphic layer (004 §4.2.1-§4.2.3 with the §3.2 gated update), token by token."""

import math

import torch

from graded.morphic import EdgeSet, GradedStateSpace, LinearBlock, MorphicLayer, UtilityProbe

F64 = torch.float64


def _mv(m, x):
    return [sum(float(m[i, j]) * x[j] for j in range(len(x))) for i in range(m.shape[0])]


def _ce(logits, y):
    top = max(logits)
    return top + math.log(sum(math.exp(v - top) for v in logits)) - logits[y]


def test_layer_output_is_the_utility_routed_gated_update_written_out():
    """Per token t and edge e = (h←g), by hand:
    φ_e = A_e z_t^{(g)};  ℓ_t(e) = u_tᵀ B_e v_e with u_t = W_u c_t + b_u, c_t = mean_{s<t} z_s
    (c_0 = 0), v_e = V_g z_t^{(g)} + c_g  (§4.2.1);
    ΔL_t(e) = CE(W z_t + b, y_t) − CE(W z_t⁺ + b, y_t), z_t⁺ = z_t with slot h := φ_e  (§4.2.3);
    ℓ̃ = ℓ + β(ΔL − τ_e);  α_e = exp(ℓ̃_e/T) / (1 + Σ_{e'→h} exp(ℓ̃_{e'}/T)) (per destination,
    the library's stay option with logit 0);
    z^{new,(h)} = z^{(h)} + Σ_{e→h} α_e (φ_e − z^{(h)}) (§3.2)."""
    torch.manual_seed(2)
    sp = GradedStateSpace({"a": 2, "b": 3})
    es = EdgeSet.explicit(sp, [("a", "b", "ab"), ("b", "b", "bb"), ("b", "a", "ba")])
    blocks = [LinearBlock(sp.dim(e.source), sp.dim(e.dest)) for e in es]
    beta, temp, tau = 1.5, 0.7, [0.125, 0.0, 0.375]  # exact in float32 (τ is stored so)
    layer = MorphicLayer(sp, es, blocks, router={"rank": 3, "init_std": 0.5, "temperature": temp,
                                                 "normalization": "dest"},
                         beta=beta, thresholds=tau, train_routing="utility").double()
    layer.requires_grad_(False)
    n_cls, bsz, length = 4, 2, 3
    w = torch.randn(n_cls, sp.total_dim, dtype=F64)
    b = torch.randn(n_cls, dtype=F64)
    z = torch.randn(bsz, length, sp.total_dim, dtype=F64)
    targets = torch.randint(0, n_cls, (bsz, length))
    got, trace = layer(z, UtilityProbe(w, b, targets))

    r = layer.router
    sl = {"a": slice(0, 2), "b": slice(2, 5)}
    for bi in range(bsz):
        for t in range(length):
            zt = [float(v) for v in z[bi, t]]
            c = [sum(float(z[bi, s, i]) for s in range(t)) / t if t else 0.0 for i in range(5)]
            u = [x + float(bb) for x, bb in zip(_mv(r.proj_u.weight, c), r.proj_u.bias)]
            base = _ce([x + float(bb) for x, bb in zip(_mv(w, zt), b)], int(targets[bi, t]))
            phi, tilde = [], []
            for i, e in enumerate(es):
                src = zt[sl[e.source]]
                phi.append(_mv(blocks[i].proj.weight, src))
                pv = r.proj_v[e.source]
                v = [x + float(bb) for x, bb in zip(_mv(pv.weight, src), pv.bias)]
                ell = sum(u[k] * float(r.bilinear[i, k, m]) * v[m] for k in range(3)
                          for m in range(3))
                plus = list(zt)
                plus[sl[e.dest]] = phi[i]
                after = _ce([x + float(bb) for x, bb in zip(_mv(w, plus), b)],
                            int(targets[bi, t]))
                util = base - after
                assert math.isclose(float(trace.utilities[bi, t, i]), util, rel_tol=1e-9,
                                    abs_tol=1e-12)
                tilde.append(ell + beta * (util - tau[i]))
            new = list(zt)
            for h in ("a", "b"):
                into = [i for i, e in enumerate(es) if e.dest == h]
                den = 1.0 + sum(math.exp(tilde[i] / temp) for i in into)
                zh = zt[sl[h]]
                out = list(zh)
                for i in into:
                    a = math.exp(tilde[i] / temp) / den
                    assert math.isclose(float(trace.alpha[bi, t, i]), a, rel_tol=1e-9)
                    out = [o + a * (p - x) for o, p, x in zip(out, phi[i], zh)]
                new[sl[h]] = out
            for j in range(5):
                assert math.isclose(float(got[bi, t, j]), new[j], rel_tol=1e-9, abs_tol=1e-12)


@torch.no_grad()
def _tilde_offset(tau):
    """ℓ̃ − ℓ = β(ΔL − τ) of a float64 layer, read back at ΔL = 0 (zero readout)."""
    sp = GradedStateSpace({"a": 2})
    es = EdgeSet.explicit(sp, [("a", "a", "aa")])
    layer = MorphicLayer(sp, es, [LinearBlock(2, 2)], beta=1.0, thresholds=[tau],
                         train_routing="utility").double()
    z = torch.randn(1, 2, 2, dtype=F64)
    w = torch.zeros(3, 2, dtype=F64)
    _, trace = layer(z, UtilityProbe(w, None, torch.zeros(1, 2, dtype=torch.long)))
    return trace.utility_logits - trace.context_logits


def test_a_float64_layer_uses_its_thresholds_exactly_in_the_utility_logits():
    offset = _tilde_offset(0.1)
    torch.testing.assert_close(offset, torch.full_like(offset, -0.1), rtol=0, atol=1e-15)
