"""All layers' folded weights in one call per kind: ``graded.folding.FoldedLinears``.

A graded model folds its attention grading into each layer's packed projection rows and its
feed-forward grading into each output layer (000 Defs 5.22, 5.23; ``graded_linear``). In an
eager forward pass the model's hooks fold the weights of all its layers together (the first
layer's alone, then the rest), a few ``torch._foreach_mul`` calls per kind instead of two per
layer. Checked here against the
layer-by-layer fold (``model.batch_grading = False``) and against the products written out:
the same values bit for bit, the same gradients, fewer operators, nothing kept after the
pass. The folds' written-out backward (``_FoldRows``) is checked against finite differences
and autograd's, and the folds under autocast (made in its dtype) against the cast of the
float32 fold.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graded import TransformerConfig, TransformerLM
from graded.folding import FoldedLinears
from graded.transformer import Seq2SeqTransformer


class CountOps(TorchDispatchMode):
    def __init__(self, views: bool = True) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}
        self.views = views

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.views or not func.is_view:
            name = func.overloadpacket.__name__
            self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _maps(biases=(True, False, True)):
    gen = torch.Generator().manual_seed(0)
    maps = []
    for i, has_bias in enumerate(biases):
        w = torch.randn(4 + i, 3, dtype=torch.float64, generator=gen, requires_grad=True)
        b = (torch.randn(4 + i, dtype=torch.float64, generator=gen, requires_grad=True)
             if has_bias else None)
        maps.append((w, b))
    scales = [torch.rand(4 + i, dtype=torch.float64, generator=gen).add(0.5).requires_grad_()
              for i in range(len(biases))]
    return maps, scales


def test_folded_linears_equal_the_products_written_out():
    maps, scales = _maps()
    calls = []
    batch = FoldedLinears(maps, lambda which: calls.append(which) or [scales[j] for j in which])
    got = [batch.fold(i) for i in (1, 0, 2)]
    got = [got[1], got[0], got[2]]
    # the first map asked for alone, the others together at the next ask
    assert calls == [[1], [0, 2]]
    leaves = [t for m in maps for t in m if t is not None] + scales
    expected = [(s[:, None] * w, None if b is None else s * b)
                for (w, b), s in zip(maps, scales)]
    for (w, b), (we, be) in zip(got, expected):
        torch.testing.assert_close(w, we, rtol=0, atol=0)
        assert (b is None) == (be is None)
        if b is not None:
            torch.testing.assert_close(b, be, rtol=0, atol=0)

    def loss(pairs):
        return sum((w.sin().sum() + (0 if b is None else b.cos().sum())) for w, b in pairs)

    for a, e in zip(torch.autograd.grad(loss(got), leaves),
                    torch.autograd.grad(loss(expected), leaves)):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-15)


def _fold_rows_inputs(needs_weights=True, shared=True):
    """Four maps (two without bias), four scales of which (``shared``) two are one tensor."""
    gen = torch.Generator().manual_seed(3)
    rows = (4, 5, 4, 3)
    weights = [torch.randn(r, 3, dtype=torch.float64, generator=gen,
                           requires_grad=needs_weights) for r in rows]
    biases = [torch.randn(rows[i], dtype=torch.float64, generator=gen, requires_grad=True)
              for i in (0, 1, 3)]
    distinct = [torch.rand(r, dtype=torch.float64, generator=gen).add(0.5).requires_grad_()
                for r in (4, 5, 3)] + ([] if shared else [
                    torch.rand(4, dtype=torch.float64, generator=gen).add(0.5).requires_grad_()])
    scale_of = (0, 1, 0 if shared else 3, 2)
    return (0, 1, 3), scale_of, weights, biases, distinct


@pytest.mark.parametrize("shared", [True, False])
def test_the_fold_backward_is_autograds_gradient_twice_over(shared):
    """_FoldRows's hand-written backward (foreach products, one row sum per map, one gradient
    per shared scale) against finite differences, first and second order."""
    from graded.folding import _FoldRows

    with_bias, scale_of, weights, biases, scales = _fold_rows_inputs(shared=shared)

    def fold(*tensors):
        return _FoldRows.apply(with_bias, scale_of, None, *tensors)

    inputs = (*weights, *biases, *scales)
    assert torch.autograd.gradcheck(fold, inputs, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(fold, inputs)


def test_the_fold_backward_skips_what_is_not_asked_for():
    """Frozen weights, fixed scales and outputs the loss does not use: no gradient computed
    for them, the others equal to the products written out."""
    from graded.folding import _FoldRows

    with_bias, scale_of, weights, biases, scales = _fold_rows_inputs(needs_weights=False)
    scales[2].requires_grad_(False)
    out = _FoldRows.apply(with_bias, scale_of, None, *weights, *biases, *scales)
    # the loss uses W'_0, W'_3, b'_1 (map 1's weight unused) and b'_3 only
    loss = out[0].sin().sum() + out[3].square().sum() + out[5].cos().sum() + out[6].sum()
    got = torch.autograd.grad(loss, [*biases, scales[0], scales[1]], allow_unused=True)
    ws = [s[:, None] * w for w, s in zip(weights, [scales[j] for j in scale_of])]
    bs = [scales[scale_of[i]] * b for i, b in zip(with_bias, biases)]
    expected_loss = ws[0].sin().sum() + ws[3].square().sum() + bs[1].cos().sum() + bs[2].sum()
    expected = torch.autograd.grad(expected_loss, [*biases, scales[0], scales[1]],
                                   allow_unused=True)
    assert got[0] is None and expected[0] is None  # b'_0 unused
    for a, e in zip(got[1:], expected[1:]):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_the_folds_are_made_in_its_dtype_as_its_cast_would(dtype):
    """Under autocast ``fold_rows`` returns s·W and s·b in the autocast dtype, rounded once:
    bit for bit the cast that ``F.linear`` would make of the float32 products, and the
    gradients (arriving in that dtype) bit for bit those through the cast, except the
    scales', where the bias term is added in one multiply-add."""
    from graded.folding import fold_rows

    gen = torch.Generator().manual_seed(5)
    maps = [(torch.randn(6, 4, generator=gen, requires_grad=True),
             torch.randn(6, generator=gen, requires_grad=True)),
            (torch.randn(5, 4, generator=gen, requires_grad=True), None)]
    scales = [torch.rand(6, generator=gen).add(0.5).requires_grad_(),
              torch.rand(5, generator=gen).add(0.5).requires_grad_()]
    leaves = [maps[0][0], maps[0][1], maps[1][0], *scales]
    upstream = [torch.randn(6, 4, generator=gen).to(dtype), torch.randn(6, generator=gen).to(dtype),
                torch.randn(5, 4, generator=gen).to(dtype)]
    with torch.autocast("cpu", dtype=dtype):
        (w0, b0), (w1, b1) = fold_rows(maps, scales)
    assert (w0.dtype, b0.dtype, w1.dtype, b1) == (dtype, dtype, dtype, None)
    expected = [(scales[0][:, None] * maps[0][0]).to(dtype), (scales[0] * maps[0][1]).to(dtype),
                (scales[1][:, None] * maps[1][0]).to(dtype)]
    for got, want in zip((w0, b0, w1), expected):
        assert torch.equal(got, want)
    got = torch.autograd.grad((w0, b0, w1), leaves, upstream)
    want = torch.autograd.grad(expected, leaves, upstream)
    for i, (a, e) in enumerate(zip(got, want)):
        assert a.dtype == torch.float32
        if i < 3:  # weights and bias: the same products
            assert torch.equal(a, e), i
        else:
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("learnable", [True, False])
def test_an_autocast_step_folds_in_its_dtype_with_the_same_results(learnable, monkeypatch):
    """A graded LM's forward and backward under bfloat16 autocast: with the folds made in
    bfloat16 (default) the logits equal those of the float32 folds cast by ``F.linear``
    (``FoldedLinears.previous_form = True``) bit for bit, the gradients up to the
    order of a sum, and each folded weight and bias is one cast (``_to_copy``) fewer."""
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(
        vocab_size=17, d_model=16, n_heads=2, n_layers=3, max_len=32, d_ff=32,
        positional="learned", grading="linear", learnable_grades=learnable,
        grade_init="warm_start", grade_init_value=0.2))

    def step():
        model.zero_grad()
        with CountOps() as count:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(IDS)
            logits.float().square().mean().backward()
        return logits, {n: p.grad.clone() for n, p in model.named_parameters()
                        if p.grad is not None}, count.ops

    step()
    logits, grads, ops = step()
    monkeypatch.setattr(FoldedLinears, "previous_form", True)
    logits_c, grads_c, ops_c = step()
    assert torch.equal(logits, logits_c)
    assert grads.keys() == grads_c.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_c[name], rtol=1e-5, atol=1e-6, msg=name)
    # 3 packed projections and 3 FFN output layers, weight and bias: 12 casts forward, and
    # their 12 backward casts of the gradients
    assert ops_c["_to_copy"] - ops["_to_copy"] == 2 * 12


