"""The pattern backends' kernels (the native block kernels and FlexAttention on the CPU) on
odd shapes: one position, lengths that are no multiple of the block, a batch row whose keys
are all padding, padding of the first key. Each equals softmax attention over the keep-set the
backend reports (:meth:`pattern_keep`) under a dense mask, rows without a key giving zeros."""

import pytest
import torch

from graded.attention.backends import get_backend

PATTERNS = {
    "sliding_window": {"window": 3, "block_size": 4},
    "dilated": {"dilation": 3},
    "dilated_window": {"dilation": 2, "window": 2},
    "sparse_fixed": {"block": 4, "summary": 2},
    "sparse_fixed_split": {"block": 4, "summary": 2, "summary_heads": "split"},
    "sparse_fixed_heads": {"block": 4, "summary": 1, "part": "heads"},
    "block_sparse": {"layout": [[1, 0, 0, 1, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 1],
                                [1, 0, 1, 1, 0], [0, 0, 0, 1, 1]], "block_size": 3},
    "bigbird": {"block_size": 3, "num_random_blocks": 1},
}
PADDING = ["none", "half_of_a_row", "a_whole_row", "the_first_key"]


def padding(kind, b, t):
    if kind == "none":
        return None
    pad = torch.zeros(b, t, dtype=torch.bool)
    if kind == "half_of_a_row":
        pad[-1, t // 2:] = True
    elif kind == "a_whole_row":
        pad[0] = True
    else:
        pad[:, 0] = True
    return pad


# FlexAttention on the CPU takes 0.3 to 1.5 s a case (on 2 cores): two of its eight shapes per
# pattern in the default run, every one with `pytest -m slow`
FLEX_BY_DEFAULT = {(13, "half_of_a_row"), (1, "a_whole_row")}
SHAPES = [pytest.param(kernel, t, pad_kind, id=f"{kernel}-{t}-{pad_kind}", marks=(
    [pytest.mark.slow] if kernel == "flex" and (t, pad_kind) not in FLEX_BY_DEFAULT else []))
    for kernel in ("native", "flex") for t in (1, 13) for pad_kind in PADDING]


@pytest.mark.parametrize(("kernel", "t", "pad_kind"), SHAPES)
@pytest.mark.parametrize("case", sorted(PATTERNS))
def test_pattern_kernels_on_odd_shapes_equal_masked_softmax_over_their_keep_set(
        case, kernel, t, pad_kind):
    name = {"dilated_window": "dilated", "sparse_fixed_split": "sparse_fixed",
            "sparse_fixed_heads": "sparse_fixed"}.get(case, case)
    backend = get_backend(name, **PATTERNS[case], kernel=kernel)
    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(2, 2, t, 4, generator=g, dtype=torch.float64) for _ in range(3))
    pad = padding(pad_kind, 2, t)
    for causal in (False, True):
        keep = backend.pattern_keep(t, causal, heads=2).expand(2, t, t)[None]
        if pad is not None:
            keep = keep & ~pad[:, None, None, :]
        scores = (q @ k.transpose(-2, -1) * 0.5).masked_fill(~keep, float("-inf"))
        expected = torch.softmax(scores, -1).nan_to_num(0.0) @ v
        with torch.no_grad():
            got = backend(q, k, v, key_padding_mask=pad, is_causal=causal)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
