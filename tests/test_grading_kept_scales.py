"""Scales of gradings that take no gradient are kept across calls (GradingMap._kept_value):
recomputed exactly when what they are computed from changes, never stale."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graded import TransformerConfig, TransformerLM
from graded.grading import ExponentialGrading, LinearGrading


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = []
        self.kernels = 0  # operators that are not views (each a kernel launch on a GPU)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        self.kernels += not func.is_view and func.overloadpacket not in (
            torch.ops.aten.detach, torch.ops.aten._local_scalar_dense)
        return func(*args, **(kwargs or {}))


def _linear(grades, f="shift"):
    return torch.tensor([{"shift": q + 1.0, "identity": q}[f] for q in grades])


def _exponential(grades, base):
    return torch.tensor([base ** q for q in grades])


def test_fixed_scales_are_computed_once_and_returned_again_without_any_operator():
    g = ExponentialGrading(3, [0.0, 1.0, 2.5], base=2.0)
    first = g.scales()
    with _Count() as count:
        again = g.scales()
    assert again is first and count.ops == []
    torch.testing.assert_close(first, _exponential([0.0, 1.0, 2.5], 2.0))


@pytest.mark.parametrize("change", ["set_grades", "in_place", "load_state_dict", "double"])
def test_changed_fixed_grades_give_new_scales(change):
    g = LinearGrading(3, [0.0, 1.0, 2.0])
    before = g.scales()
    new = [3.0, 0.5, 1.0]
    if change == "set_grades":
        g.set_grades(new)
    elif change == "in_place":
        with torch.no_grad():
            g.grades.copy_(torch.tensor(new))
    elif change == "load_state_dict":
        g.load_state_dict({"grades": torch.tensor(new)})
    else:
        g.double()
        new = [0.0, 1.0, 2.0]
    after = g.scales()
    assert after is not before
    torch.testing.assert_close(after, _linear(new).to(g.grades.dtype))


def test_a_new_base_gives_new_scales_and_a_new_log_base():
    g = ExponentialGrading(2, [1.0, 2.0], base=2.0)
    torch.testing.assert_close(g.scales(), _exponential([1.0, 2.0], 2.0))
    g.set_base(3.0)
    torch.testing.assert_close(g.scales(), _exponential([1.0, 2.0], 3.0))
    with torch.no_grad():
        g.base.fill_(1.5)  # not through set_base: the version counter still sees it
    torch.testing.assert_close(g.scales(), _exponential([1.0, 2.0], 1.5))
    torch.testing.assert_close(g._log_base(), torch.tensor(math.log(1.5)))


def test_the_autocast_dtype_keeps_scales_of_its_own():
    """EGT's clamp depends on the compute dtype: float32 and float16 autocast keep different
    values, each the one computed afresh."""
    g = ExponentialGrading(2, [0.0, 20.0], base=2.0)
    plain = g.scales()
    with torch.autocast("cpu", dtype=torch.float16), pytest.warns(RuntimeWarning, match="clamp"):
        fast = g.scales()
    torch.testing.assert_close(plain, _exponential([0.0, 20.0], 2.0))
    fp16_cap = math.exp(0.5 * math.log(torch.finfo(torch.float16).max) - 1.0)
    torch.testing.assert_close(fast, torch.tensor([1.0, fp16_cap]))
    assert g.scales() is plain


def test_learnable_grades_are_computed_afresh_each_call_even_without_gradients():
    """Parameters are what finite differences perturb through ``.data``, unseen by any
    version counter: their scales are never kept."""
    g = LinearGrading(3, [0.0, 1.0, 2.0], learnable=True)
    a, b = g.scales(), g.scales()
    assert a is not b and a.grad_fn is not None
    with torch.no_grad():
        g.scales()
        g.grades.data[0] = 4.0
        torch.testing.assert_close(g.scales(), _linear([4.0, 1.0, 2.0]))


def test_grades_passed_to_a_functional_call_are_used_not_the_kept_ones():
    g = LinearGrading(2, [0.0, 1.0])
    g.scales()
    for q in ([5.0, 6.0], [7.0, 8.0]):  # temporaries: their storage may be reused
        out = torch.func.functional_call(g, {"grades": torch.tensor(q)}, (torch.ones(2),))
        torch.testing.assert_close(out, _linear(q))
    torch.testing.assert_close(g.scales(), _linear([0.0, 1.0]))


@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_a_tangent_of_fixed_grades_is_not_lost_to_the_kept_scales(kind):
    """Fixed grades given a tangent q̇ (forward-mode AD; the dual shares the grades' storage
    and version) after their scales were kept: the scales' tangent is q̇ (LGT, q + 1) or
    ln λ·λ^q·q̇ (EGT), not the zero of the kept value."""
    import torch.autograd.forward_ad as fwAD

    q = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    g = (LinearGrading(3, q) if kind == "linear" else ExponentialGrading(3, q)).double()
    g.scales()  # kept
    dq = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    with fwAD.dual_level():
        dual = fwAD.make_dual(g.grades, dq)
        ones = torch.ones(3, dtype=torch.float64)
        scales = torch.func.functional_call(g, {"grades": dual}, (ones,))
        tangent = fwAD.unpack_dual(scales).tangent
    if kind == "linear":
        expected = dq
    else:
        base = float(g.base)
        expected = math.log(base) * base ** q * dq
    assert tangent is not None
    torch.testing.assert_close(tangent, expected, rtol=1e-12, atol=0)


def test_a_fixed_grade_model_follows_its_grades_between_forward_passes():
    cfg = TransformerConfig(vocab_size=17, d_model=16, n_heads=2, n_layers=1, max_len=8,
                            grading="exponential", grade_init="warm_start",
                            grade_init_value=0.3)
    torch.manual_seed(0)
    model = TransformerLM(cfg).eval()
    ids = torch.randint(0, 17, (2, 6))
    first = model(ids)
    torch.testing.assert_close(model(ids), first, rtol=0, atol=0)
    twin = TransformerLM(cfg).eval()
    for grading in (model.decoder.embed.input_grading.grading,
                    model.decoder.stack.blocks[0].self_attn.attn.grading):
        grading.set_grades(2.0 * grading.grades)
    twin.load_state_dict(model.state_dict())
    fresh = twin(ids)
    assert not torch.allclose(model(ids), first)
    torch.testing.assert_close(model(ids), fresh, rtol=0, atol=0)


def test_fixed_grade_attention_builds_its_packed_row_scales_once():
    from graded.attention import GradedMultiheadAttention

    torch.manual_seed(0)
    attn = GradedMultiheadAttention(8, 2, grading="linear", grades=[0.0, 1.0, 2.0, 3.0],
                                    variant="queries_keys", batch_first=True)
    x = torch.randn(2, 5, 8)
    first = attn(x, x, x)[0]
    with _Count() as count:
        again = attn(x, x, x)[0]
    assert not [op for op in count.ops if "cat" in op or "new_ones" in op or "add." in op]
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    attn.grading.set_grades([1.0, 0.0, 0.0, 2.0])
    twin = GradedMultiheadAttention(8, 2, grading="linear", grades=[1.0, 0.0, 0.0, 2.0],
                                    variant="queries_keys", batch_first=True)
    twin.load_state_dict(attn.state_dict())
    torch.testing.assert_close(attn(x, x, x)[0], twin(x, x, x)[0], rtol=0, atol=0)
    assert not torch.allclose(attn(x, x, x)[0], first)


def test_a_buffer_switched_to_take_gradients_gets_scales_with_a_graph():
    """``requires_grad_`` bumps no version counter: the kept scales must still not be used."""
    g = ExponentialGrading(2, [1.0, 2.0], base=3.0)
    kept = g.scales()
    g.grades.requires_grad_(True)
    fresh = g.scales()
    assert fresh is not kept and fresh.grad_fn is not None
    fresh.sum().backward()
    torch.testing.assert_close(g.grades.grad, _exponential([1.0, 2.0], 3.0) * math.log(3.0))


def test_folded_parts_follow_the_fold_switch():
    from graded.attention import GradedMultiheadAttention
    from graded.folding import activation_grading

    attn = GradedMultiheadAttention(8, 2, grading="linear", grades=[0.0, 1.0, 2.0, 3.0],
                                    variant="queries_keys", batch_first=True)
    assert attn.folded_parts == ("q", "k")
    with activation_grading(attn):
        assert attn.folded_parts == ()
    assert attn.folded_parts == ("q", "k")


# -- the learnable scales of a model's attention layers, computed together ----------------

def _alike(kind, n, heads=None, bases=None):
    from graded.attention.graded import make_grading

    torch.manual_seed(1)
    out = []
    for i in range(n):
        shape = (4,) if heads is None else (heads, 4)
        q = (torch.rand(shape, dtype=torch.float64) * 2 - 0.5)  # some below the floor
        g = make_grading(kind, 4, q, learnable=True, num_heads=heads,
                         base=2.0 if bases is None else bases[i])
        out.append(g)
    return out


@pytest.mark.parametrize("kind, heads, bases", [
    ("linear", None, None), ("linear", 3, None), ("exponential", None, [1.5, 2.0, 3.0]),
    ("exponential", 3, [2.0, 2.0, 2.5])])
def test_batched_scales_equal_each_gradings_scales_in_values_and_gradients(kind, heads, bases):
    from graded.grading import batched_scales

    gs = _alike(kind, 3, heads, bases)
    w = [torch.randn(g.grades.shape, dtype=torch.float64) for g in gs]
    one_by_one = [g.scales() for g in gs]
    loss = sum((s * wi).sum() for s, wi in zip(one_by_one, w))
    expected = torch.autograd.grad(loss, [g.grades for g in gs])
    together = batched_scales(gs)
    for a, b in zip(together, one_by_one):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    loss = sum((s * wi).sum() for s, wi in zip(together, w))
    for a, b in zip(torch.autograd.grad(loss, [g.grades for g in gs]), expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


def test_unlike_gradings_are_not_batched():
    from graded.attention.graded import make_grading
    from graded.grading import batched_scales

    a = make_grading("linear", 4, learnable=True)
    assert batched_scales([a, make_grading("linear", 4, learnable=True, f="softplus")]) is None
    assert batched_scales([a, make_grading("exponential", 4, learnable=True)]) is None
    assert batched_scales([a, make_grading("linear", 5, learnable=True)]) is None


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_a_model_batching_its_head_scales_gives_the_same_logits_and_gradients(grading):
    cfg = TransformerConfig(vocab_size=17, d_model=16, n_heads=2, n_layers=3, max_len=8,
                            grading=grading, learnable_grades=True, grade_init="warm_start",
                            grade_init_value=0.2)
    torch.manual_seed(0)
    model = TransformerLM(cfg).double()
    ids = torch.randint(0, 17, (2, 6))
    runs = []
    for batch in (True, False):
        model.zero_grad()
        model.batch_grading = batch
        with _Count() as count:
            logits = model(ids)
        logits.square().mean().backward()
        runs.append((logits, [p.grad.clone() for p in model.parameters()], count.kernels))
    (lb, gb, ops_b), (lu, gu, ops_u) = runs
    torch.testing.assert_close(lb, lu, rtol=0, atol=0)
    for a, b in zip(gb, gu):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)
    assert ops_b < ops_u, (ops_b, ops_u)  # fewer kernels in the forward pass
    heads = model.grading_plan.heads
    assert len(heads) == 3 and all(g._scales_memo is None for g in heads)  # nothing held


# -- what changes the kept values, and what keeps nothing ---------------------------------

@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_gradings_made_under_inference_mode_give_their_scales_and_keep_nothing(kind):
    """Inference tensors have no version counter: nothing derived from them is kept."""
    from graded.attention.graded import make_grading

    with torch.inference_mode():
        g = make_grading(kind, 3, torch.tensor([0.0, 1.0, 2.0]), base=2.0)
    expected = _linear([0.0, 1.0, 2.0]) if kind == "linear" else _exponential([0, 1, 2], 2.0)
    torch.testing.assert_close(g.scales(), expected)
    torch.testing.assert_close(g.scales(), expected)
    assert not g._kept


def test_a_fixed_grade_lm_made_under_inference_mode_runs():
    cfg = TransformerConfig(vocab_size=17, d_model=16, n_heads=2, n_layers=2, max_len=8,
                            grading="linear", grade_init="warm_start", grade_init_value=0.3)
    torch.manual_seed(0)
    with torch.inference_mode():
        model = TransformerLM(cfg).eval()
        ids = torch.randint(0, 17, (2, 6))
        first = model(ids)
        torch.testing.assert_close(model(ids), first, rtol=0, atol=0)
    torch.manual_seed(0)
    twin = TransformerLM(cfg).eval()
    with torch.no_grad():
        torch.testing.assert_close(twin(ids.clone()), first.clone(), rtol=0, atol=0)


def test_is_parameter_agrees_with_isinstance():
    from graded.grading import _is_parameter

    flagged = torch.zeros(2)
    flagged._is_param = True
    cases = [torch.nn.Parameter(torch.zeros(2)), torch.zeros(2), flagged,
             torch.nn.Parameter(torch.zeros(2), requires_grad=False)]
    for t in cases:
        assert _is_parameter(t) == isinstance(t, torch.nn.Parameter)


def _attention(grading="linear", grades=(0.0, 1.0, 2.0, 3.0), **kw):
    from graded.attention import GradedMultiheadAttention

    torch.manual_seed(0)
    return GradedMultiheadAttention(8, 2, grading=grading, grades=list(grades),
                                    variant="queries_keys", batch_first=True, **kw)


def test_kept_packed_rows_are_returned_again_and_follow_every_change():
    """Fixed-grade packed rows are kept (the same tensor, no operator) and built afresh when
    the grades, the grading module, the fold switch, the autocast dtype or the weights'
    dtype change: each time equal to rows built from scratch."""
    from graded.attention.graded import make_grading
    from graded.folding import activation_grading

    attn = _attention("exponential", (0.0, 1.0, 20.0, 3.0))

    def fresh():  # the rows from the scales, without anything kept
        return attn._packed_row_scales(attn._projection_scales_of(attn.grading._scales()))

    first = attn.packed_projection_rows()
    with _Count() as count:
        assert attn.packed_projection_rows() is first
    assert count.ops == []
    torch.testing.assert_close(first, fresh(), rtol=0, atol=0)
    attn.grading.set_grades([1.0, 0.0, 2.0, 0.5])
    changed = attn.packed_projection_rows()
    assert changed is not first
    torch.testing.assert_close(changed, fresh(), rtol=0, atol=0)
    attn.grading = make_grading("exponential", 4, torch.tensor([1.0, 0.0, 2.0, 0.5]), base=3.0)
    other = attn.packed_projection_rows()
    torch.testing.assert_close(other, fresh(), rtol=0, atol=0)
    assert not torch.equal(other, changed)
    with activation_grading(attn):
        assert attn.packed_projection_rows() is None  # nothing folded
    attn.grading.set_grades([0.0, 30.0, 0.0, 0.0])  # 3^30: clamped in float16 only
    plain = attn.packed_projection_rows()
    with torch.autocast("cpu", dtype=torch.float16), pytest.warns(RuntimeWarning, match="clamp"):
        half = attn.packed_projection_rows()  # EGT's clamp depends on the compute dtype
    assert half.max() < plain.max()
    attn.double()
    doubled = attn.packed_projection_rows()
    assert doubled.dtype == torch.float64
    torch.testing.assert_close(doubled, fresh(), rtol=0, atol=0)


def test_learnable_attention_builds_its_rows_every_call():
    attn = _attention(learnable_grades=True)
    a, b = attn.packed_projection_rows(), attn.packed_projection_rows()
    assert a is not b and a.grad_fn is not None


def test_a_models_stacked_head_scales_are_taken_row_by_row_only_when_asked_for():
    """The batched head scales of a pass are held as (stacked tensor, row): a layer that
    asks for its scales gets a view of its row; the folds use the stacked tensor."""
    from graded.grading import stacked_scales

    gs = _alike("linear", 3)
    stacked = stacked_scales(gs)
    key = gs[0]._memo_key(gs[0].grades)
    for i, g in enumerate(gs):
        assert g._hold_given_scales(stacked, i, key=key)
    assert all(type(g._scales_memo[key]) is tuple for g in gs)
    got = gs[1].scales()
    assert got._base is stacked and gs[1].scales() is got
    torch.testing.assert_close(got, gs[1]._scales_from(gs[1].grades), rtol=0, atol=0)
    assert type(gs[0]._scales_memo[key]) is tuple  # not asked for: no view made
    for g in gs:
        g._drop_scales()
        assert g._scales_memo is None


def test_shared_qk_attention_keeps_its_query_value_rows_and_follows_the_grades():
    """With ``shared_qk`` the packed weight has query and value blocks: their fixed-grade
    rows are kept the same way, equal to rows built from the scales, and rebuilt when the
    grades change; the projection equals the packed weight's rows scaled by hand."""
    from graded.attention import GradedMultiheadAttention

    torch.manual_seed(0)
    attn = GradedMultiheadAttention(
        8, 2, grading="linear", grades=[0.0, 1.0, 2.0, 3.0], variant="values",
        batch_first=True, backend="lsh",
        backend_options={"shared_qk": True, "n_buckets": 1, "chunk_size": 8})
    x = torch.randn(2, 5, 8)
    rows = attn.packed_projection_rows()
    assert rows.shape == (16,)
    with _Count() as count:
        assert attn.packed_projection_rows() is rows
    assert count.ops == []
    s_q, _, s_v = attn._projection_scales_of(attn.grading._scales_from(attn.grading.grades))
    torch.testing.assert_close(rows, attn._packed_row_scales((s_q, s_v)), rtol=0, atol=0)
    expected = (x @ attn.in_proj_weight.T + attn.in_proj_bias) * rows
    q, k, v = attn.project(x, x, x)
    torch.testing.assert_close(k, q, rtol=0, atol=0)  # the keys passed on are the queries
    torch.testing.assert_close(q.transpose(1, 2).flatten(-2), expected[..., :8])
    torch.testing.assert_close(v.transpose(1, 2).flatten(-2), expected[..., 8:])
    attn.grading.set_grades([1.0, 0.0, 0.5, 2.0])
    changed = attn.packed_projection_rows()
    s_q, _, s_v = attn._projection_scales_of(attn.grading._scales_from(attn.grading.grades))
    torch.testing.assert_close(changed, attn._packed_row_scales((s_q, s_v)), rtol=0, atol=0)
    assert not torch.equal(changed, rows)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_a_pass_under_inference_mode_keeps_nothing_a_training_pass_cannot_use(grading):
    """Scales (and the packed projection rows) computed under torch.inference_mode are
    inference tensors: kept, they made the next pass with autograd fail ("Inference tensors
    cannot be saved for backward"). After such a pass, training gives the gradients of a
    twin that never ran under it."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=2, grading=grading,
                            grade_init="warm_start", grade_init_value=0.3)
    model, twin = TransformerLM(cfg), TransformerLM(cfg)
    twin.load_state_dict(model.state_dict())
    x = torch.randint(0, 11, (2, 5))
    with torch.inference_mode():
        model(x)
    for m in (model, twin):
        m(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_a_copy_keeps_no_scales_of_the_original():
    """A deep copy held the original's kept scales with stamps naming the original's storage,
    which the copy does not pin: once the original was freed, other grades loaded into the copy
    at that address passed for the old ones (stale scales). Here the address and version are
    matched on purpose: the copy's first scales must be computed from its own grades."""
    import copy

    g = ExponentialGrading(64, torch.rand(64))
    g.scales()
    c = copy.deepcopy(g)
    other = g.grades  # the original's storage, at the address the kept stamp names
    other.data.copy_(torch.rand(64) * 4)  # other values, the version counter unchanged
    c.load_state_dict({"grades": other, "base": g.base}, assign=True)
    torch.testing.assert_close(c.scales(), 2.0 ** other, rtol=1e-5, atol=0)


