"""The search loop: runs, improves, writes its run folder, and resumes exactly."""

import concurrent.futures as cf
import csv
import json

import pytest

from graded.search.program.database import DatabaseConfig
from graded.search.program.engine import PARENT_DRAWS, NoNewProgram, SearchConfig, run_search
from graded.search.program.offline import OfflineProposer
from graded.search.program.problem import InvalidArtefact, Problem

SKELETON = '''"""Toy problem: the program returns a number; closer to 10 is better."""


def solve(x):
    return float(value(x))


# EVOLVE-BLOCK-START
def value(x):
    return 0.0
# EVOLVE-BLOCK-END
'''


def closeness(x, artefact):
    if not isinstance(artefact, float):
        raise InvalidArtefact(f"expected a float, got {artefact!r}")
    return -abs(artefact - 10.0)


def toy_problem() -> Problem:
    return Problem("toy", SKELETON, "solve", (1, 2), closeness, time_limit_s=5.0,
                   memory_mb=512)


def config(budget):
    return SearchConfig(budget=budget, workers=2, seed=3,
                        database=DatabaseConfig(islands=2, reset_period=6))


def run(tmp_path, name, budget, resume=False):
    with cf.ThreadPoolExecutor(2) as pool:
        return run_search(toy_problem(), OfflineProposer(seed=3), config(budget),
                          out=tmp_path / name, resume=resume, executor=pool)


def without_timings(x):
    if isinstance(x, dict):
        return {k: without_timings(v) for k, v in x.items() if k != "elapsed_s"}
    if isinstance(x, list):
        return [without_timings(v) for v in x]
    return x


def rows(path):
    with open(path) as f:
        return [(r["index"], r["island"], r["score"], r["failure"], r["operator"])
                for r in csv.DictReader(f)]


def test_search_improves_and_writes_its_folder(tmp_path):
    result = run(tmp_path, "a", 40)
    assert result.evaluations == 40
    assert result.best.score > -10.0  # better than the initial program (value 0 → score -10)
    folder = tmp_path / "a"
    for name in ("config.json", "database.json", "evaluations.csv", "best.py",
                 "best_score.png", "run.log"):
        assert (folder / name).exists(), name
    assert len(rows(folder / "evaluations.csv")) == 40
    assert "def value" in (folder / "best.py").read_text()
    assert "isolation" in (folder / "run.log").read_text()


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_resume_gives_the_same_run_as_no_interruption(tmp_path):
    straight = run(tmp_path, "straight", 24)
    run(tmp_path, "split", 10)
    resumed = run(tmp_path, "split", 24, resume=True)
    assert rows(tmp_path / "straight" / "evaluations.csv") == rows(
        tmp_path / "split" / "evaluations.csv")
    assert straight.best.program == resumed.best.program
    a = json.loads((tmp_path / "straight" / "database.json").read_text())
    b = json.loads((tmp_path / "split" / "database.json").read_text())
    assert without_timings(a) == without_timings(b)  # wall-clock times naturally differ


def test_folder_misuse_is_refused(tmp_path):
    run(tmp_path, "r", 4)
    with pytest.raises(FileExistsError, match="resume"):
        run(tmp_path, "r", 4)
    with pytest.raises(FileNotFoundError):
        run(tmp_path, "missing", 4, resume=True)
    # the refusal names each differing setting with its saved and given values
    with cf.ThreadPoolExecutor(2) as pool, pytest.raises(
            ValueError, match=r"different configuration \(differs in \['seed'\]; saved -> "
                              r"given: seed: \d+ -> 4\)"):
        other = SearchConfig(budget=8, workers=2, seed=4, database=config(4).database)
        run_search(toy_problem(), OfflineProposer(seed=3), other, out=tmp_path / "r",
                   resume=True, executor=pool)


