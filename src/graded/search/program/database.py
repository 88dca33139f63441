"""The programs database of FunSearch (003 §3.4), with Pareto selection for vector scores.

Definitions (as in FunSearch's programs database):

- The population is split into ``islands`` that evolve independently. A new program joins the
  island whose programs were in its prompt; the initial program joins every island.
- Within an island, programs with the same *score signature* (their scores on every input)
  form a *cluster*; a cluster's score is the mean of its signature.
- A prompt draws ``programs_per_prompt`` distinct clusters with probabilities
  softmax(score / T), where the temperature anneals in a saw-tooth over evaluations:
  T_n = T_0 · (1 − (n mod P)/P), with n the island's registered programs and P the period.
- Within a cluster a program is drawn with probabilities softmax(−ℓ̂), with
  ℓ̂_i = (ℓ_i − min ℓ)/(max ℓ + 10⁻⁶) its normalised length: shorter programs are preferred.
- Every ``reset_period`` evaluations the weaker half of the islands (ranked by best score, ties
  broken by a 10⁻⁶ perturbation) is emptied, and each is re-founded with the best program of
  an island drawn uniformly from the stronger half.
- Prompts show the sampled programs sorted by increasing score as versions ``<name>_v0``,
  ``<name>_v1``, … and ask for the next version.

For problems with named scores, ``selection="pareto"`` draws prompt programs uniformly from an
island's Pareto front over the named scores (directions from ``Problem.minimise``; a problem
whose verifier returns one number is refused), and
``selection="map-elites"`` keeps the best program per cell of a grid over two named scores
(the descriptors) and draws cells uniformly. Both compare programs name by name, so every
program must have the initial program's named scores (``ProgramsDatabase.names``): the search
evaluates with ``evaluate(..., names=db.names)``, which fails a program with other names as
``wrong_type``, and ``register`` refuses an evaluation with other names.

The database's state (programs, clusters, random generator) is a JSON document, so a run
resumes exactly.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graded.search.program.evaluate import Evaluation, mean_score
from graded.search.program.program import block_functions, rename_function

__all__ = ["SELECTIONS", "DatabaseConfig", "Island", "ProgramsDatabase", "Prompt",
           "cluster_probabilities", "length_probabilities", "pareto_front", "temperature"]

SELECTIONS = ("clusters", "pareto", "map-elites")


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    # shifted before the division: scores as large as 1e307 at temperature 0.1 overflowed to
    # inf, and inf - inf made every probability NaN
    z = np.asarray(logits, dtype=np.float64)
    with np.errstate(over="ignore"):  # a shifted logit of -inf has probability 0.0, as it should
        z = (z - z.max()) / temperature
    e = np.exp(z)
    return e / e.sum()


def temperature(t0: float, period: int, registered: int) -> float:
    """The annealed cluster-sampling temperature T_0·(1 − (n mod P)/P)."""
    return t0 * (1.0 - (registered % period) / period)


def cluster_probabilities(scores, t0: float, period: int, registered: int) -> np.ndarray:
    return softmax(np.asarray(scores, dtype=np.float64), temperature(t0, period, registered))


def length_probabilities(lengths) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.float64)
    normalised = (lengths - lengths.min()) / (lengths.max() + 1e-6)
    return softmax(-normalised, 1.0)


def pareto_front(points: list[dict[str, float]], minimise: tuple[str, ...] = ()) -> list[int]:
    """Indices of the points no other point dominates (≥ in every score, > in one, after
    flipping the signs of ``minimise``)."""
    if not points:
        return []
    keys = sorted(points[0])
    sign = np.array([-1.0 if k in minimise else 1.0 for k in keys])
    x = np.array([[p[k] for k in keys] for p in points]) * sign
    front = []
    for i in range(len(points)):
        dominated = np.any(np.all(x >= x[i], axis=1) & np.any(x > x[i], axis=1))
        if not dominated:
            front.append(i)
    return front


@dataclass(frozen=True)
class DatabaseConfig:
    islands: int = 4
    programs_per_prompt: int = 2
    temperature_init: float = 0.1
    temperature_period: int = 30_000
    reset_period: int = 200
    selection: str = "clusters"
    descriptors: tuple[str, ...] = ()
    bins: int = 8

    def __post_init__(self) -> None:
        for name in ("islands", "programs_per_prompt", "temperature_period", "reset_period",
                     "bins"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name}={value!r}; expected an integer >= 1")
        t0 = self.temperature_init  # "0.1" raised a bare TypeError from the comparison
        if (isinstance(t0, bool) or not isinstance(t0, numbers.Real)
                or not 0 < t0 < math.inf):
            raise ValueError(f"temperature_init={t0!r}; expected > 0, a finite number")
        names = self.descriptors  # a string "ab" passed as the two descriptors 'a' and 'b'
        if not isinstance(names, (tuple, list)) or not all(isinstance(d, str) for d in names):
            raise ValueError(f"descriptors={names!r}; expected a tuple of names of scores")
        object.__setattr__(self, "descriptors", tuple(names))
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection={self.selection!r}; expected one of {SELECTIONS}")
        if self.selection == "map-elites" and len(self.descriptors) != 2:
            raise ValueError("map-elites selection needs two descriptors (named scores), got "
                             f"{self.descriptors!r}")
        if self.selection != "map-elites" and self.descriptors:
            raise ValueError(f"descriptors={self.descriptors!r} span the grid of map-elites "
                             f"selection only; selection={self.selection!r} would ignore them "
                             "(choose selection='map-elites' or leave descriptors out)")


@dataclass
class Island:
    """Clusters keyed by score signature; each holds (program, evaluation) entries."""

    clusters: dict[tuple, list[Evaluation]] = field(default_factory=dict)
    registered: int = 0
    best: Evaluation | None = None

    def add(self, evaluation: Evaluation) -> None:
        self.clusters.setdefault(evaluation.signature, []).append(evaluation)
        self.registered += 1
        if self.best is None or evaluation.score > self.best.score:
            self.best = evaluation

    def members(self) -> list[Evaluation]:
        return [e for c in self.clusters.values() for e in c]


@dataclass
class Prompt:
    """What a proposer sees: the island, the parents sorted by increasing score, their text."""

    island: int
    parents: list[Evaluation]
    text: str


class ProgramsDatabase:
    """Islands of clustered programs (see the module docstring); ``names``: the sorted named
    scores of the initial program, which every registered program has."""

    def __init__(self, config: DatabaseConfig, initial: Evaluation, *, seed: int = 0,
                 minimise: tuple[str, ...] = ()) -> None:
        if not initial.ok:
            raise ValueError(f"the initial program fails ({initial.failure}: {initial.reason}); "
                             "the search needs a working starting point")
        missing = [d for d in config.descriptors if d not in initial.scores]
        if config.selection == "map-elites" and missing:
            names = sorted(initial.scores)
            raise ValueError(f"map-elites descriptors {missing} are not named scores of the "
                             f"problem; expected two of {names}" if names else
                             f"map-elites descriptors {missing}: the problem's verifier returns "
                             "one number; expected a problem with named scores")
        if config.selection == "pareto" and not initial.scores:
            # with no named score every program was on the "front": parents were drawn
            # uniformly from the whole island, the worst programs as often as the best
            raise ValueError("pareto selection compares named scores, but the problem's "
                             "verifier returns one number; expected a problem with named "
                             "scores (or selection='clusters')")
        self.config = config
        self.minimise = tuple(minimise)
        self.names = tuple(sorted(initial.scores))
        self.rng = np.random.default_rng(seed)
        self.islands = [Island() for _ in range(config.islands)]
        for island in self.islands:
            island.add(initial)
        self.evaluations = 0
        self.resets = 0

    # -- selection -------------------------------------------------------------------------------
    def best(self) -> Evaluation:
        return max((i.best for i in self.islands), key=lambda e: e.score)

    def sample(self, island_id: int | None = None) -> tuple[int, list[Evaluation]]:
        """An island (uniform when not given) and its prompt programs, by increasing score."""
        if island_id is None:
            island_id = int(self.rng.integers(len(self.islands)))
        island = self.islands[island_id]
        k = self.config.programs_per_prompt
        if self.config.selection == "clusters":
            parents = self._sample_clusters(island, k)
        elif self.config.selection == "pareto":
            members = island.members()
            front = pareto_front([m.scores for m in members], self.minimise)
            pick = self.rng.choice(len(front), size=min(k, len(front)), replace=False)
            parents = [members[front[int(i)]] for i in pick]
        else:
            cells = self._elites(island)
            keys = sorted(cells)
            pick = self.rng.choice(len(keys), size=min(k, len(keys)), replace=False)
            parents = [cells[keys[int(i)]] for i in pick]
        parents.sort(key=lambda e: e.score)
        return island_id, parents

    def _sample_clusters(self, island: Island, k: int) -> list[Evaluation]:
        signatures = list(island.clusters)
        scores = [mean_score(s) for s in signatures]  # np.mean overflowed: 2 × 1e308 = inf
        p = cluster_probabilities(scores, self.config.temperature_init,
                                  self.config.temperature_period, island.registered)
        # clusters far below the best get probability 0.0 in floating point; draw only among
        # those with positive probability
        k = min(k, int(np.count_nonzero(p)))
        chosen = self.rng.choice(len(signatures), size=k, replace=False, p=p)
        parents = []
        for index in chosen:
            cluster = island.clusters[signatures[int(index)]]
            q = length_probabilities([e.program.length for e in cluster])
            parents.append(cluster[int(self.rng.choice(len(cluster), p=q))])
        return parents

    def _elites(self, island: Island) -> dict[tuple[int, int], Evaluation]:
        a, b = self.config.descriptors
        members = island.members()
        lo = {d: min(m.scores[d] for m in members) for d in (a, b)}
        hi = {d: max(m.scores[d] for m in members) for d in (a, b)}
        bins = self.config.bins

        def cell(value: float, d: str) -> int:
            span = hi[d] - lo[d]
            return 0 if span == 0 else min(bins - 1, int((value - lo[d]) / span * bins))

        cells: dict[tuple[int, int], Evaluation] = {}
        for m in members:
            key = (cell(m.scores[a], a), cell(m.scores[b], b))
            if key not in cells or m.score > cells[key].score:
                cells[key] = m
        return cells

    # -- registration and resets -----------------------------------------------------------------
    def register(self, island_id: int, evaluation: Evaluation) -> None:
        """Adds a successful evaluation to its island; resets islands every reset period.

        A successful evaluation must have the named scores of the initial program
        (:attr:`names`): Pareto and MAP-Elites selection compare programs name by name.
        ``evaluate(..., names=db.names)`` turns a program with other names into a failure."""
        if evaluation.ok and tuple(sorted(evaluation.scores)) != self.names:
            raise ValueError(f"the evaluation has the named scores {sorted(evaluation.scores)}, "
                             f"the initial program {list(self.names)}; expected the same names "
                             "(evaluate with names=db.names fails such a program)")
        self.evaluations += 1
        if evaluation.ok:
            self.islands[island_id].add(evaluation)
        if self.evaluations % self.config.reset_period == 0 and len(self.islands) > 1:
            self.reset_islands()

    def reset_islands(self) -> list[int]:
        """Re-founds the weaker half of the islands from the best of the stronger half."""
        best = np.array([i.best.score for i in self.islands])
        order = np.argsort(best + self.rng.standard_normal(len(best)) * 1e-6)
        n_reset = len(self.islands) // 2
        reset, keep = order[:n_reset], order[n_reset:]
        for island_id in reset:
            founder = self.islands[int(self.rng.choice(keep))].best
            fresh = Island()
            fresh.add(founder)
            self.islands[int(island_id)] = fresh
        self.resets += 1
        return [int(i) for i in reset]

    # -- prompts ---------------------------------------------------------------------------------
    def prompt(self, island_id: int, parents: list[Evaluation], *, header: str = "") -> Prompt:
        """FunSearch's prompt: the parents' evolvable functions renamed ``name_v0``, …, sorted by
        increasing score, then the header of ``name_v{k}`` to be written."""
        blocks = parents[0].program.blocks
        if len(blocks) != 1:
            text = _multi_block_prompt(parents, header)
            return Prompt(island_id, parents, text)
        names = block_functions(blocks[0])
        if not names:
            raise ValueError("the evolvable block defines no function to version")
        name = names[0]
        pieces = [header] if header else []
        for version, parent in enumerate(parents):
            body = rename_function(parent.program.blocks[0], name, f"{name}_v{version}")
            pieces.append(f"# score: {parent.score:.6g}\n{body}")
        pieces.append(f"# Write {name}_v{len(parents)}, an improved version of "
                      f"{name}_v{len(parents) - 1}.\n")
        return Prompt(island_id, parents, "\n".join(pieces))

    # -- state -----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "config": self.config.__dict__ | {"descriptors": list(self.config.descriptors)},
            "minimise": list(self.minimise),
            "names": list(self.names),
            "rng": self.rng.bit_generator.state,
            "evaluations": self.evaluations,
            "resets": self.resets,
            "islands": [{"registered": i.registered,
                         "best": i.best.as_dict(),
                         "clusters": [[e.as_dict() for e in c] for c in i.clusters.values()]}
                        for i in self.islands],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ProgramsDatabase:
        config = DatabaseConfig(**(state["config"] | {
            "descriptors": tuple(state["config"]["descriptors"])}))
        db = cls.__new__(cls)
        db.config = config
        db.minimise = tuple(state["minimise"])
        # states saved before the names were: those of island 0's best program
        db.names = tuple(state.get("names",
                                   sorted(Evaluation.from_dict(state["islands"][0]["best"]).scores)))
        db.rng = np.random.default_rng()
        db.rng.bit_generator.state = state["rng"]
        db.evaluations = state["evaluations"]
        db.resets = state["resets"]
        db.islands = []
        for data in state["islands"]:
            island = Island(registered=data["registered"],
                            best=Evaluation.from_dict(data["best"]))
            for cluster in data["clusters"]:
                entries = [Evaluation.from_dict(e) for e in cluster]
                island.clusters[entries[0].signature] = entries
            db.islands.append(island)
        return db


def _multi_block_prompt(parents: list[Evaluation], header: str) -> str:
    pieces = [header] if header else []
    for version, parent in enumerate(parents):
        blocks = "\n".join(f"# block {b}\n{src}" for b, src in enumerate(parent.program.blocks))
        pieces.append(f"# version {version}, score: {parent.score:.6g}\n{blocks}")
    pieces.append("# Propose changes to the blocks of the last version as SEARCH/REPLACE diffs.\n")
    return "\n".join(pieces)