def test_grades_batched_by_vmap_through_functional_call_grade_as_a_loop():
    """``torch.func`` wrappers have no data pointer: keeping scales under a transform raised
    "Cannot access data pointer of Tensor that doesn't have storage"."""
    from torch.func import functional_call, vmap

    g = LinearGrading(4, torch.rand(4))  # fixed grades: their scales are kept
    x = torch.randn(3, 4)
    qs = torch.rand(5, 4)
    batched = vmap(lambda q: functional_call(g, {"grades": q}, (x,)))(qs)
    expected = torch.stack([x * (q + 1.0) for q in qs])  # f = shift: f(q) = q + 1
    torch.testing.assert_close(batched, expected)


@pytest.mark.parametrize("make", [
    lambda: LinearGrading(3, [0.0, 1.0, 2.0]),
    lambda: ExponentialGrading(3, [0.0, 1.0, 2.5], base=2.0),
])
def test_scales_changed_in_place_by_the_caller_do_not_change_the_grading(make):
    # the kept tensor was returned to every later call: normalising it for a plot
    # (s /= s.max()) turned the grading's M into M / max M, for the outputs and the inverse
    g = make()
    expected = g.scales().clone()
    x = torch.ones(2, 3)
    s = g.scales()
    s /= s.max()
    torch.testing.assert_close(g.scales(), expected)
    torch.testing.assert_close(g(x), x * expected)
    torch.testing.assert_close(g.inverse_scales(), 1.0 / expected)
    again = g.scales()
    assert g.scales() is again  # kept again once computed afresh