class OpOrder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        # a foreach operator once per tensor of its list (one kernel each here)
        self.names += [name] * (len(args[0]) if name.startswith("_foreach_") else 1)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("learnable", [True, False])
def test_the_first_layers_product_comes_before_the_other_layers_folds(learnable):
    """Before the first matrix product of a forward pass only the first layer's projection
    is folded (its weight and bias): the device can start on it while the host issues the
    other layers' scales and folds."""
    model = lm("linear", learnable, n_layers=4, positional="learned")
    with OpOrder() as order:
        model(IDS)
    first = next(i for i, n in enumerate(order.names) if n in ("addmm", "mm", "bmm", "linear"))
    assert order.names[:first].count("_foreach_mul") == 2  # one weight, one bias
    assert order.names.count("_foreach_mul") == 2 * 2 * 4  # both kinds, 4 layers


def test_the_autocast_dtype_is_read_per_device_type():
    """What the folds and the scales' memo ask: the autocast dtype on a device type, None
    where autocast is off or the device type has none (meta)."""
    from graded.folding import _autocast_on

    assert _autocast_on("cpu") is None and _autocast_on("meta") is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _autocast_on("cpu") == torch.bfloat16 and _autocast_on("meta") is None


def test_a_map_asked_for_twice_is_folded_again():
    maps, scales = _maps()
    batch = FoldedLinears(maps, lambda which: [scales[j] for j in which])
    first = batch.fold(1)
    again = batch.fold(1)
    assert again[0] is not first[0]
    torch.testing.assert_close(again[0], first[0], rtol=0, atol=0)


