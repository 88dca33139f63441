"""``max_len`` counts a row's real tokens: a cached step without a mask, after a left-padded
prompt, continues each row from its own count (docs/models.md), and is checked by it."""

import pytest
import torch

from graded import TransformerConfig, TransformerLM


def left_padded_lm():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=2, max_len=6,
                            positional="learned", init_std=0.2)
    lm = TransformerLM(cfg).eval()
    ids = torch.randint(0, 11, (2, 6))
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[:, :2] = True  # every row: 2 padding slots, then 4 real tokens (positions 0..3)
    return lm, ids, mask


def test_a_maskless_cached_step_after_left_padding_fits_max_len_by_its_real_tokens():
    lm, ids, mask = left_padded_lm()
    cache = lm.new_cache()
    lm(ids, mask, cache=cache)
    new = torch.tensor([[3], [7]])
    # positions 4 and 5 < max_len: used to be refused as position 6 (the padded width)
    step = lm(new, cache=cache)
    alone = lm(torch.cat([ids[:, 2:], new], dim=1))  # each row without its padding
    torch.testing.assert_close(step[:, -1], alone[:, -1], atol=1e-5, rtol=1e-5)


def test_a_maskless_cached_step_past_max_len_by_its_real_tokens_is_refused():
    lm, ids, mask = left_padded_lm()
    cache = lm.new_cache()
    lm(ids, mask, cache=cache)
    new = torch.tensor([[3, 4], [7, 8]])
    lm(new, cache=cache)  # positions 4, 5
    with pytest.raises(ValueError, match=r"position 6 is beyond max_len=6"):
        lm(new[:, :1], cache=cache)