def test_options_set_later_give_new_scales_as_a_grading_built_with_them():
    """``f``, ``floor`` and ``max_log_scale`` set after the first call were plain attributes:
    the kept scales (and packed rows) of the old option were returned again (``f`` set to
    "softplus" left the scales q + 1), and any value was taken. Each is now checked as the
    constructor checks it and the next call computes with it."""
    g = LinearGrading(3, [0.0, 1.0, 2.0])
    assert torch.equal(g.scales(), _linear([0.0, 1.0, 2.0]))
    g.f = "softplus"
    torch.testing.assert_close(g.scales(), torch.log1p(torch.exp(torch.tensor([0.0, 1.0, 2.0]))))
    torch.testing.assert_close(g.scales(), LinearGrading(3, [0.0, 1.0, 2.0], f="softplus").scales())
    with pytest.raises(ValueError, match=r"f='identity' needs q > 0 .* 0\.0 at index 0"):
        g.f = "identity"  # a grade of 0 would get the scale 0
    assert g.f == "softplus"  # the refused value is not kept
    with pytest.raises(ValueError, match=r"f must be one of .* got 'cube'"):
        g.f = "cube"
    for bad in (0, -1.0, math.inf, True, "1e-3"):
        with pytest.raises(ValueError, match=r"floor must be a positive finite number"):
            g.floor = bad
    learn = LinearGrading(2, [-0.5, 1.0], learnable=True)
    learn.floor = 0.75
    torch.testing.assert_close(learn.scales(), torch.tensor([0.75, 2.0]))

    e = ExponentialGrading(3, [0.0, 10.0, 20.0], base=2.0)
    torch.testing.assert_close(e.scales(), _exponential([0.0, 10.0, 20.0], 2.0))
    with pytest.warns(RuntimeWarning, match="clamped to exp"):
        e.max_log_scale = 5.0
        capped = e.scales()
    torch.testing.assert_close(capped, torch.tensor([1.0, math.exp(5.0), math.exp(5.0)]))
    for bad in (0.0, -2.0, math.nan, "5"):
        with pytest.raises(ValueError, match=r"max_log_scale must be a positive finite number"):
            e.max_log_scale = bad
    e.max_log_scale = None
    torch.testing.assert_close(e.scales(), _exponential([0.0, 10.0, 20.0], 2.0))