def lm(grading: str, learnable: bool, n_layers: int = 3, **extra) -> TransformerLM:
    cfg = TransformerConfig(vocab_size=17, d_model=16, n_heads=2, n_layers=n_layers, max_len=32,
                            d_ff=32, grading=grading, learnable_grades=learnable,
                            grade_init="warm_start", grade_init_value=0.2, **extra)
    torch.manual_seed(0)
    return TransformerLM(cfg).double()


IDS = torch.randint(0, 17, (2, 20), generator=torch.Generator().manual_seed(1))  # 40 rows


def run(model, batch: bool, *inputs):
    """Logits, gradients (by name) and operator counts of one pass of ``model`` on
    ``inputs`` (default: IDS), with or without batched grading."""
    model.zero_grad()
    model.batch_grading = batch
    with CountOps() as count:
        logits = model(*(inputs or (IDS,)))
    logits.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits, grads, count.ops


def held(model) -> list[str]:
    return [n for n, m in model.named_modules() if "_held_fold" in m.__dict__]


@pytest.mark.parametrize("grading", ["linear", "exponential"])
@pytest.mark.parametrize("learnable", [True, False])
def test_a_model_folding_its_layers_together_gives_the_same_logits_and_gradients(
        grading, learnable):
    model = lm(grading, learnable)
    run(model, False)  # fixed grades keep their scales from the first pass on
    lb, gb, ops_b = run(model, True)
    assert held(model) == []  # nothing kept after the pass
    lu, gu, ops_u = run(model, False)
    torch.testing.assert_close(lb, lu, rtol=0, atol=0)
    assert gb.keys() == gu.keys()
    for name in gb:
        torch.testing.assert_close(gb[name], gu[name], rtol=0, atol=1e-14, msg=name)
    # layer by layer, each layer folds its packed projection and its FFN's output layer
    # with autograd's products (graded_linear, no autocast): weight and bias, four per layer;
    # together, the first map (the first layer's projection) alone and all the others in one
    # call of the foreach products: four, and no plain product
    assert ops_u.get("_foreach_mul", 0) == 0 and ops_b["_foreach_mul"] == 4
    if grading == "linear" or not learnable:  # (learnable exponential scales take products)
        assert ops_u["mul"] - ops_b["mul"] == 4 * 3


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_the_folds_backward_takes_a_few_operators_per_layer(grading):
    """The backward of the batched folds: foreach products and one row sum per map for the
    learnable scales, against ~5 operators per map in autograd's own backward of
    ``_foreach_mul`` (kept under torch.func, see the next test). Counted on the whole
    backward pass, against the ungraded model's: at most two more operators per layer and a
    constant number."""
    def backward_ops(model):  # views launch nothing
        logits = model(IDS)
        with CountOps(views=False) as count:
            logits.square().mean().backward()
        return sum(count.ops.values())

    extra = {}
    for layers in (3, 5):  # the layers after the first fold together
        cfg = dict(vocab_size=17, d_model=16, n_heads=2, n_layers=layers, max_len=32, d_ff=32,
                   positional="learned")
        torch.manual_seed(0)
        ungraded = TransformerLM(TransformerConfig(**cfg)).double()
        torch.manual_seed(0)
        graded = TransformerLM(TransformerConfig(
            **cfg, grading=grading, learnable_grades=True, grade_init="warm_start",
            grade_init_value=0.2)).double()
        extra[layers] = backward_ops(graded) - backward_ops(ungraded)
    assert extra[5] - extra[3] <= 2 * 2, extra


