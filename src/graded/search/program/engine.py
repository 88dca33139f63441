"""The search loop: sample parents, propose, evaluate in parallel, register; a resumable run folder.

The loop works in rounds of ``workers`` proposals. A round's proposals are drawn from the
database as it stood after the round before last, on a proposer thread, while the previous
round's programs are being evaluated, so proposer calls (e.g. to a language model) overlap with
evaluations. Evaluations run through a :class:`concurrent.futures.Executor` (a local process
pool by default; a ``dask.distributed`` client's executor for clusters) and are registered in
the order they were proposed, so a run is a function of its seed and not of timing: stopping
and resuming gives the same run as no interruption.

The run folder holds ``config.json``, ``database.json`` (the whole state, written atomically
after every round), ``evaluations.csv`` (every evaluation: index, island, score, failure,
reason, seconds, operator, best so far), ``best.py`` (the best program, assembled),
``best_score.png`` (best score against evaluations, per island) and ``run.log``. Nothing is
written before every check has passed, those of the database on the initial program
included: a refused run leaves no folder, or the folder as it was.
"""

from __future__ import annotations

import concurrent.futures as cf
import csv
import io
import json
import multiprocessing
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from graded._io import atomic_write_text
from graded._processes import pool_workers
from graded.search.program.database import DatabaseConfig, ProgramsDatabase
from graded.search.program.evaluate import Evaluation, evaluate
from graded.search.program.problem import Problem, problem_spec
from graded.search.program.program import Program, check_seed, parse_skeleton
from graded.search.program.sandbox import detect_isolation
from graded.train.runs import PATTERNBOOST_FILES, search_run_files, training_run_files
from graded.train.signals import StopSignals

__all__ = ["PARENT_DRAWS", "NoNewProgram", "Proposer", "SearchConfig", "SearchResult",
           "SearchRunExists", "run_search"]

_CSV_FIELDS = ("index", "island", "score", "failure", "reason", "seconds", "operator",
               "best_score", "island_best")


class SearchRunExists(FileExistsError):
    """The run folder already holds a program search (``folder``), and resume was not asked
    for: the command line words it in its flags."""

    def __init__(self, folder: Path) -> None:
        super().__init__(f"{folder} already holds a program search run; pass resume=True to "
                         "continue it or choose another folder")
        self.folder = folder


class NoNewProgram(RuntimeError):
    """A proposer found no new valid program from the parents it was given (e.g. every
    variation of a program whose block is ``pass`` was seen or invalid): the search draws
    other parents."""


#: How many draws of parents one proposal may take when the proposer finds no new program
#: from them (:class:`NoNewProgram`) before the run stops with an error.
PARENT_DRAWS = 20


class Proposer(Protocol):
    """Makes a new program from a prompt's parents (sorted by increasing score) and its text;
    raises :class:`NoNewProgram` when those parents give none."""

    name: str

    def propose(self, parents: list[Program], prompt: str = "") -> tuple[Program, str]: ...

    def state(self) -> dict: ...

    def load_state(self, state: dict) -> None: ...


@dataclass(frozen=True)
class SearchConfig:
    budget: int = 200
    workers: int = 2
    seed: int = 0
    isolation: str = "auto"
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    problem_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("budget", "workers"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name}={value!r}; expected an integer >= 1")
        check_seed(self.seed)
        if self.isolation not in ("auto", "require", "none"):  # else refused in each worker
            raise ValueError(f"isolation={self.isolation!r}; expected 'auto', 'require' or "
                             "'none'")


@dataclass
class SearchResult:
    best: Evaluation
    evaluations: int
    failures: dict[str, int]
    folder: Path | None
    database: ProgramsDatabase
    stopped: bool = False


def _in_background(fn, *args) -> cf.Future:
    """``fn(*args)`` on a daemon thread: a second Ctrl-C aborts at once, without waiting for a
    proposer's slow request (a ThreadPoolExecutor's threads are joined at exit)."""
    future: cf.Future = cf.Future()

    def work() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # handed to whoever waits on the future
                future.set_exception(e)

    threading.Thread(target=work, name="proposer", daemon=True).start()
    return future


def _noop() -> None:
    return None


def _ignore_interrupts() -> None:
    # Ctrl-C reaches the whole process group: the parent decides when to stop, not the workers;
    # SIGTERM, which the parent sends them on an abort, ends the evaluation at hand as an
    # exception (the sandbox's child is killed on the way out), as it ends an idle worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _end_evaluation)


