"""Efficient attention backends (002 §4.3.2, §7.2; seed_002 Appendix B) against position-by-position
loops in float64: the cases ``test_backend_*.py`` leave out.

- BigBird (B.6) with a window wider than 3 blocks and several global blocks;
- 003 §2 Exercise 2 on every exact backend: with QKᵀ = 0 each query's weights are uniform over
  the keys its pattern admits, so its output is their centroid.
"""

import pytest
import torch

from graded.attention.backends import get_backend

T, D, DV = 41, 8, 5


def qkv_pad(seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, T, D, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, T, D, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, T, DV, generator=g, dtype=torch.float64)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, T - 6:] = True
    return q, k, v, pad


def loop_attention(q, k, v, pad, admits, causal):
    """o_i = Σ_j α_ij v_j with α_ij = softmax over the admitted, unpadded keys j ≤ i (causal) of
    q_i·k_j/√d (002 Eqs 2.25-2.27), one query at a time; a query with no key gets zeros."""
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                keys = [j for j in range(k.shape[2])
                        if admits(i, j) and not pad[b, j] and (j <= i or not causal)]
                if not keys:
                    continue
                s = torch.stack([q[b, h, i] @ k[b, h, j] for j in keys]) / D**0.5
                w = torch.softmax(s, dim=0)
                out[b, h, i] = sum(w[n] * v[b, h, j] for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_bigbird_with_a_five_block_window_and_two_global_blocks_is_its_pattern_b6(causal):
    """seed_002 B.6 (Zaheer et al. 2020 §2, ITC): query block I sees key block J when
    |I − J| ≤ w//2 (window of w = 5 blocks), I or J is one of the g = 2 global blocks, or J is one
    of I's r random blocks; when causal the random blocks are drawn among past blocks outside the
    window and the globals."""
    block, g, w, r = 4, 2, 5, 2
    backend = get_backend("bigbird", block_size=block, num_global_blocks=g, window_blocks=w,
                          num_random_blocks=r, seed=7)
    n = -(-T // block)
    rand = backend.random_blocks(n, causal).tolist()
    for i, row in enumerate(rand):
        picked = [j for j in row if j >= 0]
        if i < g:
            assert picked == []
            continue
        assert all(j >= g and abs(j - i) > w // 2 for j in picked)
        if causal:
            assert all(j < i for j in picked)
    assert any(j >= 0 for row in rand for j in row)

    def admits(i, j):
        bi, bj = i // block, j // block
        return bi < g or bj < g or abs(bi - bj) <= w // 2 or bj in rand[bi]

    q, k, v, pad = qkv_pad(0)
    out = backend(q, k, v, key_padding_mask=pad, is_causal=causal)
    torch.testing.assert_close(out, loop_attention(q, k, v, pad, admits, causal))


EXACT = [
    ("full", {}, lambda i, j: True),
    ("explicit", {}, lambda i, j: True),
    ("chunked", {"query_chunk": 6, "key_chunk": 7}, lambda i, j: True),
    ("sliding_window", {"window": 3}, lambda i, j: abs(i - j) <= 3),
    ("dilated", {"dilation": 3}, lambda i, j: (i - j) % 3 == 0),
    ("dilated", {"dilation": 2, "window": 2}, lambda i, j: (i - j) % 2 == 0 and abs(i - j) <= 4),
    ("sparse_fixed", {"block": 5, "summary": 2}, lambda i, j: i // 5 == j // 5 or j % 5 >= 3),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("name", "options", "admits"), EXACT,
                         ids=[f"{n}-{'-'.join(map(str, o.values()))}" for n, o, _ in EXACT])
def test_zero_scores_give_the_centroid_of_the_admitted_values_003_exercise_2(
        name, options, admits, causal):
    """003 §2 Exercise 2: when QKᵀ = 0 every α_ij = 1/|keys of i|, so the output of query i is
    the plain mean of the values it may see (its pattern, causality and padding applied).
    Batch 1's last keys are padding, so some windowed queries see none and give zeros."""
    _, k, v, pad = qkv_pad(1)
    q = torch.zeros(2, 2, T, D, dtype=torch.float64)
    out = get_backend(name, **options)(q, k, v, key_padding_mask=pad, is_causal=causal)
    expected = torch.zeros_like(out)
    for b in range(2):
        for i in range(T):
            keys = [j for j in range(T) if admits(i, j) and not pad[b, j]
                    and (j <= i or not causal)]
            if keys:  # a query with no admissible key gets zeros (backends.base convention)
                expected[b, :, i] = v[b, :, keys].mean(dim=1)
    torch.testing.assert_close(out, expected)


def test_linformer_key_value_sharing_projects_values_with_e_b3():
    """seed_002 B.3 (Wang et al. 2020 Eq. 7 and §4 "key-value sharing"): with F = E the head is
    softmax(Q (E K)ᵀ/√d)(E V), here summed key by key: (E K)_r = Σ_j E_rj k_j."""
    q, k, v, _ = qkv_pad(2)
    q, k, v = q[:1, :1, :7], k[:1, :1, :11], v[:1, :1, :11]
    backend = get_backend("linformer", max_len=16, rank=3, share_kv=True).double()
    e = backend.E.detach()
    k_proj = torch.stack([sum(e[r, j] * k[0, 0, j] for j in range(11)) for r in range(3)])
    v_proj = torch.stack([sum(e[r, j] * v[0, 0, j] for j in range(11)) for r in range(3)])
    expected = torch.softmax(q[0, 0] @ k_proj.T / D**0.5, dim=-1) @ v_proj
    torch.testing.assert_close(backend(q, k, v)[0, 0], expected)
