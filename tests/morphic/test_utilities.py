import pytest
import torch
from torch.nn import functional as F

from graded.morphic import EdgeSet, Grade, GradedStateSpace, exact_utilities, first_order_utilities
from graded.morphic.reference import PaperGradedLayer, paper_lm_loss


def setup(seed=0):
    torch.manual_seed(seed)
    sp = GradedStateSpace([Grade("a", 3), Grade("b", 4), Grade("c", 2)])
    es = EdgeSet.explicit(sp, [("a", "b", "x"), ("b", "b", "y"), ("c", "a", "z"), ("a", "b", "w")])
    z = torch.randn(2, 5, sp.total_dim)
    cands = [torch.randn(2, 5, sp.dim(e.dest)) for e in es]
    w, bias = torch.randn(7, sp.total_dim), torch.randn(7)
    targets = torch.randint(0, 7, (2, 5))
    targets[0, 1] = -100
    return sp, es, z, cands, w, bias, targets


def test_batched_utilities_equal_a_naive_per_edge_per_token_recomputation():
    sp, es, z, cands, w, bias, targets = setup()
    got = exact_utilities(z, cands, es, sp, w, bias, targets)
    for b in range(2):
        for t in range(5):
            y = int(targets[b, t])
            for i, e in enumerate(es):
                if y == -100:
                    assert got[b, t, i] == 0
                    continue
                zb = z[b, t]
                zp = zb.clone()
                zp[sp.slices[e.dest]] = cands[i][b, t]
                lb = F.cross_entropy((w @ zb + bias)[None], torch.tensor([y]))
                lp = F.cross_entropy((w @ zp + bias)[None], torch.tensor([y]))
                torch.testing.assert_close(got[b, t, i], lb - lp, atol=1e-5, rtol=1e-5)


def test_first_order_utility_is_minus_gradient_dot_delta():
    sp, es, z, cands, w, bias, targets = setup(1)
    got = first_order_utilities(z, cands, es, sp, w, bias, targets)
    zz = z.clone().requires_grad_(True)
    logits = zz @ w.T + bias
    F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").backward()
    for i, e in enumerate(es):
        s = sp.slices[e.dest]
        want = -((cands[i] - z[..., s]) * zz.grad[..., s]).sum(-1)
        want[targets == -100] = 0
        torch.testing.assert_close(got[..., i], want, atol=1e-5, rtol=1e-5)


def test_first_order_utility_approaches_exact_for_small_steps():
    sp, es, z, cands, w, bias, targets = setup(2)
    small = [z[..., sp.slices[e.dest]] + 1e-3 * (c - z[..., sp.slices[e.dest]])
             for e, c in zip(es, cands)]
    ex = exact_utilities(z.double(), [c.double() for c in small], es, sp, w.double(), bias.double(),
                         targets)
    fo = first_order_utilities(z.double(), [c.double() for c in small], es, sp, w.double(),
                               bias.double(), targets)
    assert (ex - fo).abs().max() < 1e-5 * max(1.0, float(fo.abs().max()) * 1e3)


def test_utilities_carry_gradient_to_the_blocks_only_by_default():
    sp, es, z, cands, w, bias, targets = setup(3)
    z = z.requires_grad_(True)
    w = w.requires_grad_(True)
    cands = [c.requires_grad_(True) for c in cands]
    exact_utilities(z, cands, es, sp, w, bias, targets).sum().backward()
    assert z.grad is None and w.grad is None
    assert all(c.grad is not None and c.grad.abs().sum() > 0 for c in cands)