def _end_evaluation(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _stop_workers(pool: cf.Executor) -> None:
    """SIGTERM to the worker processes of a local pool: an abort does not wait for the
    evaluations under way (a verifier that hangs would hold it for ever, a candidate for its
    time limit)."""
    for process in pool_workers(pool):
        process.terminate()


class _Stop(StopSignals):
    """SIGINT/SIGTERM set ``flag``, which the loop checks between rounds; a second SIGINT
    aborts at once (KeyboardInterrupt)."""

    def on_signal(self, signum: int, first: bool) -> None:
        if self.aborted:
            raise KeyboardInterrupt


def _default_executor(workers: int) -> cf.Executor:
    """A local process pool whose workers are forked before any thread of the loop starts."""
    pool = cf.ProcessPoolExecutor(max_workers=workers, initializer=_ignore_interrupts,
                                  mp_context=multiprocessing.get_context("fork"))
    for f in [pool.submit(_noop) for _ in range(workers)]:
        f.result()
    return pool


def run_search(problem: Problem, proposer: Proposer, config: SearchConfig, *,
               out: str | Path | None = None, resume: bool = False,
               executor: cf.Executor | None = None, progress: bool = False) -> SearchResult:
    """Runs the search until ``config.budget`` evaluations (see the module docstring).

    With ``resume=True`` the state in ``out`` is loaded and the run continues where it stopped;
    the configuration must be the one the folder was started with, except the budget, which
    may grow. State is saved after every round of ``workers`` evaluations; a run stopped
    between rounds (Ctrl-C, a crash) resumes from the last finished round, and a run whose
    rounds all finish (or whose budget cut its last round short) resumes exactly as if it had
    not stopped. SIGINT or SIGTERM stops the run
    after the current round (its state saved; ``SearchResult.stopped``); a second SIGINT aborts
    at once, leaving the last finished round's state.
    """
    if resume and out is None:
        raise ValueError("resume=True with out=None; expected out, the folder of the run to "
                         "continue")
    skeleton = parse_skeleton(problem.skeleton)
    folder = Path(out) if out is not None else None
    log_lines: list[str] = []
    written = 0  # the lines of log_lines in run.log: none before the folder is written

    def log(message: str) -> None:
        nonlocal written
        log_lines.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}")
        if folder is not None and folder_ready:
            with open(folder / "run.log", "a") as f:
                f.writelines(line + "\n" for line in log_lines[written:])
            written = len(log_lines)

    config_doc = {"problem": problem.name, "proposer": proposer.name,
                  **asdict(config), "database": asdict(config.database),
                  "problem_spec": problem_spec(problem)}
    config_doc["database"]["descriptors"] = list(config.database.descriptors)
    # nothing is written before every check has passed, the database's included (pareto
    # selection of a problem with one score, map-elites descriptors it does not name), so a
    # refused run leaves no folder, or the folder as it was
    folder_ready = resume  # a resumed run's folder is checked to hold a run below
    if folder is not None:
        _check_folder(folder, config_doc, resume)
    # a resumed run's state is read (and refused, naming the file) before run.log is written
    restored = _restore(folder / "database.json", proposer) if resume else None

    isolation = detect_isolation() if config.isolation != "none" else None
    log(f"problem {problem.name}, proposer {proposer.name}, budget {config.budget}, "
        f"workers {config.workers}, isolation: "
        f"{isolation.description if isolation else 'none (isolation=none)'}")

    if restored is not None:
        db, pending, upcoming, best_curve = restored
        earlier_failures = _resume_log(folder / "evaluations.csv", db.evaluations)
        log(f"resumed at {db.evaluations} evaluations")
    else:
        initial = evaluate(problem, skeleton.initial, skeleton=skeleton,
                           isolation=config.isolation)
        db = ProgramsDatabase(config.database, initial, seed=config.seed,
                              minimise=problem.minimise)
        pending = []
        upcoming = None
        earlier_failures = {}
        best_curve = []
        if folder is not None:  # every check passed: the run folder is written from here on
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(folder / "config.json", json.dumps(config_doc, indent=2))
            with open(folder / "evaluations.csv", "w", newline="") as f:
                csv.writer(f).writerow(_CSV_FIELDS)
            folder_ready = True
        log(f"initial program: score {initial.score}")

    own_executor = executor is None
    pool = executor or _default_executor(config.workers)
    failures: dict[str, int] = dict(earlier_failures)  # the whole run's, resumed or not
    bar = _progress(progress, config.budget, db.evaluations)

    def propose_round(n: int) -> list[tuple[int, Program, str]]:
        return [propose_one() for _ in range(n)]

    def propose_one() -> tuple[int, Program, str]:
        # parents that give nothing new (a database of "pass" blocks, say) are drawn again:
        # the run stopped at the first such draw, whatever the other programs could give
        for _ in range(PARENT_DRAWS):
            island, parents = db.sample()
            text = db.prompt(island, parents).text
            try:
                child, op = proposer.propose([p.program for p in parents], text)
            except NoNewProgram as exc:
                last = exc
                continue
            return island, child, op
        raise NoNewProgram(f"the {proposer.name} proposer found no new program in "
                           f"{PARENT_DRAWS} draws of parents (the last: {last}); the "
                           "database's programs give no variation it has not seen")

    def save() -> None:
        if folder is None:
            return
        state = {"database": db.state(), "proposer": proposer.state(),
                 "pending": [[i, list(p.blocks), op] for i, p, op in pending],
                 "upcoming": (None if upcoming is None
                              else [[i, list(p.blocks), op] for i, p, op in upcoming]),
                 "best_curve": best_curve}
        atomic_write_text(folder / "database.json", json.dumps(state))

    stop = _Stop()
    next_round: cf.Future | None = None
    aborted = False
    try:
        stop.__enter__()
        if not pending:
            pending = propose_round(config.workers)
        while db.evaluations < config.budget and pending and not stop.flag:
            round_ = pending[:config.budget - db.evaluations]
            futures = [pool.submit(evaluate, problem, prog, skeleton=skeleton,
                                   isolation=config.isolation, names=db.names)
                       for _, prog, _ in round_]
            # the next round is proposed from the database as it stands now, while this round
            # is evaluated; registration waits for it, so the run does not depend on timing.
            # When the budget cut the current round short, its rest is evaluated later with
            # the next round already proposed (kept in ``upcoming``), as without the cut.
            next_round = (_in_background(propose_round, config.workers)
                          if upcoming is None else None)
            results = [f.result() for f in futures]
            if next_round is not None:
                upcoming = next_round.result()
            rows = []
            for (island, _, op), result in zip(round_, results, strict=True):
                db.register(island, result)
                if result.failure:
                    failures[result.failure] = failures.get(result.failure, 0) + 1
                best = db.best().score
                best_curve.append([db.evaluations, island, best,
                                   db.islands[island].best.score])
                rows.append([db.evaluations, island, result.score, result.failure or "",
                             result.reason[:200], f"{result.elapsed_s:.3f}", op, best,
                             db.islands[island].best.score])
            pending = pending[len(round_):]
            if not pending:
                pending, upcoming = upcoming, None
            if folder is not None:
                with open(folder / "evaluations.csv", "a", newline="") as f:
                    csv.writer(f).writerows(rows)
                save()
                _write_best(folder, skeleton, db)
            if bar is not None:
                bar.update(len(results))
                bar.set_postfix(best=f"{db.best().score:.6g}")
    except KeyboardInterrupt:
        aborted = True
        # the state on disk is the last finished round's: resuming redoes the unfinished one
        if folder is not None and not (folder / "database.json").exists():
            log("interrupted before the first round finished: nothing to resume; start the "
                "run again (without --resume)")
        else:
            log(f"interrupted at {db.evaluations} evaluations; the state of the last finished "
                "round is saved, continue with --resume")
        raise
    finally:
        stop.__exit__()
        if next_round is not None and not aborted:
            cf.wait([next_round])  # (an abort leaves a slow proposer behind, on a daemon thread)
        if own_executor:
            if aborted:
                _stop_workers(pool)
            pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
    if folder is not None:  # again at the end: a resume with no round left rebuilds them too
        _write_best(folder, skeleton, db)
        _plot(folder, best_curve, len(db.islands))
    if stop.flag:
        log(f"stopped by a signal after {db.evaluations} evaluations (a finished round); "
            "continue with --resume")
    else:
        log(f"finished: {db.evaluations} evaluations, best score {db.best().score}, "
            f"failures {failures}")
    return SearchResult(db.best(), db.evaluations, failures, folder, db, stopped=stop.flag)


