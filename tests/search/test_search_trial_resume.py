"""Run folders that were damaged between runs, and verifiers that raise: a resume refuses a state
file that does not load by naming it (the folder left as it was) or rebuilds what it can; a
verifier's exception fails the candidate, not the search."""

import concurrent.futures as cf
import csv
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "program"))

from test_engine import SKELETON, toy_problem
from test_pb_engine import tiny

from graded.cli import main
from graded.search.patternboost.engine import run_patternboost
from graded.search.program import engine
from graded.search.program.database import DatabaseConfig
from graded.search.program.engine import SearchConfig, run_search
from graded.search.program.evaluate import evaluate
from graded.search.program.offline import OfflineProposer
from graded.search.program.problem import Problem
from graded.search.program.program import parse_skeleton

FIELDS = ["index", "island", "score", "failure", "reason", "seconds", "operator", "best_score",
          "island_best"]


def search(folder, budget, resume=False, problem=None):
    config = SearchConfig(budget=budget, workers=2, seed=3,
                          database=DatabaseConfig(islands=2, reset_period=6))
    with cf.ThreadPoolExecutor(2) as pool:
        return run_search(problem or toy_problem(), OfflineProposer(seed=3), config,
                          out=folder, resume=resume, executor=pool)


@pytest.fixture(scope="module")
def finished_search(tmp_path_factory):
    folder = tmp_path_factory.mktemp("search") / "run"
    search(folder, 4)
    return folder


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("damage", [
    lambda text: text[:len(text) // 2],  # cut short
    lambda text: "",  # emptied
    lambda text: "[]",  # JSON, not a state
    lambda text: '{"database": {}}',  # a state without its fields
])
def test_a_damaged_database_json_is_refused_by_name_and_the_folder_left_as_it_was(
        finished_search, tmp_path, damage):
    folder = tmp_path / "run"
    shutil.copytree(finished_search, folder)
    state = folder / "database.json"
    state.write_text(damage(state.read_text()))
    before = snapshot(folder)
    with pytest.raises(ValueError, match=r"database\.json does not hold a program search's state"):
        search(folder, 8, resume=True)
    assert snapshot(folder) == before  # run.log included: nothing appended


def test_the_cli_refuses_a_damaged_state_in_one_line_naming_the_file(tmp_path, capsys):
    folder = tmp_path / "run"
    args = ["search", "program", "--problem", "cap-set", "--n", "3", "--budget", "2",
            "--islands", "2", "--out", str(folder)]
    assert main(args) == 0
    (folder / "database.json").write_text('{"database": [')
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(folder / "database.json") in err


def test_a_resume_with_no_evaluation_left_writes_the_best_program_again(finished_search,
                                                                        tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(finished_search, folder)
    written = (folder / "best.py").read_text()
    (folder / "best.py").unlink()  # or left stale by a second Ctrl-C just after the state
    result = search(folder, 4, resume=True)
    assert result.evaluations == 4
    assert (folder / "best.py").read_text() == written


def test_resume_without_a_run_folder_is_refused_naming_out():
    with pytest.raises(ValueError, match="resume=True with out=None; expected out"):
        run_search(toy_problem(), OfflineProposer(seed=3), SearchConfig(budget=2), resume=True)


def test_a_config_json_that_is_not_json_is_refused_by_name(finished_search, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(finished_search, folder)
    (folder / "config.json").write_text('{"problem": ')
    with pytest.raises(ValueError, match=r"config\.json is not a readable JSON file"):
        search(folder, 8, resume=True)


def test_a_resume_whose_evaluations_csv_was_deleted_logs_under_its_header(finished_search,
                                                                           tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(finished_search, folder)
    (folder / "evaluations.csv").unlink()
    search(folder, 8, resume=True)
    with open(folder / "evaluations.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == FIELDS
    assert [int(r[0]) for r in table[1:]] == [5, 6, 7, 8]  # the resumed run's rows


def test_dropping_rows_past_the_state_leaves_the_log_whole_when_the_rewrite_fails(
        tmp_path, monkeypatch):
    path = tmp_path / "evaluations.csv"
    text = ",".join(FIELDS) + "\r\n" + "".join(
        f"{i},0,-1.0,,,0.1,constant,-1.0,-1.0\r\n" for i in range(1, 7))
    path.write_bytes(text.encode())

    class Interrupted:  # a Ctrl-C while the kept rows are written
        def __init__(self, *args, **kwargs):
            pass

        def writerows(self, rows):
            raise KeyboardInterrupt

    monkeypatch.setattr(engine.csv, "writer", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine._resume_log(path, 4)  # rows 5 and 6 were logged after the last saved state
    assert path.read_bytes() == text.encode()  # the old file, not a truncated one


def verifier_problem(verifier):
    return Problem("toy", SKELETON, "solve", (1, 2), verifier, time_limit_s=5.0, memory_mb=512)


@pytest.mark.parametrize("error", [IndexError("list index out of range"),
                                   ValueError("invalid literal for int()"),
                                   TypeError("object of type 'float' has no len()")])
def test_a_verifier_that_raises_fails_the_candidate_as_invalid_naming_the_exception(error):
    def verifier(x, artefact):
        raise error

    program = parse_skeleton(SKELETON).initial
    result = evaluate(verifier_problem(verifier), program, isolation="none")
    assert result.failure == "invalid" and result.score is None
    assert result.reason == f"the verifier raised {type(error).__name__}: {error}"


def test_a_search_whose_verifier_raises_on_some_artefacts_runs_to_its_budget(tmp_path):
    def verifier(x, artefact):  # written for the initial program's 0.0 only
        return {0.0: -10.0}[artefact]

    result = search(tmp_path / "run", 6, problem=verifier_problem(verifier))
    assert result.evaluations == 6 and result.best.score == -10.0
    with open(tmp_path / "run" / "evaluations.csv", newline="") as f:
        reasons = [r["reason"] for r in csv.DictReader(f) if r["failure"] == "invalid"]
    assert reasons  # (seed 3: two children return -1.0 and 0.5)
    assert all(r.startswith("the verifier raised KeyError") for r in reasons)


@pytest.fixture(scope="module")
def finished_patternboost(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pb") / "run"
    run_patternboost(tiny(rounds=1, workers=1), folder)
    return folder


@pytest.mark.parametrize("name, damage, message", [
    ("state.json", lambda data: data[:len(data) // 2], "state.json is not a readable JSON file"),
    ("state.json", lambda data: b"", "state.json is not a readable JSON file"),
    ("state.json", lambda data: b"[]", "state.json does not hold a PatternBoost state"),
    ("state.json", lambda data: b'{"round": 1}', "state.json does not hold a PatternBoost state"),
    ("model-0001.safetensors", lambda data: data[:100],
     "model-0001.safetensors is not a readable safetensors file"),
])
def test_a_damaged_patternboost_state_is_refused_by_name_and_the_folder_left_as_it_was(
        finished_patternboost, tmp_path, name, damage, message):
    folder = tmp_path / "run"
    shutil.copytree(finished_patternboost, folder)
    (folder / name).write_bytes(damage((folder / name).read_bytes()))
    before = snapshot(folder)
    with pytest.raises(ValueError, match=message):
        run_patternboost(tiny(rounds=2, workers=1), folder)
    assert snapshot(folder) == before


def test_a_patternboost_state_without_its_config_is_refused_not_resumed_with_another(
        finished_patternboost, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(finished_patternboost, folder)
    (folder / "config.json").unlink()
    before = snapshot(folder)
    with pytest.raises(ValueError, match=r"state\.json but no config\.json"):
        run_patternboost(tiny(rounds=2, workers=1, keep=8), folder)  # another keep
    assert snapshot(folder) == before


def test_a_patternboost_seed_torch_cannot_take_is_refused_before_the_run_folder(tmp_path):
    # 2**64 ran round 0, wrote the folder, then failed in torch.manual_seed with "Overflow
    # when unpacking long long" at every resume
    with pytest.raises(ValueError, match=r"seed=18446744073709551616 is invalid: expected an "
                                         r"integer >= 0 and < 2\*\*64"):
        run_patternboost(tiny(rounds=1, workers=1, seed=2**64), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    tiny(seed=2**64 - 1)  # the largest seed torch takes


HANGING_SEARCH = f'''
import multiprocessing, sys, time
sys.path.insert(0, {str(Path(__file__).parent / "program")!r})
from test_engine import SKELETON
from graded.search.program.engine import SearchConfig, run_search
from graded.search.program.offline import OfflineProposer
from graded.search.program.problem import Problem


def verifier(x, artefact):  # the initial program is scored in the parent; others hang
    if multiprocessing.parent_process() is not None:
        time.sleep(120)
    return -abs(artefact - 10.0)


if __name__ == "__main__":
    problem = Problem("toy", SKELETON, "solve", (1, 2), verifier, time_limit_s=5.0,
                      memory_mb=512)
    run_search(problem, OfflineProposer(seed=3), SearchConfig(budget=8, seed=3),
               out=sys.argv[1])
'''


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_a_second_sigint_aborts_at_once_while_an_evaluation_hangs(tmp_path):
    import contextlib
    import os
    import signal
    import subprocess
    import time

    script = tmp_path / "hanging.py"
    script.write_text(HANGING_SEARCH)
    folder = tmp_path / "run"
    with open(tmp_path / "output", "wb") as output:  # not a pipe the workers would hold
        child = subprocess.Popen([sys.executable, str(script), str(folder)], stdout=output,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (folder / "run.log").exists() or "initial program" not in (
                folder / "run.log").read_text():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(3)  # the first round's evaluations are in the verifier
        child.send_signal(signal.SIGINT)
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        start = time.monotonic()
        child.wait(timeout=40)  # the old code waited for the verifiers: 120 s
        assert time.monotonic() - start < 20
    finally:
        with contextlib.suppress(ProcessLookupError):  # the run, its workers, their children
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode != 0
    assert "interrupted before the first round finished" in (folder / "run.log").read_text()