def test_mean_per_token_utility_equals_the_paper_layer_batch_utility():
    torch.manual_seed(4)
    grades, dims = ["a", "b"], {"a": 3, "b": 4}
    pairs = [("a", "b"), ("b", "b"), ("b", "a")]
    paper = PaperGradedLayer(grades, pairs, dims, r=4)
    head = torch.nn.Linear(7, 6)
    n = 32
    zd = {g: torch.randn(n, dims[g]) for g in grades}
    y = torch.randint(0, 6, (n,))
    _, aux = paper(zd, y, paper_lm_loss(head, grades))
    sp = GradedStateSpace(dims)
    es = EdgeSet.explicit(sp, pairs)
    z = torch.cat([zd[g] for g in grades], -1)[None]
    cands = [paper.phi[f"{h}|{g}"](zd[g])[None] for g, h in pairs]
    ours = exact_utilities(z, cands, es, sp, head.weight, head.bias, y[None])
    for i, e in enumerate(pairs):
        torch.testing.assert_close(ours[0, :, i].mean(), aux["utilities"][e], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk", [None, 2])
def test_fused_edge_utility_gradients_pass_gradcheck_in_float64(chunk):
    from graded.morphic.utilities import _EdgeUtility

    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    delta = torch.randn(6, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w_h = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 5, (6,), generator=g)

    def f(b, d, w):
        return _EdgeUtility.apply(b, torch.logsumexp(b, -1, keepdim=True).detach(), d, w, y,
                                  chunk, 1 << 30)

    assert torch.autograd.gradcheck(f, (base, delta, w_h))
    # only δ needing a gradient takes the path that keeps p⁺W_h instead of the exponentials
    assert torch.autograd.gradcheck(lambda d: f(base.detach(), d, w_h.detach()), (delta,))


def test_utilities_are_invariant_under_conjugation_with_a_transported_readout():
    """004 Prop 3.11/4.14: Φ = D K̂ D⁻¹ on z equals K̂ on ẑ = D⁻¹z when the readout is W D."""
    from graded.morphic import BandedBlocks, ConjugatedBlocks

    torch.manual_seed(6)
    sp = GradedStateSpace([Grade(f"g{i}", 3, i) for i in range(3)])
    scales = {g: torch.rand(3) + 0.5 for g in sp.labels}
    conj = ConjugatedBlocks(sp, [0, 1], scales=scales)
    plain = BandedBlocks(sp, [0, 1])
    plain.load_state_dict(conj.state_dict(), strict=False)
    d = torch.cat([scales[g] for g in sp.labels])  # diagonal of D
    z = torch.randn(2, 4, sp.total_dim)
    z_hat = z / d
    w, b = torch.randn(5, sp.total_dim), torch.randn(5)
    targets = torch.randint(0, 5, (2, 4))
    es = conj.edge_set
    cands = [blk(sp.project(z, e.source)) for e, blk in zip(es, conj.blocks())]
    cands_hat = [blk(sp.project(z_hat, e.source)) for e, blk in zip(es, plain.blocks())]
    u = exact_utilities(z, cands, es, sp, w, b, targets)
    u_hat = exact_utilities(z_hat, cands_hat, es, sp, w * d, b, targets)
    torch.testing.assert_close(u, u_hat, atol=1e-5, rtol=1e-5)


def test_fused_edge_utility_backward_twice_over_a_retained_graph_gives_the_same_gradients():
    """The backward pass reads the saved exponentials without writing them."""
    from graded.morphic.utilities import _EdgeUtility

    g = torch.Generator().manual_seed(7)
    base = torch.randn(5, 9, generator=g)
    delta = torch.randn(5, 2, generator=g, requires_grad=True)
    w_h = torch.randn(9, 2, generator=g, requires_grad=True)
    y = torch.randint(0, 9, (5,), generator=g)
    u = _EdgeUtility.apply(base, torch.logsumexp(base, -1, keepdim=True), delta, w_h, y, None,
                           1 << 30)
    weights = torch.randn(5, generator=g)
    first = torch.autograd.grad(u, (delta, w_h), weights, retain_graph=True)
    second = torch.autograd.grad(u, (delta, w_h), weights)
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b)
    naive = (torch.log_softmax(base + delta @ w_h.T, -1).gather(-1, y[:, None]).squeeze(-1)
             - torch.log_softmax(base, -1).gather(-1, y[:, None]).squeeze(-1))
    torch.testing.assert_close(u, naive)
    for a, b in zip(first, torch.autograd.grad(naive, (delta, w_h), weights)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("needs", ["delta", "delta_and_w"])
@pytest.mark.parametrize("chunk", [None, 4])
@pytest.mark.parametrize("scale", [1.0, 300.0, -300.0])
def test_fused_edge_utility_is_exact_when_the_edge_moves_logits_by_hundreds_of_nats(
        scale, chunk, needs):
    """Rows whose exponentials over- or underflow without a shift are redone with their maxima;
    with only δ needing a gradient the backward pass uses p⁺W_h from the forward pass."""
    from graded.morphic.utilities import _EdgeUtility

    g = torch.Generator().manual_seed(8)
    base = torch.randn(6, 11, generator=g)
    base = base - base.amax(-1, keepdim=True)  # as exact_utilities passes it
    delta = torch.randn(6, 2, generator=g) * scale
    delta[0] = 0.0  # one row on the fast path in every case
    delta.requires_grad_(True)
    w_h = torch.rand(11, 2, generator=g).requires_grad_(needs == "delta_and_w")
    y = torch.randint(0, 11, (6,), generator=g)
    u = _EdgeUtility.apply(base, torch.logsumexp(base, -1, keepdim=True), delta, w_h, y, chunk,
                           1 << 30)
    naive = (torch.log_softmax(base + delta @ w_h.T, -1).gather(-1, y[:, None]).squeeze(-1)
             - torch.log_softmax(base, -1).gather(-1, y[:, None]).squeeze(-1))
    assert torch.isfinite(u).all()
    torch.testing.assert_close(u, naive, rtol=1e-5, atol=1e-4)
    weights = torch.randn(6, generator=g)
    inputs = (delta, w_h) if needs == "delta_and_w" else (delta,)
    for a, b in zip(torch.autograd.grad(u, inputs, weights),
                    torch.autograd.grad(naive, inputs, weights)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_chunked_paths_equal_the_unchunked_ones_and_are_chosen_above_the_memory_limits(
        monkeypatch):
    import graded.morphic.utilities as U

    torch.manual_seed(9)
    sp = GradedStateSpace([Grade(f"g{i}", 3, i) for i in range(3)])
    es = EdgeSet.explicit(sp, [("g0", "g1"), ("g1", "g1"), ("g2", "g0")])
    z = torch.randn(2, 5, sp.total_dim, requires_grad=True)
    w = torch.randn(7, sp.total_dim, requires_grad=True)
    b = torch.randn(7, requires_grad=True)
    targets = torch.randint(0, 7, (2, 5))
    targets[0, 1] = -100
    blocks = [torch.nn.Linear(3, 3, bias=False) for _ in es]
    parts = sp.split(z)

    def grads(attach, **kw):
        cands = [blk(parts[e.source]) for blk, e in zip(blocks, es)]
        u = exact_utilities(z, cands, es, sp, w, b, targets, attach=attach, **kw)
        wrt = [blk.weight for blk in blocks] + ([z, w, b] if attach == "all" else [])
        return u, torch.autograd.grad((u * torch.arange(u.numel()).view_as(u)).sum(), wrt)

    rows_seen = []
    original = U._edge_rows
    monkeypatch.setattr(U, "_edge_rows", lambda base, *a: rows_seen.append(base.shape[0])
                        or original(base, *a))
    for attach in ("phi", "all"):
        u_ref, g_ref = grads(attach)
        assert set(rows_seen) == {9}  # the 9 valid tokens in one piece
        for kw in ({"chunk_rows": 1}, {"chunk_rows": 4}):
            u, gs = grads(attach, **kw)
            torch.testing.assert_close(u, u_ref)
            for a, c in zip(gs, g_ref):
                torch.testing.assert_close(a, c)
        # above the limits the rows are cut into chunks of _CHUNK_ELEMENTS // V = 2
        limit = "_TEMP_BYTES_LIMIT" if attach == "phi" else "SAVED_BYTES_LIMIT"
        with monkeypatch.context() as mp:
            mp.setattr(U, limit, 0)
            mp.setattr(U, "_CHUNK_ELEMENTS", 14)
            rows_seen.clear()
            u, gs = grads(attach)
            assert set(rows_seen) == {2, 1}
            torch.testing.assert_close(u, u_ref)
            for a, c in zip(gs, g_ref):
                torch.testing.assert_close(a, c)
        rows_seen.clear()
    with pytest.raises(ValueError, match="chunk_rows"):
        grads("phi", chunk_rows=0)


@pytest.mark.parametrize("attach", ["phi", "all"])
@pytest.mark.parametrize("kind", ["exact", "first_order"])
def test_the_traced_path_equals_the_eager_one_in_values_and_gradients(monkeypatch, attach, kind):
    """Under torch.compile the utilities run on every row with plain tensor operations (no
    boolean indexing, no fused autograd Function); forced here in eager mode, it gives the same
    utilities and the same gradients, ignored targets included (utility 0, no gradient)."""
    from graded.morphic.utilities import compute_utilities

    sp, es, z, cands, w, bias, targets = setup(3)
    z, w, bias = z.double(), w.double(), bias.double()
    cands = [c.double() for c in cands]

    def run():
        leaves = [t.clone().requires_grad_() for t in (z, w, bias, *cands)]
        u = compute_utilities(kind, leaves[0], leaves[3:], es, sp, leaves[1], leaves[2], targets,
                              attach=attach)
        (u * torch.linspace(-1, 2, u.numel(), dtype=u.dtype).view_as(u)).sum().backward()
        return u.detach(), [None if t.grad is None else t.grad.clone() for t in leaves]

    eager, eager_grads = run()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced, traced_grads = run()
    torch.testing.assert_close(traced, eager, atol=1e-12, rtol=0)
    assert bool((traced[0, 1] == 0).all())
    for a, b in zip(traced_grads, eager_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kind", ["exact", "first_order"])
@pytest.mark.parametrize("ignored", [False, True])
def test_utilities_wait_once_for_the_scored_rows_and_trust_checked_targets(kind, ignored,
                                                                          monkeypatch):
    """The scored rows are found with one read (``nonzero``) and gathered by index: no
    boolean indexing, which waits for a GPU in every gather and in its backward pass. Inside
    ``checked_inputs`` the targets' range is not read again; the exact utilities read one flag
    per edge (rows outside the fast path's range are redone). Gradients flow as before."""
    import graded.morphic.utilities as U
    from graded.checks import checked_inputs
    from graded.morphic.utilities import compute_utilities
    from host_reads import HostReads

    checks = []
    check = U.check_id_range
    monkeypatch.setattr(U, "check_id_range", lambda *a: checks.append(a) or check(*a))
    sp, es, z, cands, w, bias, targets = setup(4)
    if not ignored:
        targets = targets.clamp(min=0)
    cands = [c.requires_grad_() for c in cands]
    with checked_inputs(), HostReads() as reads:
        u = compute_utilities(kind, z, cands, es, sp, w, bias, targets)
        u.sum().backward()
    per_edge = len(es) if kind == "exact" else 0
    names = [site.split(" in ")[0] for site in reads.sites]
    assert names == ["nonzero"] + ["_local_scalar_dense"] * per_edge, reads.sites
    assert all(c.grad is not None for c in cands)
    assert bool((u[0, 1] == 0).all()) == ignored
    assert checks == []
    compute_utilities(kind, z, cands, es, sp, w, bias, targets)  # outside: the range checked
    assert len(checks) == 1


def test_utilities_refuse_targets_outside_the_readout_naming_their_range():
    sp, es, z, cands, w, bias, targets = setup(5)
    targets[1, 2] = 7  # the readout has 7 classes
    with pytest.raises(ValueError, match=r"targets other than -100 must lie in \[0, 7\); got "
                                         r"range \[\d, 7\]"):
        exact_utilities(z, cands, es, sp, w, bias, targets)


@pytest.mark.parametrize("utilities", [exact_utilities, first_order_utilities])
@pytest.mark.parametrize("attach", ["phi", "all"])
def test_utilities_under_bf16_autocast_are_the_float32_utilities_of_the_bf16_states(
        attach, utilities):
    """Mixed precision hands the utilities bf16 states and a float32 readout; ΔL, a difference
    of log-probabilities, is computed in float32 with autocast off: exactly the float32
    utilities of the same (bf16-rounded) states, with gradients in the states' dtype."""
    sp, es, z, cands, w, bias, targets = setup(3)
    zb = z.bfloat16().requires_grad_()
    cb = [c.bfloat16().requires_grad_() for c in cands]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = utilities(zb, cb, es, sp, w, bias, targets, attach=attach)
    want = utilities(zb.detach().float(), [c.detach().float() for c in cb], es, sp, w,
                           bias, targets, attach=attach)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    got.sum().backward()
    assert all(c.grad is not None and c.grad.dtype == torch.bfloat16
               and torch.isfinite(c.grad).all() for c in cb)
