"""Copies of a stochastic merge tokenizer draw independently: a copy starts in the original's
state and neither advances the other; DataLoader workers draw differently from one another,
repeatably under a seeded loader, unless a ``worker_init_fn`` reseeds them alike."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from graded.encodings import StochasticMergeTokenizer

PIECES = ["a", "b", "ab", "aba", "abab", "ba", "bab"]
TEXT = "ab" * 40  # about 40 merge decisions, so two independent segmentations differ


def tokenizer(seed: int = 3) -> StochasticMergeTokenizer:
    return StochasticMergeTokenizer(PIECES, p=0.5, seed=seed)


def draws(tok: StochasticMergeTokenizer, n: int) -> list[tuple[int, ...]]:
    return [tuple(tok.encode(TEXT)) for _ in range(n)]


@pytest.mark.parametrize("make_copy", [copy.copy, copy.deepcopy,
                                       lambda t: pickle.loads(pickle.dumps(t))],
                         ids=["copy", "deepcopy", "pickle"])
def test_a_copy_and_its_original_each_repeat_the_draws_of_the_original_alone(make_copy):
    original = tokenizer()
    original.encode(TEXT)  # the copy takes the state at copy time, not the seed's
    expected = draws(copy.deepcopy(original), 4)
    duplicate = make_copy(original)
    got_original, got_copy = [], []
    for _ in range(4):  # interleaved: with one shared generator each took every other draw
        got_original.append(tuple(original.encode(TEXT)))
        got_copy.append(tuple(duplicate.encode(TEXT)))
    assert len(set(expected)) > 1  # the draws do vary
    assert got_original == expected
    assert got_copy == expected
    assert duplicate.rng is not original.rng


class _Texts(Dataset):
    def __init__(self, tok: StochasticMergeTokenizer, n: int) -> None:
        self.tok, self.n = tok, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        info = get_worker_info()
        return info.id, torch.tensor(self.tok.encode(TEXT))


def _load(tok: StochasticMergeTokenizer, seed: int, worker_init_fn=None) -> list:
    loader = DataLoader(_Texts(tok, 4), batch_size=None, num_workers=2,
                        multiprocessing_context="fork", worker_init_fn=worker_init_fn,
                        generator=torch.Generator().manual_seed(seed))
    return [(int(worker), tuple(ids.tolist())) for worker, ids in loader]


def test_dataloader_workers_draw_different_segmentations_repeatably_per_loader_seed():
    tok = tokenizer()
    before = draws(copy.deepcopy(tok), 1)
    first = _load(tok, seed=0)
    assert sorted({w for w, _ in first}) == [0, 1]
    for _, ids in first:
        assert tok.decode(ids) == TEXT
    by_worker = {w: [ids for v, ids in first if v == w] for w in (0, 1)}
    # each worker had one copy in one state: before, they all made the same draws
    assert by_worker[0][0] != by_worker[1][0]
    assert by_worker[0][1] != by_worker[1][1]
    assert _load(tok, seed=0) == first  # a seeded loader repeats
    assert _load(tok, seed=1) != first  # another seed, other draws
    assert draws(tok, 1) == before  # the workers' draws left the original as it was


def test_a_worker_init_fn_that_reseeds_the_tokenizer_chooses_the_workers_draws():
    def reseed(worker_id: int) -> None:
        get_worker_info().dataset.tok.reseed(7)

    got = _load(tokenizer(), seed=0, worker_init_fn=reseed)
    expected = draws(tokenizer(seed=7), 2)
    for w in (0, 1):
        assert [ids for v, ids in got if v == w] == expected