@pytest.mark.parametrize("grading", ["linear", "exponential"])
@pytest.mark.parametrize("learnable", [True, False])
def test_the_previous_folds_give_the_same_gradients(grading, learnable, monkeypatch):
    """``FoldedLinears.previous_form = True`` (for comparisons) folds all maps at once and
    takes autograd's backward of the foreach products: the same logits and gradients, and
    per layer more operators in the backward pass."""
    saved = {}
    for layers in (3, 5):
        model = lm(grading, learnable, n_layers=layers)
        run(model, True)
        logits, now, ops_now = run_backward(model)
        monkeypatch.setattr(FoldedLinears, "previous_form", True)
        logits_p, previous, ops_previous = run_backward(model)
        monkeypatch.setattr(FoldedLinears, "previous_form", False)
        torch.testing.assert_close(logits, logits_p, rtol=0, atol=0)
        for name in now:
            torch.testing.assert_close(now[name], previous[name], rtol=0, atol=1e-14,
                                       msg=name)
        saved[layers] = ops_previous - ops_now
    assert saved[5] - saved[3] >= (5 if learnable else 2) * 2, saved  # per layer, 2 layers


def run_backward(model):
    """Logits, gradients and the number of operators (views excepted) of the backward pass."""
    model.zero_grad()
    logits = model(IDS)
    with CountOps(views=False) as count:
        logits.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits, grads, sum(count.ops.values())


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("tied", [False, True])
def test_per_sample_gradients_through_torch_func_equal_a_loop(tied):
    """Under torch.func transforms the folds take the plain foreach products (the hand-written
    backward is not a functorch rule): vmap(grad) over a graded LM equals one backward per
    sample, called as docs/models.md says: ``tie_weights=False`` (torch 2.13's default leaves
    a module registered under several names, as the shared feature grading is, holding the
    tensor passed in), and tied embeddings given under both names, whose gradients add up."""
    from torch.func import functional_call, grad, vmap

    from graded.checks import checked_inputs

    model = lm("linear", True, tie_embeddings=tied)
    params = {k: v.detach() for k, v in model.named_parameters()}
    if tied:
        params["head.proj.weight"] = params["decoder.embed.tokens.weight"]

    def loss(p, ids):
        logits = functional_call(model, p, (ids[None, :-1],), tie_weights=False)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 17), ids[None, 1:].reshape(-1))

    with checked_inputs():
        per_sample = vmap(grad(loss), in_dims=(None, 0))(params, IDS)
    if tied:
        per_sample["decoder.embed.tokens.weight"] += per_sample.pop("head.proj.weight")
    for row in range(IDS.shape[0]):
        model.zero_grad()
        loss(dict(model.named_parameters()), IDS[row]).backward()
        for name, p in model.named_parameters():
            assert type(p) is torch.nn.Parameter, name  # every parameter is back in place
            expected = torch.zeros_like(p) if p.grad is None else p.grad
            torch.testing.assert_close(per_sample[name][row], expected, rtol=1e-10,
                                       atol=1e-12, msg=name)


