"""select_next called directly: a row with no token left is refused naming it, in the words
generation uses, whether the choice is greedy or sampled; other rows are the argmax a loop
finds."""

import pytest
import torch

from graded.transformer.generation import decode
from graded.transformer.logits import select_next

INF = float("-inf")
GREEDY = dict(do_sample=False)
SAMPLING = dict(do_sample=True, generator=torch.Generator().manual_seed(0))


def _select(logits, **mode):
    options = dict(temperature=1.0, top_k=None, top_p=None, generator=None)
    return select_next(logits, **{**options, **mode})


@pytest.mark.parametrize("mode", [GREEDY, SAMPLING], ids=["greedy", "sampling"])
def test_a_row_of_all_minus_inf_is_refused_naming_it(mode):
    """Greedy selection used to return token 0 for row 1, a token its scores ban; sampling
    refused it in other words than generation ('no token is left to sample')."""
    logits = torch.tensor([[0.0, 2.0, 1.0], [INF, INF, INF], [INF, 5.0, INF]])
    with pytest.raises(ValueError, match=r"^no token is left to generate in row\(s\) \[1\]: "
                                         r"every score is -inf there"):
        _select(logits, **mode)
    logits[2] = INF
    with pytest.raises(ValueError, match=r"in row\(s\) \[1, 2\]: every score is -inf"):
        _select(logits, **mode)


def test_the_message_is_the_one_generation_gives_without_the_step():
    """decode names the step as well; the rest of the sentence is the same."""
    def step(ids, mask, cache):
        return torch.tensor([[1.0, 2.0], [INF, INF]])[:, None].expand(-1, ids.shape[1], -1)

    prompt = torch.tensor([[0], [1]])
    with pytest.raises(ValueError) as from_decode:
        decode(step, prompt, torch.zeros_like(prompt, dtype=torch.bool), 2, n_layers=0,
               do_sample=False, temperature=1.0, top_k=None, top_p=None, num_beams=1,
               eos_token_id=None, pad_token_id=None, use_cache=False, generator=None,
               length_penalty=1.0, vocab_size=2)
    with pytest.raises(ValueError) as direct:
        _select(torch.tensor([[1.0, 2.0], [INF, INF]]), **GREEDY)
    assert str(from_decode.value) == str(direct.value).replace(
        "to generate in", "to generate at new token 1 in")


def test_many_rows_without_a_token_are_counted_past_the_first_eight():
    logits = torch.full((11, 4), INF)
    logits[0, 2] = 0.0
    with pytest.raises(ValueError, match=r"row\(s\) \[1, 2, 3, 4, 5, 6, 7, 8\] and 2 more: "):
        _select(logits, **GREEDY)


def test_rows_with_a_token_left_get_the_argmax_of_a_loop():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 9, generator=g)
    logits[logits < -0.5] = INF  # banned tokens, at least one left per row below
    logits[:, 4] = torch.randn(6, generator=g).abs()
    want = [max(range(9), key=lambda j, r=row: float(r[j])) for row in logits]
    assert _select(logits, **GREEDY).tolist() == want
    drawn = _select(logits, **SAMPLING)
    assert all(not torch.isneginf(logits[i, t]) for i, t in enumerate(drawn.tolist()))


@pytest.mark.parametrize("temperature", [1e-300, 0.5, 1e300])
def test_a_temperature_whose_quotients_overflow_still_samples_its_distribution(temperature):
    """Scores whose quotient by the temperature overflows float32: a tiny temperature gave the
    largest score +inf (softmax NaN: torch.multinomial failed), two scores of -3e38 at 0.5 gave
    -inf both (the row was refused as having nothing left). The largest score is brought to 0
    first: a tiny temperature then draws the largest score, a huge one draws uniformly, and
    at 0.5 the two equal scores are drawn alike, as the limits and the exact softmax say."""
    logits = torch.tensor([[-3e38, -3e38, INF], [0.0, 1.0, INF], [2.0, -1.0, 0.5]])
    g = torch.Generator().manual_seed(0)
    drawn = torch.stack([_select(logits, **{**SAMPLING, "temperature": temperature,
                                             "generator": g}) for _ in range(400)])
    assert not torch.isneginf(logits.gather(1, drawn.T)).any()  # never a banned token
    if temperature == 1e-300:  # the argmax of each row with one largest score
        assert drawn[:, 1].eq(1).all() and drawn[:, 2].eq(0).all()
    else:  # every allowed token drawn, at about its softmax share
        for row in range(3):
            allowed = (~torch.isneginf(logits[row])).nonzero().flatten().tolist()
            assert sorted(set(drawn[:, row].tolist())) == allowed
    if temperature == 1e300:  # the limit: uniform over the allowed tokens
        share = drawn[:, 2].eq(0).float().mean().item()
        assert abs(share - 1 / 3) < 0.08
    assert _select(logits, **GREEDY).tolist() == [0, 1, 0]