def test_an_option_set_later_reaches_the_kept_packed_rows_of_graded_attention():
    attn = _attention("linear", (0.0, 1.0, 2.0, 3.0))
    first = attn.packed_projection_rows()
    attn.grading.f = "softplus"  # the grades unchanged: only the option says the rows are old
    rows = attn.packed_projection_rows()
    assert rows is not first
    softplus = torch.log1p(torch.exp(torch.tensor([0.0, 1.0, 2.0, 3.0])))
    torch.testing.assert_close(rows, attn._packed_row_scales(attn._projection_scales_of(
        softplus)))


def test_a_grading_pickled_with_plain_option_attributes_loads_with_them():
    """A grading pickled when ``f``, ``floor`` and ``max_log_scale`` were plain attributes
    holds them under those names; they move to the slots the properties read."""
    import pickle

    for grading, options in ((LinearGrading(2, [0.0, 1.0], f="abs_shift", floor=0.5),
                              {"f": "abs_shift", "floor": 0.5}),
                             (ExponentialGrading(2, [0.0, 1.0], max_log_scale=7.0),
                              {"max_log_scale": 7.0})):
        state = grading.__getstate__()
        for name, value in options.items():
            del state[f"_{name}"]
            state[name] = value  # as the earlier code held it
        loaded = type(grading).__new__(type(grading))
        loaded.__setstate__(state)
        for name, value in options.items():
            assert getattr(loaded, name) == value and name not in loaded.__dict__
        torch.testing.assert_close(loaded.scales(), grading.scales())
        assert pickle.loads(pickle.dumps(grading)).scales().tolist() == grading.scales().tolist()
