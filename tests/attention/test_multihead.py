"""graded.MultiheadAttention against torch.nn.MultiheadAttention with copied parameters."""

import pytest
import torch
from torch import nn

import graded
from graded.attention import MultiheadAttention

E, H = 16, 4


def pair(seed=0, **kwargs):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(E, H, **kwargs)
    ours = MultiheadAttention(E, H, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def run_both(ref, ours, args, kwargs):
    """Outputs, weights and input/parameter gradients of both modules on cloned inputs."""
    results = []
    for module in (ref, ours):
        inputs = [a.detach().clone().requires_grad_(True) for a in args]
        if args[0] is args[1] is args[2]:
            inputs = [inputs[0]] * 3
        module.zero_grad()
        out, w = module(*inputs, **kwargs)
        loss = out.square().sum() + (w.square().sum() if w is not None else 0.0)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters()}
        results.append((out, w, [i.grad for i in inputs], grads))
    return results


def assert_same(a, b, atol=1e-6):
    (out_a, w_a, gin_a, gp_a), (out_b, w_b, gin_b, gp_b) = a, b
    torch.testing.assert_close(out_b, out_a, atol=atol, rtol=1e-5)
    if w_a is None:
        assert w_b is None
    else:
        torch.testing.assert_close(w_b, w_a, atol=atol, rtol=1e-5)
    for ga, gb in zip(gin_a, gin_b):
        torch.testing.assert_close(gb, ga, atol=1e-5, rtol=1e-4)
    assert gp_a.keys() == gp_b.keys()
    for name in gp_a:
        torch.testing.assert_close(gp_b[name], gp_a[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("average", [True, False])
def test_self_attention_equals_torch(batch_first, need_weights, average):
    ref, ours = pair(batch_first=batch_first)
    x = torch.randn(3, 5, E) if batch_first else torch.randn(5, 3, E)
    kwargs = dict(need_weights=need_weights, average_attn_weights=average)
    assert_same(*run_both(ref, ours, (x, x, x), kwargs))


@pytest.mark.parametrize("kdim", [None, 12])
def test_cross_attention_equals_torch(kdim):
    ref, ours = pair(batch_first=True, kdim=kdim, vdim=kdim)
    q = torch.randn(2, 4, E)
    kv = torch.randn(2, 7, kdim or E)
    assert_same(*run_both(ref, ours, (q, kv, kv), {}))


def test_key_padding_mask_bool_and_float_equal_torch():
    ref, ours = pair(batch_first=True)
    x = torch.randn(3, 6, E)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[0, 4:] = True
    kpm[2, 1] = True
    assert_same(*run_both(ref, ours, (x, x, x), dict(key_padding_mask=kpm)))
    float_kpm = torch.zeros(3, 6).masked_fill(kpm, float("-inf"))
    assert_same(*run_both(ref, ours, (x, x, x), dict(key_padding_mask=float_kpm)))


def test_bool_float_and_per_head_attn_masks_equal_torch():
    ref, ours = pair(batch_first=True)
    x = torch.randn(2, 5, E)
    bool_mask = torch.rand(5, 5) > 0.6
    bool_mask.fill_diagonal_(False)  # every query keeps one key
    assert_same(*run_both(ref, ours, (x, x, x), dict(attn_mask=bool_mask)))
    float_mask = torch.randn(5, 5)
    assert_same(*run_both(ref, ours, (x, x, x), dict(attn_mask=float_mask)))
    per_head = torch.randn(2 * H, 5, 5)
    assert_same(*run_both(ref, ours, (x, x, x), dict(attn_mask=per_head)))


@pytest.mark.parametrize("need_weights", [True, False])
def test_causal_equals_torch(need_weights):
    ref, ours = pair(batch_first=True)
    x = torch.randn(2, 6, E)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    kwargs = dict(attn_mask=mask, is_causal=True, need_weights=need_weights)
    assert_same(*run_both(ref, ours, (x, x, x), kwargs))


def test_causal_with_padding_equals_torch():
    ref, ours = pair(batch_first=True)
    x = torch.randn(2, 6, E)
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 5] = True
    assert_same(*run_both(ref, ours, (x, x, x), dict(attn_mask=mask, key_padding_mask=kpm)))


def test_causal_flag_alone_builds_the_mask():
    ref, ours = pair(batch_first=True)
    x = torch.randn(2, 6, E)
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    expected, _ = ref(x, x, x, attn_mask=mask, need_weights=False)
    got, _ = ours(x, x, x, is_causal=True, need_weights=False)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("options", [dict(add_bias_kv=True), dict(add_zero_attn=True),
                                     dict(bias=False), dict(add_bias_kv=True, add_zero_attn=True)])
def test_optional_parameters_equal_torch(options):
    ref, ours = pair(batch_first=True, **options)
    x = torch.randn(2, 5, E)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[0, 3:] = True
    assert_same(*run_both(ref, ours, (x, x, x), dict(key_padding_mask=kpm)))


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("options", [dict(add_bias_kv=True), dict(add_zero_attn=True),
                                     dict(add_bias_kv=True, add_zero_attn=True)])
def test_causal_flag_with_appended_keys_sees_no_future_token(options, need_weights):
    """is_causal=True with add_bias_kv / add_zero_attn: causal over the real keys, the
    appended keys visible to every query, as torch's padded causal mask gives (torch's
    weights path); a causal mask on the extended length would let query i see key i + 1."""
    ref, ours = pair(batch_first=True, **options)
    x = torch.randn(2, 5, E)
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    expected, w_expected = ref(x, x, x, attn_mask=mask, need_weights=True)
    got, w_got = ours(x, x, x, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(w_got, w_expected, atol=1e-6, rtol=1e-5)
    changed = x.clone()
    changed[:, 3:] += 10.0  # the future of positions 0..2
    later, _ = ours(changed, changed, changed, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(later[:, :3], got[:, :3], atol=1e-6, rtol=1e-5)


def test_unbatched_input_equals_torch():
    ref, ours = pair()
    x = torch.randn(5, E)
    assert_same(*run_both(ref, ours, (x, x, x), {}))


def test_state_dict_round_trips_both_ways():
    ref, ours = pair(batch_first=True)
    back = nn.MultiheadAttention(E, H, batch_first=True)
    back.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, E)
    torch.testing.assert_close(back(x, x, x)[0], ref(x, x, x)[0])
    assert graded.MultiheadAttention is MultiheadAttention


def test_dropout_is_active_in_training_and_off_in_eval():
    torch.manual_seed(0)
    m = MultiheadAttention(E, H, dropout=0.5, batch_first=True)
    x = torch.randn(2, 8, E)
    m.train()
    a, _ = m(x, x, x, need_weights=False)
    b, _ = m(x, x, x, need_weights=False)
    assert not torch.allclose(a, b)
    m.eval()
    c, _ = m(x, x, x, need_weights=False)
    d, _ = m(x, x, x, need_weights=True)
    torch.testing.assert_close(c, d, atol=1e-6, rtol=1e-5)


def test_explicit_backend_refuses_oversized_matrix_naming_memory():
    m = MultiheadAttention(E, H, batch_first=True, backend="explicit", max_explicit_elements=100)
    x = torch.randn(1, 8, E)
    with pytest.raises(MemoryError, match=r"256 elements.*GiB"):
        m(x, x, x)


class TestBadInput:
    def test_embed_dim_not_divisible_by_heads(self):
        with pytest.raises(ValueError, match=r"embed_dim \(10\).*num_heads \(4\)"):
            MultiheadAttention(10, 4)

    def test_wrong_feature_size(self):
        m = MultiheadAttention(E, H, batch_first=True)
        x = torch.randn(2, 5, E + 1)
        with pytest.raises(ValueError, match=r"query has feature size 17.*expected 16"):
            m(x, x, x)

    def test_wrong_rank(self):
        m = MultiheadAttention(E, H)
        x = torch.randn(2, 3, 5, E)
        with pytest.raises(ValueError, match=r"got shape \(2, 3, 5, 16\)"):
            m(x, x, x)

    def test_mask_of_wrong_shape(self):
        m = MultiheadAttention(E, H, batch_first=True)
        x = torch.randn(2, 5, E)
        with pytest.raises(ValueError, match=r"attn_mask has shape \(4, 5\).*\(5, 5\)"):
            m(x, x, x, attn_mask=torch.zeros(4, 5, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 4\)"):
            m(x, x, x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))

    def test_mask_of_wrong_dtype(self):
        m = MultiheadAttention(E, H, batch_first=True)
        x = torch.randn(2, 5, E)
        with pytest.raises(TypeError, match=r"attn_mask must be a bool or floating.*int64"):
            m(x, x, x, attn_mask=torch.zeros(5, 5, dtype=torch.long))

    def test_batch_mismatch(self):
        m = MultiheadAttention(E, H, batch_first=True)
        with pytest.raises(ValueError, match="batch sizes differ"):
            m(torch.randn(2, 5, E), torch.randn(3, 5, E), torch.randn(3, 5, E))

    def test_unknown_score(self):
        with pytest.raises(ValueError, match=r"unknown attention score 'cosine'"):
            MultiheadAttention(E, H, score="cosine")

    @pytest.mark.parametrize("name", ["kdim", "vdim"])
    @pytest.mark.parametrize("value", [0, -1, 2.5])
    def test_key_or_value_size_that_is_not_a_positive_int(self, name, value):
        with pytest.raises(ValueError, match=rf"{name} must be None .* positive int, got "
                                             rf"{value!r}"):
            MultiheadAttention(E, H, **{name: value})

    def test_unbatched_query_with_a_batched_padding_mask_names_the_shape_given(self):
        m = MultiheadAttention(E, H)
        x = torch.randn(5, E)
        with pytest.raises(ValueError, match=r"key_padding_mask has shape \(1, 5\); expected "
                                             r"\(source length,\) = \(5,\)"):
            m(x, x, x, key_padding_mask=torch.zeros(1, 5, dtype=torch.bool))


@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_fully_masked_query_gets_zeros_and_finite_gradients_on_the_explicit_path(score):
    """A query with no admissible key gets zeros on the explicit path (weights, or a score
    without a fused form) as the chunked backend's own online softmax gives it, with the same
    gradients: zero from that row, not the NaN that the softmax of an all -inf row sent to
    every input and parameter."""
    torch.manual_seed(0)
    ours = MultiheadAttention(E, H, batch_first=True, score=score, dtype=torch.float64)
    ref = MultiheadAttention(E, H, batch_first=True, score=score, dtype=torch.float64,
                             backend="chunked", backend_options={"query_chunk": 2,
                                                                 "key_chunk": 2})
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 4, E, dtype=torch.float64)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[1] = True  # query 1 sees no key
    kpm = torch.zeros(2, 4, dtype=torch.bool)
    kpm[1] = True  # nor does any query of the second sequence
    results = []
    for module, need_weights in ((ours, True), (ref, False)):
        xx = x.clone().requires_grad_(True)
        out, _ = module(xx, xx, xx, attn_mask=mask, key_padding_mask=kpm,
                        need_weights=need_weights)
        out.square().sum().backward()
        results.append((out, xx.grad, [p.grad for p in module.parameters()]))
    (out, grad_x, grad_p), (out_ref, grad_x_ref, grad_p_ref) = results
    bias = ours.out_proj.bias.expand(4, E)  # zero heads: the output projection's bias
    torch.testing.assert_close(out[1], bias)
    torch.testing.assert_close(out[0, 1], bias[0])
    torch.testing.assert_close(out, out_ref)
    assert torch.isfinite(grad_x).all()
    torch.testing.assert_close(grad_x, grad_x_ref)
    for a, b in zip(grad_p, grad_p_ref, strict=True):
        torch.testing.assert_close(a, b)


class _Operators(torch.utils._python_dispatch.TorchDispatchMode):
    """The operators dispatched inside the block, by name, with their counts."""

    def __init__(self) -> None:
        super().__init__()
        self.count: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.count[name] = self.count.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("shared_qk", [False, True])
def test_the_packed_projections_gradients_are_written_in_one_operator(shared_qk):
    """The backward of the packed q, k, v (or q, v with shared_qk) writes their gradients into
    the packed gradient in one ``stack``, not a zero-filled packed tensor per block and their
    sums (``select_backward``, five passes more over (B, T, 3E)); the gradients are torch's."""
    torch.manual_seed(0)
    kw = {"backend": "lsh", "backend_options": {"shared_qk": True}} if shared_qk else {}
    mine = MultiheadAttention(E, H, batch_first=True, **kw).double()
    x = torch.randn(2, 8, E, dtype=torch.float64, requires_grad=True)
    out, _ = mine(x, x, x, need_weights=False)
    with _Operators() as ops:
        out.square().sum().backward()
    assert "select_backward" not in ops.count and ops.count["stack"] == 1
    if shared_qk:
        return
    ref = nn.MultiheadAttention(E, H, batch_first=True).double()
    ref.load_state_dict(mine.state_dict())
    x_ref = x.detach().clone().requires_grad_()
    ref(x_ref, x_ref, x_ref, need_weights=False)[0].square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(mine.in_proj_weight.grad, ref.in_proj_weight.grad)
