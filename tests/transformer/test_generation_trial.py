"""Generation with attention backends that place their pattern by slot index (BigBird,
block_sparse, sparse_fixed, LSH): a left-padded prompt generates what the prompt alone
generates, against a naive loop that reruns the whole unpadded row each step."""

import pytest
import torch

from graded import TransformerConfig, TransformerLM

V = 11
# a causal block layout of 8 blocks: each block sees itself, the one before and the first
LAYOUT = [[j <= i and j in (0, i - 1, i) for j in range(8)] for i in range(8)]
SLOT_PLACED = {
    "block_sparse": {"layout": LAYOUT, "block_size": 2},
    "bigbird": {"block_size": 2},
    "sparse_fixed": {"block": 4, "summary": 1},
    # fixed rotations (the same pattern at every call), chunks shorter than the prompts
    "lsh": {"seed": 0, "chunk_size": 2, "n_buckets": 4},
}


def lm(backend: str) -> TransformerLM:
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, max_len=32,
                            positional="rope", init_std=0.5, attn_backend=backend,
                            attn_backend_options=SLOT_PLACED[backend])
    return TransformerLM(cfg).double().eval()


def naive_greedy(model, row: list[int], n: int) -> list[int]:
    """Greedy decoding of one unpadded row, the whole sequence rerun each step."""
    ids = list(row)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids


def padded_batch(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[True] * (width - len(r)) + [False] * len(r) for r in rows])
    return ids, mask


ROWS = [[3, 7, 1, 9, 2, 5, 8], [4, 4, 6, 1], [9, 2, 7, 3, 3, 10], [5, 1, 8, 2]]


@pytest.mark.parametrize("backend", sorted(SLOT_PLACED))
def test_a_left_padded_prompt_generates_what_it_generates_alone_with_a_slot_placed_pattern(
        backend):
    model = lm(backend)
    ids, mask = padded_batch(ROWS)
    caches = (False, True) if backend != "lsh" else (False,)  # LSH cannot decode with one
    for use_cache in caches:
        out = model.generate(ids, 8, key_padding_mask=mask, use_cache=use_cache)
        for b, row in enumerate(ROWS):
            pad = ids.shape[1] - len(row)
            assert out[b, pad:].tolist() == naive_greedy(model, row, 8), (backend, use_cache, b)
            assert out[b, :pad].tolist() == [0] * pad  # the prompt's padding is returned as is


def test_padded_beams_and_eos_with_a_slot_placed_pattern_end_as_the_rows_alone():
    """Beam search and EOS: each row's hypothesis is the one it finds alone, the rows that end
    sooner continued with the pad id up to the longest row's new tokens."""
    model = lm("block_sparse")
    ids, mask = padded_batch(ROWS)
    opts = {"num_beams": 3, "eos_token_id": [2, 6], "pad_token_id": 0}
    out = model.generate(ids, 7, key_padding_mask=mask, **opts)
    alone = [model.generate(torch.tensor([row]), 7, **opts)[0, len(row):].tolist()
             for row in ROWS]
    assert out.shape[1] == ids.shape[1] + max(map(len, alone))
    for b, new in enumerate(alone):
        rest = out[b, ids.shape[1]:].tolist()
        assert rest == new + [0] * (len(rest) - len(new))


def test_the_slot_placed_backends_are_those_a_left_padded_prompt_moves():
    from graded.transformer.decoding_inputs import slot_placed_backends

    for backend in SLOT_PLACED:
        assert [b for _, b in slot_placed_backends(lm(backend))] == [backend]
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=2, max_len=32,
                            attn_backend="sliding_window", attn_backend_options={"window": 3})
    assert slot_placed_backends(TransformerLM(cfg)) == []


def test_a_row_with_no_token_left_is_named_by_its_row_of_the_padded_batch():
    """Rows decoded apart from their padding are still named by their index in the batch."""
    model = lm("sparse_fixed")
    ids, mask = padded_batch(ROWS)
    banned = [[ROWS[2][-1], t] for t in range(V)]  # every token after row 2's last one
    with pytest.raises(ValueError, match=r"at new token 1 in row\(s\) \[2\]"):
        model.generate(ids, 3, key_padding_mask=mask, bad_words_ids=banned)


def test_numpy_integer_token_ids_and_counts_decode_as_the_python_ints():
    """A NumPy integer is taken wherever an id or a count is (``max_new_tokens`` and
    ``num_beams`` took them, ``pad_token_id`` with an EOS id was refused as "not a token id in
    [0, V)" naming the id 0), with the tokens of the Python ints."""
    np = pytest.importorskip("numpy")
    model = lm("sparse_fixed")
    prompt = torch.tensor(ROWS[:1])
    as_ints = {"eos_token_id": [2, 6], "pad_token_id": 0, "forced_eos_token_id": 2,
               "no_repeat_ngram_size": 2, "min_new_tokens": 1}
    as_numpy = {"eos_token_id": [np.int64(2), np.int32(6)], "pad_token_id": np.int64(0),
                "forced_eos_token_id": np.int64(2), "no_repeat_ngram_size": np.int64(2),
                "min_new_tokens": np.int64(1)}
    for beams in (1, 2):
        expected = model.generate(prompt, 6, num_beams=beams, **as_ints)
        assert torch.equal(model.generate(prompt, 6, num_beams=beams, **as_numpy), expected)
    drawn = [model.generate(prompt, 6, do_sample=True, top_k=top_k,
                            generator=torch.Generator().manual_seed(3))
             for top_k in (2, np.int64(2))]
    assert torch.equal(drawn[0], drawn[1])