@pytest.mark.parametrize("options", [
    dict(grade_attention_variant="scores"), dict(grade_attention_variant="values"),
    dict(grade_attention_variant="queries_keys", grades_per_head=True),
    dict(grade_attention_variant="multi_head"),
    dict(grade_attention_variant="values", positional="rope"),
    dict(grading="exponential", grade_attention_variant="multi_head"),
    dict(grading="exponential", positional="rope")])
def test_every_attention_variant_folds_its_rows_together_exactly(options):
    """Which of q, k, v are folded (rotary positions keep q and k out: with the default
    queries_keys variant no attention layer folds) and per-head grades change the packed
    rows that the layers build together."""
    options = {"grading": "linear", **options}
    model = lm(options.pop("grading"), True, **options)
    lb, gb, ops_b = run(model, True)
    lu, gu, ops_u = run(model, False)
    torch.testing.assert_close(lb, lu, rtol=0, atol=0)
    for name in gb:
        torch.testing.assert_close(gb[name], gu[name], rtol=0, atol=1e-14, msg=name)
    attention_folds = any(m.packs_folded_rows() for m in model.grading_plan.self_attention)
    assert attention_folds == (options.get("positional") != "rope"
                               or options.get("grade_attention_variant") == "values")
    assert ops_b["_foreach_mul"] == 4  # weights and biases: the first map alone, then the rest
    if attention_folds:
        assert ops_b.get("cat", 0) < ops_u["cat"]  # the rows of all layers in one cat


def test_short_inputs_scale_the_activations_and_fold_nothing():
    """A decoding step (fewer rows than d_model) grades the activations, as layer by layer."""
    model = lm("linear", True).eval()
    ids = IDS[:1, :4]
    with torch.no_grad(), CountOps() as count:
        out = model(ids)
    assert "_foreach_mul" not in count.ops
    model.batch_grading = False
    with torch.no_grad():
        torch.testing.assert_close(out, model(ids), rtol=0, atol=0)


def test_generation_with_a_cache_is_unchanged():
    model = lm("exponential", True).eval()
    prompt = IDS[:, :18]
    out_b = model.generate(prompt, max_new_tokens=5, do_sample=False)
    model.batch_grading = False
    out_u = model.generate(prompt, max_new_tokens=5, do_sample=False)
    assert torch.equal(out_b, out_u)