def test_a_folder_holding_a_training_run_is_refused_and_left_as_it_was(tmp_path):
    from graded.train.runs import RunFolder, open_run

    folder = tmp_path / "trained"
    with RunFolder(folder).lock() as trained:  # what the trainer writes before its checkpoints
        open_run(trained, {"task": {"name": "toy"}}, None, existing=False, overwrite=False,
                 entries=["checkpoints", "history.jsonl"])
    (folder / "checkpoints" / "step_10").mkdir(parents=True)
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(FileExistsError, match=r"trained holds a training run \(.*checkpoints"):
        run(tmp_path, "trained", 4)
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_folder_with_only_a_users_own_files_is_accepted(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("my notes")
    result = run(tmp_path, "notes", 4)
    assert result.evaluations == 4
    assert (tmp_path / "notes" / "README.txt").read_text() == "my notes"


@pytest.mark.slow  # a whole search of 3 to 5 s on 2 cores: `pytest -m slow`
def test_failures_are_counted_by_reason(tmp_path):
    result = run(tmp_path, "f", 30)
    assert sum(result.failures.values()) == sum(
        1 for r in rows(tmp_path / "f" / "evaluations.csv") if r[3])


def test_sigterm_stops_after_the_round_and_the_run_resumes(tmp_path):
    import os
    import signal
    import threading

    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        stopped = run(tmp_path, "s", 400)
    finally:
        timer.cancel()
    assert stopped.stopped and 0 < stopped.evaluations < 400
    assert stopped.evaluations % 2 == 0  # whole rounds of two
    assert "stopped by a signal" in (tmp_path / "s" / "run.log").read_text()
    resumed = run(tmp_path, "s", stopped.evaluations + 4, resume=True)
    assert resumed.evaluations == stopped.evaluations + 4 and not resumed.stopped


@pytest.mark.slow  # a whole search of 3 to 5 s on 2 cores: `pytest -m slow`
def test_search_over_a_skeleton_of_several_files(tmp_path):
    files = {"main.py": "import tools\n\n\ndef solve(x):\n    return float(tools.value(x))\n",
             "tools.py": "# EVOLVE-BLOCK-START\ndef value(x):\n    return 0.0\n"
                         "# EVOLVE-BLOCK-END\n"}
    problem = Problem("toy-files", files, "solve", (1, 2), closeness, time_limit_s=5.0,
                      memory_mb=512)
    with cf.ThreadPoolExecutor(2) as pool:
        result = run_search(problem, OfflineProposer(seed=3), config(20), out=tmp_path / "m",
                            executor=pool)
    assert result.evaluations == 20 and result.best.score > -10.0
    assert (tmp_path / "m" / "best" / "tools.py").exists()
    assert "import tools" in (tmp_path / "m" / "best.py").read_text()


@pytest.mark.slow  # a whole search of 3 to 5 s on 2 cores: `pytest -m slow`
def test_resume_after_a_budget_that_cuts_a_round_is_exact(tmp_path):
    # budgets 3 and 7 end in the middle of a round of two: the rest of that round and the
    # round proposed beside it must be the ones an uninterrupted run evaluates
    straight = run(tmp_path, "straight", 10)
    for budget, resume in ((3, False), (7, True), (10, True)):
        resumed = run(tmp_path, "split", budget, resume=resume)
        assert resumed.evaluations == budget
    assert rows(tmp_path / "straight" / "evaluations.csv") == rows(
        tmp_path / "split" / "evaluations.csv")
    assert straight.best.program == resumed.best.program
    a = json.loads((tmp_path / "straight" / "database.json").read_text())
    b = json.loads((tmp_path / "split" / "database.json").read_text())
    assert without_timings(a) == without_timings(b)
    # the failures reported are the whole run's, counted here from its log
    logged = {}
    for r in rows(tmp_path / "split" / "evaluations.csv"):
        if r[3]:
            logged[r[3]] = logged.get(r[3], 0) + 1
    assert logged and resumed.failures == straight.failures == logged


@pytest.mark.slow  # a whole search of 3 to 5 s on 2 cores: `pytest -m slow`
def test_rows_logged_after_the_last_saved_state_are_not_logged_twice(tmp_path):
    # a run killed after appending a round's rows but before saving its state
    straight = run(tmp_path, "straight", 8)
    run(tmp_path, "split", 4)
    log = tmp_path / "split" / "evaluations.csv"
    with open(log) as f:
        lines = f.readlines()
    with open(log, "a") as f:
        f.writelines(line.replace(line.split(",")[0], str(int(line.split(",")[0]) + 2), 1)
                     for line in lines[-2:])  # rows 5 and 6, as the killed round wrote them
    run(tmp_path, "split", 8, resume=True)
    assert rows(log) == rows(tmp_path / "straight" / "evaluations.csv")
    assert [int(r[0]) for r in rows(log)] == list(range(1, 9)) and straight.evaluations == 8


def test_a_second_sigint_aborts_at_once_while_the_proposer_is_slow(tmp_path):
    # a language model that takes 30 s to answer: the first SIGINT asks to stop after the
    # round, the second must abort without waiting for the reply (docs: "a second Ctrl-C at once")
    import os
    import signal
    import threading
    import time

    release = threading.Event()

    class Slow(OfflineProposer):
        calls = 0

        def propose(self, parents, prompt=""):
            Slow.calls += 1
            if Slow.calls == 3:  # the first round (two proposals) comes at once
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGINT)
                release.wait(30)
            return super().propose(parents, prompt)

    start = time.monotonic()
    try:
        with cf.ThreadPoolExecutor(2) as pool, pytest.raises(KeyboardInterrupt):
            run_search(toy_problem(), Slow(seed=3), config(40), out=tmp_path / "slow",
                       executor=pool)
        assert time.monotonic() - start < 15
    finally:
        release.set()
    # stopped in its first round: nothing was saved, and the log does not promise --resume
    assert not (tmp_path / "slow" / "database.json").exists()
    assert "nothing to resume" in (tmp_path / "slow" / "run.log").read_text()