def _check_folder(folder: Path, config_doc: dict[str, Any], resume: bool) -> None:
    """Refuse ``folder`` before anything is written to it: a resume needs a run there made with
    ``config_doc`` (the budget aside); a new run needs a folder (or a new path) that holds no
    run, of this search or of another."""
    state_path = folder / "database.json"
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder} is a file; expected a folder for the run (or a new "
                              "path)")
    if resume:
        if not state_path.exists():
            raise FileNotFoundError(f"--resume: {state_path} does not exist")
        try:
            saved = json.loads((folder / "config.json").read_text())
            if not isinstance(saved, dict):
                raise ValueError(f"a JSON {type(saved).__name__}, not an object")
        except ValueError as exc:
            raise ValueError(f"--resume: {folder / 'config.json'} is not a readable JSON file "
                             f"({exc}); expected the config.json a run writes") from exc
        current = json.loads(json.dumps(config_doc))
        saved.pop("budget", None)
        current.pop("budget", None)
        built = []  # the fields of the problem built that differ
        given_spec = current.pop("problem_spec")
        if "problem_spec" in saved:  # (folders of older runs have none: options compared)
            spec = saved.pop("problem_spec")
            spec = spec if isinstance(spec, dict) else {}  # damaged: every field differs
            built = sorted(k for k in {*spec, *given_spec} if spec.get(k) != given_spec.get(k))
            if not built:  # options that build the same problem: --n 4 and cap-set's default
                saved.pop("problem_options", None)
                current.pop("problem_options", None)
        if saved != current or built:
            diff = sorted(k for k in current if saved.get(k) != current[k])
            values = "; ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in diff)
            why = [f"differs in {diff}; saved -> given: {values}"] if diff else []
            why += [f"the problem built differs in {built}"] if built else []
            raise ValueError(f"{folder} was started with a different configuration "
                             f"({'; '.join(why)}); resume with the same settings")
    elif state_path.exists():
        raise SearchRunExists(folder)
    elif other := (training_run_files(folder) or search_run_files(folder, PATTERNBOOST_FILES)):
        kind = "a training run" if other[0] not in PATTERNBOOST_FILES else "a PatternBoost run"
        raise FileExistsError(
            f"{folder} holds {kind} ({', '.join(other)}), not a program search's; "
            "a search writes config.json, run.log and its state there, so choose another "
            "folder")


