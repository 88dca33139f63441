"""FAVOR+ (`performer`): unbiased softmax-kernel estimates, error falling with features, and
the backend's attention equal to the kernel formula with its drawn features."""

import itertools
import math

import pytest
import torch

from graded.attention.backends import draw_random_features, favor_features, get_backend


def pairs(n, d, seed, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * spread
    y = torch.randn(n, d, generator=g, dtype=torch.float64) * spread
    return x, y


def kernel_estimates(x, y, m, draws, orthogonal, seed):
    """(draws, n) estimates φ(x)ᵀφ(y) of exp(xᵀy), one fresh feature matrix per draw."""
    g = torch.Generator().manual_seed(seed)
    est = []
    for _ in range(draws):
        omega = draw_random_features(m, x.shape[1], orthogonal=orthogonal, generator=g,
                                     dtype=torch.float64)
        est.append((favor_features(x, omega) * favor_features(y, omega)).sum(-1))
    return torch.stack(est)


@pytest.mark.parametrize("orthogonal", [True, False])
def test_favor_kernel_estimate_is_unbiased_over_feature_redraws(orthogonal):
    x, y = pairs(6, 8, seed=0)
    exact = torch.exp((x * y).sum(-1))
    est = kernel_estimates(x, y, m=16, draws=3000, orthogonal=orthogonal, seed=1)
    mean, stderr = est.mean(0), est.std(0) / math.sqrt(est.shape[0])
    assert ((mean - exact).abs() < 4 * stderr).all(), (mean, exact, stderr)
    assert (stderr / exact < 0.02).all()  # the test has the power to see a 10 % bias


def test_favor_kernel_error_falls_as_features_grow():
    x, y = pairs(20, 8, seed=2)
    exact = torch.exp((x * y).sum(-1))
    mse = []
    for m in (4, 16, 64, 256):
        est = kernel_estimates(x, y, m=m, draws=60, orthogonal=True, seed=3)
        mse.append((((est - exact) / exact) ** 2).mean().item())
    assert all(a > b for a, b in itertools.pairwise(mse)), mse
    assert mse[0] / mse[-1] > 16, mse  # about 1/m: 64x expected from 4 to 256 features


def test_orthogonal_features_are_orthogonal_within_a_block_with_gaussian_norms():
    omega = draw_random_features(24, 8, generator=torch.Generator().manual_seed(0),
                                 dtype=torch.float64)
    block = omega[:8]
    gram = block @ block.T
    off_diagonal = gram - torch.diag(torch.diag(gram))
    torch.testing.assert_close(off_diagonal, torch.zeros(8, 8, dtype=torch.float64))
    norms = draw_random_features(800, 8, generator=torch.Generator().manual_seed(1),
                                 dtype=torch.float64).norm(dim=1)
    assert abs((norms**2).mean().item() - 8) < 0.6  # E‖ω‖² = d, sd of the mean 0.14


def reference_favor_attention(q, k, v, omega, scale, causal, eps=0.0, pad=None):
    """y_i = Σ_j φ(q_i)·φ(k_j) v_j / (Σ_j φ(q_i)·φ(k_j) + eps), unstabilised, as a (T, T)
    matrix; ``pad`` (B, T) drops keys."""
    root = math.sqrt(scale)
    m = omega.shape[0]

    def phi(x):
        return torch.exp(x @ omega.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(m)

    sim = phi(q * root) @ phi(k * root).transpose(-2, -1)
    if causal:
        sim = sim.tril()
    if pad is not None:
        sim = sim.masked_fill(pad[:, None, None, :], 0.0)
    return (sim @ v) / (sim.sum(-1, keepdim=True) + eps)


def loud_key(backend, head_dim):
    """A key whose feature exponent is the largest any key can have: along the longest ω, at
    the norm that maximises ωᵀx − ‖x‖²/2 (x = key · scale^½)."""
    omega = backend.omega.double()
    w = omega[omega.norm(dim=1).argmax()]
    return w * head_dim**0.25


def test_performer_causal_output_of_a_position_ignores_later_keys_with_the_default_eps():
    """The keys' stabilising shift is their largest exponent over the whole sequence; the
    default eps (1e-6) must still act as in the unshifted formula, or a later key with a large
    exponent shrinks the earlier rows' denominators until eps dominates them."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 12, 16, generator=g, dtype=torch.float64) for _ in range(3))
    backend = get_backend("performer", num_features=16, seed=0, head_dim=16)
    k_loud = k.clone()
    k_loud[:, :, -1] = loud_key(backend, 16)
    out = backend(q, k_loud, v, is_causal=True)
    ref = reference_favor_attention(q, k_loud, v, backend.omega.double(), 16**-0.5, True,
                                    eps=1e-6)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-12)
    prefix = backend(q[:, :, :-1], k[:, :, :-1], v[:, :, :-1], is_causal=True)
    torch.testing.assert_close(out[:, :, :-1], prefix, rtol=1e-9, atol=1e-12)


def test_performer_output_ignores_the_content_of_padded_keys():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 9, 16, generator=g, dtype=torch.float64) for _ in range(3))
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0, -2:] = True
    pad[1, :] = True  # a row with no key at all returns zeros
    backend = get_backend("performer", num_features=16, seed=0, head_dim=16)
    k_loud = k.clone()
    k_loud[:, :, -2:] = loud_key(backend, 16)
    for causal in (False, True):
        out = backend(q, k_loud, v, key_padding_mask=pad, is_causal=causal)
        ref = reference_favor_attention(q, k, v, backend.omega.double(), 16**-0.5, causal,
                                        eps=1e-6, pad=pad)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-12)
        assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_performer_decoding_token_by_token_equals_the_causal_pass_with_the_default_eps():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 10, 16, generator=g, dtype=torch.float64) for _ in range(3))
    backend = get_backend("performer", num_features=16, seed=0, head_dim=16)
    k[:, :, 6] = loud_key(backend, 16)  # the shift grows mid-sequence
    pad = torch.zeros(1, 10, dtype=torch.bool)
    pad[0, 3] = True
    ref = reference_favor_attention(q, k, v, backend.omega.double(), 16**-0.5, True,
                                    eps=1e-6, pad=pad)
    state, outs = None, []
    for t in range(10):
        out, state = backend.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                                    state, key_padding_mask=pad[:, t:t + 1])
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_attention_equals_kernel_formula_with_its_features(causal):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 2, 19, 8, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 2, 19, 5, generator=g, dtype=torch.float64)
    q = q * (torch.rand(8, generator=g, dtype=torch.float64) + 0.2)  # graded before φ
    backend = get_backend("performer", num_features=32, seed=0, head_dim=8, chunk_size=4,
                          eps=1e-12)
    out = backend(q, k, v, is_causal=causal)
    ref = reference_favor_attention(q, k, v, backend.omega.double(), 8**-0.5, causal)
    torch.testing.assert_close(out, ref)


def test_performer_approaches_softmax_attention_with_many_features():
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, 32, 16, generator=g, dtype=torch.float64) * 0.5 for _ in range(2))
    v = torch.randn(1, 2, 32, 4, generator=g, dtype=torch.float64)
    exact = torch.softmax(q @ k.transpose(-2, -1) / 4, dim=-1) @ v
    errors = []
    for m in (8, 512):
        out = get_backend("performer", num_features=m, seed=2)(q, k, v)
        errors.append(((out - exact).norm() / exact.norm()).item())
    assert errors[1] < errors[0] and errors[1] < 0.1, errors


def test_performer_redraws_features_on_its_interval_in_training_only():
    backend = get_backend("performer", num_features=8, redraw_interval=2, seed=0, head_dim=4)
    q = torch.randn(1, 1, 5, 4)
    first = backend.omega.clone()
    backend.eval()
    for _ in range(3):
        backend(q, q, q)
    assert torch.equal(backend.omega, first)
    backend.train()
    backend(q, q, q)
    backend(q, q, q)
    assert torch.equal(backend.omega, first)
    backend(q, q, q)  # third training call: two calls since the draw
    assert not torch.equal(backend.omega, first)
    before = backend.omega.clone()
    backend.redraw_features()
    assert not torch.equal(backend.omega, before)


def test_features_drawn_at_a_first_call_under_inference_mode_serve_training():
    """The features are drawn at the first call; drawn under torch.inference_mode they were an
    inference tensor that every later pass with autograd failed to save. They are the
    features the same seed draws outside it."""
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    backend = get_backend("performer", num_features=8, seed=3)
    twin = get_backend("performer", num_features=8, seed=3)
    with torch.inference_mode():
        backend(q, k, v)
    assert not backend.omega.is_inference()
    q.requires_grad_(True)
    backend(q, k, v, is_causal=True).sum().backward()
    twin(q, k, v)
    torch.testing.assert_close(backend.omega, twin.omega)
    assert torch.isfinite(q.grad).all()


def test_a_state_dict_with_features_drawn_at_the_first_call_loads_into_a_fresh_model():
    """A fresh model has not drawn its features ((0, 0) buffer): loading the state dict of a
    model that ran once failed with a size mismatch; it now gives that model's outputs."""
    from graded import TransformerConfig, TransformerLM

    cfg = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1,
                            attn_backend="performer",
                            attn_backend_options={"num_features": 8})
    model = TransformerLM(cfg).eval()
    x = torch.randint(0, 11, (2, 5))
    expected = model(x)
    fresh = TransformerLM(cfg).eval()
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(fresh(x), expected, rtol=0, atol=0)


@pytest.mark.parametrize("redraw", ["interval", "option", "call"])
def test_a_performer_moved_to_float64_keeps_float64_features_when_it_redraws(redraw):
    """Features redrawn in a backend moved to float64 stay float64 (they came back float32),
    with the values a float32 backend of the same seed draws."""
    options = dict(num_features=8, seed=3, redraw_interval=1)
    ref = get_backend("performer", head_dim=None if redraw == "call" else 4, **options)
    backend = get_backend("performer", head_dim=None if redraw == "call" else 4,
                          **options).double()
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    if redraw == "interval":  # the second training call redraws (redraw_interval=1)
        for b, x in ((ref, q.float()), (backend, q)):
            b.train()
            for _ in range(2):
                b(x, x, x)
    elif redraw == "option":
        ref.num_features = backend.num_features = 6
    else:
        ref(q.float(), q.float(), q.float())
        backend(q, q, q)
    assert backend.omega.dtype == torch.float64
    assert torch.equal(backend.omega, ref.omega.double())