def test_nothing_is_held_after_a_pass_that_fails():
    model = lm("linear", True)
    with pytest.raises(ValueError, match="token ids must lie"):
        model(IDS + 17)
    assert held(model) == []

    def fail(*_):
        raise RuntimeError("in the middle of the pass")

    hook = model.decoder.stack.blocks[1].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="middle"):
        model(IDS)
    hook.remove()
    assert held(model) == []


def test_a_seq2seq_model_folds_encoder_and_decoder_layers():
    cfg = TransformerConfig(vocab_size=17, d_model=16, n_heads=2, n_layers=2, max_len=32,
                            d_ff=32, grading="linear", learnable_grades=True,
                            grade_init="warm_start", grade_init_value=0.2)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg).double()
    lb, gb, ops_b = run(model, True, IDS, IDS[:, :18])
    lu, gu, ops_u = run(model, False, IDS, IDS[:, :18])
    torch.testing.assert_close(lb, lu, rtol=0, atol=0)
    for name in gb:
        torch.testing.assert_close(gb[name], gu[name], rtol=0, atol=1e-14, msg=name)
    # the 4 self-attention and 4 feed-forward layers of both stacks in 4 foreach products
    # (weights and biases: the first map alone, then the rest) against 16 of autograd's
    # products; each of the 2 cross-attention layers folds its query rows alone (weight, bias)
    assert ops_b["_foreach_mul"] == 4 and ops_u.get("_foreach_mul", 0) == 0
    assert ops_u["mul"] - ops_b["mul"] == 16


