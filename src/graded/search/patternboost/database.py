"""The PatternBoost database: the best distinct objects found so far (003 §3.3, step 1 and 5)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Database", "Entry", "key_to_str"]


@dataclass(frozen=True)
class Entry:
    """One object of the database, kept as its tokens (objects are rebuilt by `decode`).

    `valid`: whether the object satisfies the problem's constraint. Local search only returns
    valid objects; the global-only baseline adds samples as decoded, violations and all.
    """

    key: str
    score: float
    tokens: tuple[int, ...]
    valid: bool = True


class Database:
    """Distinct objects by key, at most `capacity` of them, the best kept.

    Order is deterministic: by score (higher first), then by key, so that a resumed run picks
    the same training set as an uninterrupted one. The best object is the best *valid* one: an
    object that violates the constraint can score as much as a valid one (a 4-cycle-free graph
    plus the edge that closes one 4-cycle scores #E − 2), but it is no construction.
    """

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._entries: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def add(self, key: str, score: float, tokens: list[int] | tuple[int, ...],
            valid: bool = True) -> bool:
        """Insert an object; returns whether its key was new. Call `prune` after a batch.

        A NaN score is refused (ValueError): it has no place in the order, so the ranking, the
        training set and the best object would depend on the order of insertion."""
        value = float(score)
        if math.isnan(value):
            raise ValueError(f"object {key!r} has score {score!r}; expected a number, not NaN "
                             "(check the problem's score function)")
        if key in self._entries:
            return False
        self._entries[key] = Entry(key, value, tuple(int(t) for t in tokens), bool(valid))
        return True

    def sorted(self) -> list[Entry]:
        """All entries, best first."""
        return sorted(self._entries.values(), key=lambda e: (-e.score, e.key))

    def top(self, k: int) -> list[Entry]:
        """The best `k` entries (the training set of 003 §3.3, step 2)."""
        return self.sorted()[:k]

    def prune(self) -> None:
        """Keep only the best `capacity` entries, the best valid one always among them."""
        if len(self._entries) > self.capacity:
            kept = self.sorted()[: self.capacity]
            best = self.best_entry()
            if best is not None and not any(e.valid for e in kept):
                kept[-1] = best
            self._entries = {e.key: e for e in kept}

    def best_entry(self) -> Entry | None:
        """The best valid entry (first in `sorted` order), or None when there is none."""
        return next((e for e in self.sorted() if e.valid), None)

    def best(self) -> float:
        """Highest score of a valid entry, or -inf when there is none."""
        return max((e.score for e in self._entries.values() if e.valid), default=float("-inf"))

    def to_json(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "entries": [[e.key, e.score, list(e.tokens)] + ([] if e.valid else [False])
                        for e in self.sorted()],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Database:
        db = cls(int(data["capacity"]))
        for key, score, tokens, *valid in data["entries"]:  # valid: written when False
            db.add(str(key), float(score), tokens, valid[0] if valid else True)
        return db


def key_to_str(key: object) -> str:
    """JSON-safe text of a problem key: hex for bytes, the string itself, else `repr`."""
    if isinstance(key, bytes):
        return key.hex()
    if isinstance(key, str):
        return key
    return repr(key)
