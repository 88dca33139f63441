"""The PatternBoost selection step (003 §3.3; seed_003 §4b "T ← top-K objects of D by score
(dedup)", "keep best ≤ target size") of the database, against a naive sort of the inserts."""

import random

import pytest

from graded.search.patternboost.database import Database


def naive_best(inserts, k):
    """The k best distinct keys: first score seen per key, sorted by score (highest first), ties
    by key so that the order is deterministic."""
    first = {}
    for key, score in inserts:
        first.setdefault(key, score)
    return sorted(first.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


@pytest.mark.parametrize("seed", range(5))
def test_database_keeps_the_capacity_best_distinct_objects_and_trains_on_the_top_k(seed):
    """003 §3.3 steps 1 and 5: after each batch of local-search results the database keeps the
    `capacity` best distinct objects; step 2 trains on the `k` best of them. Scores repeat (many
    constructions tie), and keys repeat (local search finds the same graph twice)."""
    rng = random.Random(seed)
    capacity, k = 12, 5
    db = Database(capacity)
    inserts = []
    for _ in range(4):  # four rounds of results, pruned after each
        for key in (f"g{rng.randrange(40):02d}" for _ in range(15)):
            score = float(int(key[1:]) % 8)  # a function of the object; many ties
            db.add(key, score, [0])
            inserts.append((key, score))
        db.prune()
        kept = naive_best(inserts, capacity)
        assert [(e.key, e.score) for e in db.sorted()] == kept
        assert [(e.key, e.score) for e in db.top(k)] == kept[:k]
        inserts = kept  # what was pruned is gone for good
    assert db.best() == kept[0][1]
