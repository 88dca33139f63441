"""The PatternBoost loop (003 §3.3) and its local-only and global-only baselines.

003 §3.3: build a dataset by local search from the empty object; train a small transformer on
it; sample many outputs (many may not decode); run local search on all of them; repeat. As in
the public code the next training set is the best K distinct objects of the database, which
keeps the best `database_size` objects found so far.

A run lives in a folder: config.json, state.json (database, metrics, counters), the model's
weights (safetensors) and metrics.csv, all rewritten atomically after every round, and
metrics.png, drawn when the run stops (finished or interrupted).
`run_patternboost` on a folder that holds a state resumes after its last finished round and,
because every random draw of round r is seeded from (seed, r), ends in the same state as an
uninterrupted run.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graded.train.runs import PROGRAM_SEARCH_FILES, search_run_files, training_run_files

from .config import PatternBoostConfig
from .database import Database
from .parallel import make_executor, run_local_searches
from .problem import DecodeError, Problem
from .problems import problem_from_size
from .records import (
    load_weights,
    plot_metrics,
    read_json,
    save_weights,
    write_csv,
    write_json,
)

__all__ = ["PatternBoostResult", "run_patternboost"]


@dataclass
class PatternBoostResult:
    """Outcome of a run: the best object, its score, and the per-round metrics."""

    out_dir: Path
    problem: Problem
    best_score: float
    best_tokens: list[int]
    rounds_done: int
    metrics: list[dict[str, Any]]
    interrupted: bool = False

    @property
    def best_object(self) -> Any:
        """The best valid object, or None when the run has none (stopped during round 0):
        decoding its empty tokens was a DecodeError ("wrong length")."""
        return self.problem.decode(self.best_tokens) if self.best_tokens else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


_SEED_STEP, _ROUND_STEP = 1_000_003, 7_919  # coprime primes
_PLAIN_SEEDS = 2**63 - 1  # round seeds below it are seed·_SEED_STEP + round·_ROUND_STEP


def _round_seed(seed: int, round_index: int) -> int:
    """The torch seed of round `round_index`'s training and sampling in a run of `seed`, in
    [0, 2**64): distinct (seed, round) pairs get distinct seeds (a chance collision of the
    hash below aside).

    seed·1_000_003 + round·7_919 where that is below 2**63 − 1 and round < 1_000_003 (so
    runs of seeds below about 9.2·10**12 keep their draws); the two primes are coprime, so
    the value gives back (seed, round). Otherwise a 64-bit hash of
    (seed, round) (numpy's SeedSequence) placed in [2**63 − 1, 2**64), above every value of
    the first rule. (That rule taken modulo 2**63 − 1 for every seed gave seeds 2**63 − 1
    apart the same draws, and other pairs: seed 2240820737263692846's round 2 drew as seed
    0's round 1.)"""
    plain = seed * _SEED_STEP + round_index * _ROUND_STEP
    if plain < _PLAIN_SEEDS and round_index < _SEED_STEP:
        return plain
    digest = int(np.random.SeedSequence(seed, spawn_key=(round_index,)).generate_state(
        1, np.uint64)[0])
    return _PLAIN_SEEDS + digest % (2**64 - _PLAIN_SEEDS)


class _Run:
    """State of one run between rounds; `step` performs one round."""

    def __init__(self, config: PatternBoostConfig, out_dir: Path) -> None:
        self.config = config
        self.out = out_dir
        self.problem = problem_from_size(config.problem, config.n, **config.problem_options)
        self.db = Database(config.database_size)
        self.metrics: list[dict[str, Any]] = []
        self.round = -1  # last finished round; round 0 builds the initial dataset
        self.calls = 0
        self.elapsed = 0.0
        self.model = None
        self.model_file: str | None = None
        self.special = None
        if config.builds_model:
            from .model import SpecialTokens

            self.special = SpecialTokens(self.problem.vocab_size)

    # ---------------------------------------------------------------- persistence
    def save(self) -> None:
        old_model = self.model_file
        if self.model is not None:
            self.model_file = f"model-{self.round:04d}.safetensors"
            save_weights(self.out / self.model_file, self.model.state_dict())
        state = {
            "round": self.round,
            "local_search_calls": self.calls,
            "elapsed_s": self.elapsed,
            "model_file": self.model_file,
            "database": self.db.to_json(),
            "metrics": self.metrics,
        }
        write_json(self.out / "state.json", state)
        if old_model and old_model != self.model_file:
            (self.out / old_model).unlink(missing_ok=True)
        write_csv(self.out / "metrics.csv", self.metrics)

    def plot(self) -> None:
        """metrics.png: drawn when the run stops (drawing every round costs more than a round
        of a small problem)."""
        if self.metrics:
            title = f"{self.config.mode}: {self.problem.name}, n={self.config.n}"
            plot_metrics(self.out / "metrics.png", self.metrics, title, self.problem.optimum())

    def load(self) -> None:
        """The state of the last finished round; a ``state.json`` that does not parse or lacks
        a field, or a model file that does not load, is a ValueError naming the file."""
        path = self.out / "state.json"
        state = read_json(path)
        try:
            self.round = int(state["round"])
            self.calls = int(state["local_search_calls"])
            self.elapsed = float(state["elapsed_s"])
            self.db = Database.from_json(state["database"])
            self.metrics = list(state["metrics"])
            self.model_file = state["model_file"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path} does not hold a PatternBoost state ({type(exc).__name__}: "
                             f"{exc}); expected the round, local_search_calls, elapsed_s, "
                             "model_file, database and metrics a run saves") from exc
        if self.model_file is not None:
            self._ensure_model()
            weights = load_weights(self.out / self.model_file)
            try:
                self.model.load_state_dict(weights)
            except RuntimeError as exc:  # missing, extra or misshapen tensors
                raise ValueError(f"{self.out / self.model_file} does not hold this run's "
                                 f"model ({exc})") from exc

    def _ensure_model(self) -> None:
        if self.model is None:
            from .model import build_model

            self.model = build_model(self.problem.vocab_size, self.problem.max_length,
                                     self.config.model, self.config.seed)

    # ---------------------------------------------------------------- one round
    def _merge(self, results) -> tuple[int, list[float]]:
        new = 0
        scores = []
        for tokens, score, key, *valid in results:  # valid: given by global-only samples
            scores.append(score)
            new += self.db.add(key, score, tokens, valid[0] if valid else True)
        self.db.prune()
        return new, scores

    def step(self, executor) -> dict[str, Any]:
        cfg, r = self.config, self.round + 1
        started = time.perf_counter()
        samples, invalid, loss = 0, 0, None
        reasons: dict[str, int] = {}  # why samples did not decode, with counts
        if r == 0 or not cfg.builds_model:
            count = cfg.initial if r == 0 else cfg.samples
            results = run_local_searches(self.problem, [None] * count, seed=cfg.seed, stage=r,
                                         executor=executor, chunk_size=cfg.chunk_size)
            self.calls += count
        else:
            import torch

            from .model import sample_sequences, train_on_sequences

            self._ensure_model()
            gen = torch.Generator().manual_seed(_round_seed(cfg.seed, r))
            torch.manual_seed(_round_seed(cfg.seed, r))
            train = [list(e.tokens) for e in self.db.top(cfg.keep)]
            loss = train_on_sequences(self.model, train, self.special, steps=cfg.train_steps,
                                      batch_size=cfg.batch_size, lr=cfg.lr,
                                      weight_decay=cfg.weight_decay, generator=gen)
            raw = sample_sequences(self.model, cfg.samples, self.problem.max_length,
                                   self.special, temperature=cfg.temperature, top_k=cfg.top_k,
                                   generator=gen)
            decoded = []
            for seq in raw:
                if isinstance(seq, str):
                    reasons[seq] = reasons.get(seq, 0) + 1
                    continue
                try:
                    decoded.append((seq, self.problem.decode(seq)))
                except DecodeError as err:
                    reasons[str(err)] = reasons.get(str(err), 0) + 1
            samples, invalid = len(raw), len(raw) - len(decoded)
            if cfg.mode == "patternboost":
                results = run_local_searches(self.problem, [s for s, _ in decoded],
                                             seed=cfg.seed, stage=r, executor=executor,
                                             chunk_size=cfg.chunk_size)
                self.calls += len(decoded)
            else:  # global-only: the samples as they are
                from .database import key_to_str

                results = [(self.problem.encode(obj), self.problem.score(obj),
                            key_to_str(self.problem.key(obj)), self.problem.is_valid(obj))
                           for _, obj in decoded]
        new, scores = self._merge(results)
        self.round = r
        self.elapsed += time.perf_counter() - started
        top = self.db.top(cfg.keep)
        row = {
            "round": r,
            "mode": cfg.mode,
            "local_search_calls": self.calls,
            "elapsed_s": round(self.elapsed, 3),
            "samples": samples,
            "invalid_fraction": invalid / samples if samples else 0.0,
            "invalid_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:5]),
            "new_objects": new,
            "round_best": max(scores, default=None),
            "round_mean": _mean(scores),
            "best": self.db.best(),
            "train_mean": _mean([e.score for e in top]),
            "train_loss": loss,
        }
        self.metrics.append(row)
        return row

    def finished(self) -> bool:
        cfg = self.config
        best = self.db.best()
        return (
            self.round >= cfg.rounds
            or (cfg.time_limit_s is not None and self.elapsed >= cfg.time_limit_s)
            or (cfg.stop_at is not None and best >= cfg.stop_at)
            or (cfg.max_local_search_calls is not None
                and self.calls >= cfg.max_local_search_calls)
        )


def _check_resumable(config: PatternBoostConfig, out: Path) -> None:
    """Refuse a folder whose run was made with another config (the fields of
    RESUMABLE_CHANGES aside); reads only, so a refusal leaves the folder as it was."""
    saved_path = out / "config.json"
    if (out / "state.json").exists() and not saved_path.exists():
        raise ValueError(f"{out} holds a PatternBoost state.json but no config.json, so the run "
                         "it continues cannot be checked against the config given; restore "
                         "config.json or use a new folder")
    if (out / "state.json").exists():
        data = read_json(saved_path)
        try:
            saved = PatternBoostConfig.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{saved_path} does not hold a config of a PatternBoost run "
                             f"({exc}); expected the config.json the run wrote (its problem "
                             "registered); restore it or use a new folder") from exc
        changed = config.resume_differences(saved)
        if changed:
            values = ", ".join(f"{name}: {before!r} -> {after!r}"
                               for name, (before, after) in changed.items())
            raise ValueError(f"{out} holds a run with a different config (fields "
                             f"{list(changed)}; saved -> given: {values}); use a new folder, "
                             "or change only the stopping fields")


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _sigterm_as_interrupt() -> Any:
    """Treat SIGTERM like Ctrl-C during a run (so the worker pool is shut down); returns the
    handler to restore, or None off the main thread, where signals cannot be handled."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


def run_patternboost(
    config: PatternBoostConfig, out_dir: str | Path, *, executor: Executor | None = None
) -> PatternBoostResult:
    """Run (or resume) PatternBoost or a baseline in `out_dir` until a stopping rule holds.

    Rounds: 0 builds the initial database; each later round trains, samples, repairs and
    merges (003 §3.3). Ctrl-C (or SIGTERM) stops the run: the folder keeps the last finished
    round and the run resumes from it. `executor`: a process pool to reuse across
    runs (it is left open); by default one of `config.workers` processes is made and closed.
    """
    from tqdm.auto import tqdm

    config.check_runnable()  # before the folder is written
    out = Path(out_dir)
    if not (out / "state.json").exists() and (
            other := training_run_files(out) or search_run_files(out, PROGRAM_SEARCH_FILES)):
        kind = "a program search" if other[0] in PROGRAM_SEARCH_FILES else "a training run"
        raise FileExistsError(
            f"{out} holds {kind} ({', '.join(other)}), not a PatternBoost run's; "
            "PatternBoost writes config.json, state.json and metrics.csv there, so choose "
            "another folder")
    _check_resumable(config, out)
    run = _Run(config, out)
    if (out / "state.json").exists():
        run.load()  # a state that does not load is refused before config.json is rewritten
    # every check passed: the folder is written from here on (a refused run leaves none, or
    # the folder as it was)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config.to_dict())
    if run.metrics:
        # state.json is written before metrics.csv: a run stopped between the two leaves the
        # CSV a round behind, and a resumed run that is already finished saves no round
        write_csv(out / "metrics.csv", run.metrics)
    interrupted = False
    own_executor = executor is None
    if own_executor:
        executor = make_executor(config.workers)
    # with a huge round count the run ends by another rule: show a count, not a fraction
    total = config.rounds + 1 if config.rounds < 10_000 else None
    bar = tqdm(total=total, initial=run.round + 1, disable=not config.progress,
               desc=f"{config.mode} {config.problem} n={config.n}", unit="round")
    previous_handler = _sigterm_as_interrupt()
    try:
        while run.round < 0 or not run.finished():
            row = run.step(executor)
            run.save()
            bar.update(1)
            mean = row["round_mean"]
            bar.set_postfix(best=row["best"], mean="-" if mean is None else f"{mean:.1f}",
                            invalid=f"{row['invalid_fraction']:.2f}")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
        bar.close()
        run.plot()
        if own_executor and executor is not None:
            executor.shutdown(wait=not interrupted, cancel_futures=True)
    best = run.db.best_entry()  # the best object that satisfies the constraint
    return PatternBoostResult(
        out_dir=out,
        problem=run.problem,
        best_score=best.score if best else math.nan,
        best_tokens=list(best.tokens) if best else [],
        rounds_done=run.round,
        metrics=run.metrics,
        interrupted=interrupted,
    )
