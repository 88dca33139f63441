"""Each backend's declared ``shift_invariant`` capability is what left padding does to it: a
row's output at its real tokens, behind masked padding slots, equals its output alone exactly
where the backend declares it (generation trusts the declaration to decode a left-padded batch
in one pass, :func:`graded.transformer.decoding_inputs.slot_placed_backends`)."""

import pytest
import torch

from graded import TransformerConfig, TransformerLM
from graded.attention.backends import backend_capabilities, backends_supporting

# options that make a pattern's placement visible at these lengths (blocks, chunks of 2)
OPTIONS = {"block_sparse": {"layout": [[j <= i and j in (0, i - 1, i) for j in range(12)]
                                       for i in range(12)], "block_size": 2},
           "bigbird": {"block_size": 2}, "sparse_fixed": {"block": 4, "summary": 1},
           "lsh": {"seed": 0, "chunk_size": 2, "n_buckets": 4},
           "sliding_window": {"window": 3}, "dilated": {"window": 3, "dilation": 2},
           "chunked": {"query_chunk": 2}}
ROW = [3, 7, 1, 9, 2, 5, 8, 4, 10, 6, 2, 9, 1, 3]


@pytest.mark.parametrize("backend", backends_supporting("causal", "key_padding_mask"))
def test_left_padding_moves_the_output_exactly_when_the_backend_says_so(backend):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_len=24,
                            positional="rope", init_std=0.5, attn_backend=backend,
                            attn_backend_options=OPTIONS.get(backend, {}))
    model = TransformerLM(cfg).double().eval()
    worst = 0.0
    with torch.no_grad():
        alone = model(torch.tensor([ROW]))[0]
        for pad in range(1, 6):
            ids = torch.tensor([[0] * pad + ROW])
            mask = torch.tensor([[True] * pad + [False] * len(ROW)])
            padded = model(ids, mask)[0, pad:]
            worst = max(worst, float((padded - alone).abs().max()))
    if backend_capabilities(backend).shift_invariant:
        assert worst < 1e-10, (backend, worst)
    else:  # a pattern placed by slot index: some padding moves the row across it
        assert worst > 1e-3, (backend, worst)