def test_folds_of_maps_of_one_shape_share_one_allocation():
    """Under autocast the folds of maps of one shape are the slices of one bf16 tensor (one
    allocation), each equal to the cast of its float32 fold; a map of another shape gets its
    own."""
    from graded.folding import fold_rows

    gen = torch.Generator().manual_seed(0)
    maps = [(torch.randn(6, 4, generator=gen, requires_grad=True),
             torch.randn(6, generator=gen, requires_grad=True)) for _ in range(3)]
    maps.append((torch.randn(5, 4, generator=gen, requires_grad=True), None))
    scales = [torch.rand(w.shape[0], generator=gen) + 0.5 for w, _ in maps]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        folds = fold_rows(maps, scales)
    bases = {id(w._base) for w, _ in folds[:3]}
    assert len(bases) == 1 and folds[0][0]._base is not None
    assert folds[3][0]._base is None
    for (w, b), (fw, fb), s in zip(maps, folds, scales, strict=True):
        assert fw.dtype == torch.bfloat16
        torch.testing.assert_close(fw, (s[:, None] * w).to(torch.bfloat16), rtol=0, atol=0)
        if b is not None:
            torch.testing.assert_close(fb, (s * b).to(torch.bfloat16), rtol=0, atol=0)
    loss = sum((fw.float() ** 2).sum() for fw, _ in folds)
    loss.backward()
    for (w, _), s in zip(maps, scales, strict=True):
        expected = 2 * (s[:, None] * w).to(torch.bfloat16).float() * s[:, None]
        torch.testing.assert_close(w.grad, expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_an_lm_pass_folds_with_the_stacked_head_scales(grading):
    """A learnable model's pass computes its heads' scales stacked and builds all packed rows
    from that tensor: one concatenation for all layers instead of one per layer, no stack of
    the heads' views, and no view of a head's row (none is asked for). Counted against the
    layer-by-layer pass, whose other operators are the same."""
    model = lm(grading, True)
    model(IDS)  # what is kept (EGT's ln λ) is made
    counts = {}
    for batch in (True, False):
        model.batch_grading = batch
        with CountOps() as count:
            model(IDS)
        counts[batch] = count.ops
    together, apart = counts[True], counts[False]
    assert together["cat"] == 1 and apart["cat"] == 3
    # the grades stacked (and EGT's ln λ): nothing else
    assert together["stack"] == apart["stack"] + (2 if grading == "exponential" else 1)
    assert together.get("select", 0) == apart.get("select", 0)
    # the rows of the packed projections (the heads' q, k, v are unbound in both passes)
    assert together.get("unbind", 0) == apart.get("unbind", 0) + 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_mode_under_autocast_gives_the_tangent_in_the_folds_dtype(dtype):
    """The folds' tangent ṡ·W + s·Ẇ (and ṡ·b + s·ḃ) under autocast: float32 products rounded
    once to the autocast dtype, as the folds themselves are."""
    import torch.autograd.forward_ad as fwAD

    from graded.folding import fold_rows

    gen = torch.Generator().manual_seed(7)
    w, dw = torch.randn(2, 6, 4, generator=gen).unbind(0)
    b, s, db, ds = torch.randn(4, 6, generator=gen).unbind(0)
    with fwAD.dual_level(), torch.autocast("cpu", dtype=dtype):
        (fw, fb), = fold_rows([(fwAD.make_dual(w, dw), fwAD.make_dual(b, db))],
                              [fwAD.make_dual(s, ds)])
        tw, tb = fwAD.unpack_dual(fw).tangent, fwAD.unpack_dual(fb).tangent
    assert (tw.dtype, tb.dtype) == (dtype, dtype)
    assert torch.equal(tw, (ds[:, None] * w + s[:, None] * dw).to(dtype))
    assert torch.equal(tb, (ds * b + s * db).to(dtype))


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_forward_mode_through_a_folding_model_equals_the_activation_grading(grading):
    """A directional derivative of a learnable-grade LM's logits (forward-mode AD, every
    parameter given a tangent t) with its gradings folded into the weights equals the one with
    the gradings on the activations, as the formulas are written, and reverse mode's
    ⟨∇(v·logits), t⟩ for a random v. (``tie_weights=False`` and the tied head named too:
    docs/models.md, "torch.func and the shared grading".)"""
    import torch.autograd.forward_ad as fwAD
    from torch.func import functional_call

    from graded.folding import activation_grading

    model = lm(grading, learnable=True, attn_backend="explicit")  # (SDPA has no forward AD)
    gen = torch.Generator().manual_seed(11)
    params = dict(model.named_parameters())
    tangents = {n: torch.randn(p.shape, dtype=p.dtype, generator=gen) for n, p in params.items()}

    def derivative() -> torch.Tensor:
        with fwAD.dual_level():
            duals = {n: fwAD.make_dual(p.detach(), tangents[n]) for n, p in params.items()}
            duals["head.proj.weight"] = duals["decoder.embed.tokens.weight"]  # tied
            out = functional_call(model, duals, (IDS,), tie_weights=False)
            return fwAD.unpack_dual(out).tangent

    folded = derivative()
    with activation_grading(model):
        on_activations = derivative()
    torch.testing.assert_close(folded, on_activations, rtol=0, atol=1e-12)

    def logits(p: dict) -> torch.Tensor:
        return functional_call(model, {**p, "head.proj.weight": p["decoder.embed.tokens.weight"]},
                               (IDS,), tie_weights=False)

    _, through_func = torch.func.jvp(logits, ({n: p.detach() for n, p in params.items()},),
                                     (tangents,))
    torch.testing.assert_close(folded, through_func, rtol=0, atol=1e-12)
    v = torch.randn(folded.shape, dtype=folded.dtype, generator=gen)
    grads = torch.autograd.grad((model(IDS) * v).sum(), list(params.values()), allow_unused=True)
    reverse = sum((g * tangents[n]).sum() for n, g in zip(params, grads) if g is not None)
    torch.testing.assert_close((folded * v).sum(), reverse, rtol=1e-12, atol=1e-12)