@pytest.mark.slow  # a whole search of 3 to 5 s on 2 cores: `pytest -m slow`
def test_programs_with_other_named_scores_fail_and_pareto_selection_goes_on(tmp_path):
    # a program without the initial program's named score "near" joined the database, and the
    # Pareto front raised KeyError 'near' out of the search
    def named(x, artefact):
        scores = {"close": closeness(x, artefact), "size": abs(artefact)}
        return scores | ({"near": 1.0} if abs(artefact) < 1.0 else {})

    problem = Problem("named", SKELETON, "solve", (1, 2), named, primary="close",
                      time_limit_s=5.0, memory_mb=512)
    cfg = SearchConfig(budget=40, workers=2, seed=3,
                       database=DatabaseConfig(islands=1, selection="pareto"))
    with cf.ThreadPoolExecutor(2) as pool:
        result = run_search(problem, OfflineProposer(seed=3), cfg, out=tmp_path / "n",
                            executor=pool)
    with open(tmp_path / "n" / "evaluations.csv") as f:
        logged = list(csv.DictReader(f))
    refused = [r for r in logged if r["reason"].startswith("the verifier named the scores "
                                                           "['close', 'size'] but")]
    assert refused and all(r["failure"] == "wrong_type" for r in refused)
    assert result.failures["wrong_type"] >= len(refused)
    members = result.database.islands[0].members()
    assert all(sorted(m.scores) == ["close", "near", "size"] for m in members)


def test_a_folder_holding_a_patternboost_run_is_refused_and_left_as_it_was(tmp_path):
    """A PatternBoost run's folder (its state.json, config.json, metrics.csv) is refused: the
    search replaced its config.json, and the PatternBoost run could not be resumed. And
    PatternBoost refuses this search's folder the same way."""
    from graded.search.patternboost import PatternBoostConfig, run_patternboost

    pb = tmp_path / "pb"
    run_patternboost(PatternBoostConfig(
        problem="triangle-free", n=5, problem_options={"bits_per_token": 2}, rounds=0,
        initial=10, keep=8, database_size=10, progress=False), pb)
    before = {p.name: p.read_bytes() for p in pb.iterdir() if p.is_file()}
    with pytest.raises(FileExistsError, match=r"pb holds a PatternBoost run \(state.json\)"):
        run(tmp_path, "pb", 4)
    assert {p.name: p.read_bytes() for p in pb.iterdir() if p.is_file()} == before

    run(tmp_path, "searched", 4)
    searched = tmp_path / "searched"
    before = {p.name: p.read_bytes() for p in searched.iterdir() if p.is_file()}
    with pytest.raises(FileExistsError, match=r"searched holds a program search \(database"):
        run_patternboost(PatternBoostConfig(problem="triangle-free", n=5, rounds=0, initial=10,
                                            keep=8, database_size=10, progress=False), searched)
    assert {p.name: p.read_bytes() for p in searched.iterdir() if p.is_file()} == before


# Parents that give the proposer nothing new: the search draws other parents instead of
# stopping (the offline proposer's RuntimeError used to end run_search uncaught).
class Stuck:
    """The offline proposer, finding nothing new at the calls listed in ``stuck``."""

    name = "stuck"

    def __init__(self, stuck):
        self.inner = OfflineProposer(seed=3)
        self.stuck = set(stuck)
        self.calls = 0

    def propose(self, parents, prompt=""):
        self.calls += 1
        if self.calls in self.stuck:
            raise NoNewProgram(f"nothing new at call {self.calls}")
        return self.inner.propose(parents, prompt)

    def state(self):
        return {"inner": self.inner.state(), "calls": self.calls}

    def load_state(self, state):
        self.inner.load_state(state["inner"])
        self.calls = state["calls"]


def test_parents_that_give_nothing_new_are_drawn_again_and_the_run_completes():
    proposer = Stuck(stuck={2, 3, 7})
    with cf.ThreadPoolExecutor(2) as pool:
        result = run_search(toy_problem(), proposer, config(12), executor=pool)
    assert result.evaluations == 12
    assert proposer.calls >= 12 + 3  # every stuck call was followed by another draw


def test_a_database_that_gives_nothing_new_stops_the_run_naming_the_draws():
    proposer = Stuck(stuck=range(1, 10_000))
    with (cf.ThreadPoolExecutor(2) as pool,
          pytest.raises(NoNewProgram, match=rf"stuck proposer found no new program in "
                                            rf"{PARENT_DRAWS} draws of parents \(the last: "
                                            rf"nothing new at call {PARENT_DRAWS}\)")):
        run_search(toy_problem(), proposer, config(12), executor=pool)


def test_the_offline_proposer_reports_nothing_new_as_no_new_program():
    assert issubclass(NoNewProgram, RuntimeError)  # callers catching RuntimeError still do
