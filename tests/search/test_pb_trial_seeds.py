"""PatternBoost's derived seeds: every (seed, round) of the accepted range 0 <= seed < 2**64
draws its own training and sampling seed, and every (seed, round, chunk) its own local-search
stream, while the seeds of the documented runs keep their draws."""

import numpy as np

from graded.search.patternboost.engine import _round_seed
from graded.search.patternboost.graphs import TriangleFree
from graded.search.patternboost.parallel import run_local_searches

M = 2**63 - 1
# with the old rule (seed·1_000_003 + round·7_919) mod M this seed's round 2 was seed 0's round 1
B = (-7_919 * pow(1_000_003, -1, M)) % M


def test_round_seeds_of_distinct_seeds_and_rounds_are_distinct_and_torch_seeds():
    # seeds M apart, and the pair (0, round 1) / (B, round 2), drew alike
    seeds = [0, 1, 5, 2**32 - 1, 2**32, 2**32 + 5, B, M - 1, M, M + 1, 2 * M, M + 5,
             9_223_344_366_821, 9_223_344_366_822, 2**64 - 1]
    drawn = {(s, r): _round_seed(s, r) for s in seeds for r in range(1, 6)}
    assert len(set(drawn.values())) == len(drawn)
    assert all(0 <= v < 2**64 for v in drawn.values())  # what torch.manual_seed takes
    assert _round_seed(5, 3) != _round_seed(5 + M, 3)
    assert _round_seed(0, 1) != _round_seed(B, 2)


def test_round_seeds_of_the_documented_runs_keep_their_draws():
    # the published tables (seeds 0, 1, 2) were drawn with seed·1_000_003 + round·7_919
    for seed in (0, 1, 2, 12_345, 10**12):
        for r in (0, 1, 2, 40, 10_000):
            assert _round_seed(seed, r) == seed * 1_000_003 + r * 7_919


def test_local_searches_of_seeds_2_32_apart_draw_their_own_streams():
    # numpy split seed 2**32 + 5 into the words 5, 1: its round 7 chunk 0 ran on the stream of
    # seed 5's round 1 chunk 7, so the two local searches from the empty graph were the same
    problem = TriangleFree(12, bits_per_token=4)
    small = run_local_searches(problem, [None] * 8, seed=5, stage=1, chunk_size=1)
    large = run_local_searches(problem, [None], seed=2**32 + 5, stage=7, chunk_size=1)
    assert small[7][0] != large[0][0]


def test_chunk_streams_of_seeds_below_2_32_are_numpy_seed_sequences_of_the_triple():
    from graded.search.patternboost.parallel import chunk_seed

    for seed, stage, chunk in [(0, 0, 0), (5, 1, 7), (2**32 - 1, 3, 2)]:
        expected = np.random.SeedSequence([seed, stage, chunk]).generate_state(4)
        assert chunk_seed(seed, stage, chunk).generate_state(4).tolist() == expected.tolist()
    states = {tuple(chunk_seed(s, r, c).generate_state(4))
              for s in (5, 2**32 + 5, 2**33 + 5, 2**64 - 1) for r in range(8) for c in range(8)}
    assert len(states) == 4 * 8 * 8