def _restore(path: Path, proposer: Proposer) -> tuple[ProgramsDatabase, list, list | None,
                                                      list]:
    """The database, pending round, next round and best-score curve saved in ``path``, the
    proposer's state loaded into ``proposer``; a file that does not parse or lacks a field is a
    ValueError that names it."""
    try:
        state = json.loads(path.read_text())
        db = ProgramsDatabase.from_state(state["database"])
        proposer.load_state(state["proposer"])
        pending = [(int(i), Program(tuple(b)), op) for i, b, op in state["pending"]]
        # a round cut short by the budget keeps the next round, already proposed (older
        # folders have none saved: it is proposed afresh)
        upcoming = ([(int(i), Program(tuple(b)), op) for i, b, op in state["upcoming"]]
                    if state.get("upcoming") is not None else None)
        best_curve = list(state["best_curve"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ValueError(f"--resume: {path} does not hold a program search's state "
                         f"({type(exc).__name__}: {exc}); expected the database.json a run "
                         "writes (start a new run in another folder)") from exc
    return db, pending, upcoming, best_curve


def _resume_log(path: Path, evaluations: int) -> dict[str, int]:
    """Drops the rows past the saved state's ``evaluations`` (a run killed between appending a
    round's rows and saving its state), so that the resumed run does not log them twice;
    returns the failures counted by reason in the rows kept. The file is rewritten atomically,
    with its header row (also where the file or its header was lost: the resumed run's rows
    then follow the header)."""
    table = []
    if path.exists():
        with open(path, newline="") as f:
            table = list(csv.reader(f))
    rows = [r for r in table if r and r[0].isdigit() and int(r[0]) <= evaluations]
    kept = [list(_CSV_FIELDS), *rows]
    if kept != table:
        text = io.StringIO(newline="")
        csv.writer(text).writerows(kept)
        atomic_write_text(path, text.getvalue())
    column = _CSV_FIELDS.index("failure")
    failures: dict[str, int] = {}
    for row in rows:
        if len(row) > column and row[column]:
            failures[row[column]] = failures.get(row[column], 0) + 1
    return failures


def _write_best(folder: Path, skeleton, db: ProgramsDatabase) -> None:
    """``best.py`` (for several files: ``best/`` with each file, and ``best.py`` its main)."""
    best = db.best()
    header = f"# best program: score {best.score}\n"
    source = skeleton.assemble(best.program)
    if isinstance(source, dict):
        for name, text in source.items():
            atomic_write_text(folder / "best" / name, text)
        source = source["main.py"]
    atomic_write_text(folder / "best.py", header + source)


def _plot(folder: Path, curve: list[list[Any]], islands: int) -> None:
    if not curve:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for island in range(islands):
        pts = [(c[0], c[3]) for c in curve if c[1] == island]
        if pts:
            ax.step(*zip(*pts, strict=True), where="post", label=f"island {island}", alpha=0.7)
    ax.step([c[0] for c in curve], [c[2] for c in curve], where="post", color="k",
            label="best overall")
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best score")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "best_score.png", dpi=120)
    plt.close(fig)


def _progress(enabled: bool, total: int, done: int):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, initial=done, unit="eval", desc="program search")
