"""Problem options from the API and the command line: seeds, a size given twice, and resuming a
folder with the problem it was started with (compared as built, not as spelled)."""

import concurrent.futures as cf
import json
import re

import numpy as np
import pytest

from graded.cli import main
from graded.search.program.database import DatabaseConfig
from graded.search.program.engine import SearchConfig, run_search
from graded.search.program.offline import OfflineProposer
from graded.search.program.problem import Problem, get_problem

SKELETON = '''
def solve(x):
    return float(value(x))


# EVOLVE-BLOCK-START
def value(x):
    return 0.0
# EVOLVE-BLOCK-END
'''


def closeness(x, artefact):
    return -abs(artefact - x)


@pytest.mark.parametrize("name,options,message", [
    # numpy's own refusals named neither the option nor the value (matmul: the initial program
    # crashed with "expected non-negative integer"; bin-packing 1.5: a TypeError traceback)
    ("matmul", {"seed": -1}, "matmul seed=-1; expected an integer >= 0"),
    ("matmul", {"seed": 1.5}, "matmul seed=1.5; expected an integer >= 0"),
    ("matmul", {"seed": True}, "matmul seed=True; expected an integer >= 0"),
    ("bin-packing", {"dataset": "weibull5k", "seed": -1, "evolve_instances": 1,
                     "train_items": 10}, "bin-packing seed=-1; expected an integer >= 0"),
    ("bin-packing", {"dataset": "weibull5k", "seed": 1.5, "evolve_instances": 1,
                     "train_items": 10}, "bin-packing seed=1.5; expected an integer >= 0"),
    ("bin-packing", {"evolve_instances": True}, "evolve_instances=True; expected an integer"),
    # named as weibull_instances' own argument, "items=-1", which no option is called
    ("bin-packing", {"dataset": "weibull5k", "train_items": -1},
     "bin-packing train_items=-1; expected an integer >= 1"),
])
def test_a_bad_seed_or_count_of_a_shipped_problem_is_refused_naming_it(name, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        get_problem(name, **options)


def test_a_good_matmul_seed_reaches_the_candidates_input():
    assert get_problem("matmul", seed=7).inputs[0]["seed"] == 7


@pytest.mark.parametrize("flags,named", [
    (["--n", "3", "--option", "n=5"], "--option n=5 and --n 3"),
    (["--option", "n=3", "--option", "n=5"], "--option n=3 and --option n=5"),
])
def test_a_problem_option_given_twice_is_refused_naming_both(tmp_path, capsys, flags, named):
    # the last one won silently: --n 3 --option n=5 searched F_3^3
    out = tmp_path / "run"
    assert main(["search", "program", "--budget", "1", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the problem option n is given twice, {named}; expected one value" in err
    assert not out.exists()


def _toy(inputs):
    return Problem("toy", SKELETON, "solve", inputs, closeness, time_limit_s=5.0,
                   memory_mb=512)


def test_resuming_with_another_problem_of_the_same_name_is_refused(tmp_path):
    # the Python API records no problem options: a folder evolved on the inputs (1, 2) was
    # resumed on (1, 30), its scores kept beside the new ones (cap-set n=3 resumed as n=2
    # reported a best of 8 in F_3^2, whose largest cap set has 4)
    out = tmp_path / "run"
    config = SearchConfig(budget=1, workers=1, seed=0, database=DatabaseConfig(islands=1))
    with cf.ThreadPoolExecutor(1) as pool:
        first = run_search(_toy((1, 2)), OfflineProposer(seed=0), config, out=out,
                           executor=pool)
        assert first.database.islands[0].best.signature is not None
        saved = (out / "database.json").read_text()
        more = SearchConfig(budget=2, workers=1, seed=0, database=DatabaseConfig(islands=1))
        with pytest.raises(ValueError, match=r"the problem built differs in \['inputs'\]"):
            run_search(_toy((1, 30)), OfflineProposer(seed=0), more, out=out, resume=True,
                       executor=pool)
        assert (out / "database.json").read_text() == saved
        # the same problem resumes
        again = run_search(_toy((1, 2)), OfflineProposer(seed=0), more, out=out, resume=True,
                           executor=pool)
    assert again.evaluations == 2


def test_a_folder_of_an_older_run_without_a_problem_spec_still_compares_options(tmp_path):
    out = tmp_path / "run"
    config = SearchConfig(budget=1, workers=1, seed=0, database=DatabaseConfig(islands=1),
                          problem_options={"inputs": [1, 2]})
    with cf.ThreadPoolExecutor(1) as pool:
        run_search(_toy((1, 2)), OfflineProposer(seed=0), config, out=out, executor=pool)
        doc = json.loads((out / "config.json").read_text())
        del doc["problem_spec"]  # as the runs written before it
        (out / "config.json").write_text(json.dumps(doc))
        other = SearchConfig(budget=2, workers=1, seed=0, database=DatabaseConfig(islands=1),
                             problem_options={"inputs": [1, 3]})
        with pytest.raises(ValueError, match=r"differs in \['problem_options'\]"):
            run_search(_toy((1, 2)), OfflineProposer(seed=0), other, out=out, resume=True,
                       executor=pool)
        same = SearchConfig(budget=2, workers=1, seed=0, database=DatabaseConfig(islands=1),
                            problem_options={"inputs": [1, 2]})
        assert run_search(_toy((1, 2)), OfflineProposer(seed=0), same, out=out, resume=True,
                          executor=pool).evaluations == 2


def test_the_cli_resumes_a_default_size_given_explicitly_and_refuses_another(tmp_path, capsys):
    # cap-set's n defaults to 4: a run started without --n was refused on resume with --n 4
    # ("problem_options: {} -> {'n': 4}"), though both build the same problem
    out = tmp_path / "run"
    base = ["search", "program", "--problem", "cap-set", "--workers", "1", "--islands", "1",
            "--out", str(out)]
    assert main([*base, "--budget", "1"]) == 0
    assert main([*base, "--budget", "2", "--n", "4", "--resume"]) == 0
    rows = (out / "evaluations.csv").read_text().splitlines()
    assert len(rows) == 1 + 2
    capsys.readouterr()
    assert main([*base, "--budget", "3", "--n", "3", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "problem_options: {} -> {'n': 3}" in err
    assert "the problem built differs in ['inputs']" in err


@pytest.mark.parametrize("group,values,named", [
    ("inputs", (np.int64(3),), "inputs[0] = np.int64(3) is not JSON"),
    ("held_out", (1, {"a": np.arange(2)}), "held_out[1] = {'a': array([0, 1])} is not JSON"),
    ("prechecks", ({1, 2},), "prechecks[0] = {1, 2} is not JSON"),
])
def test_inputs_the_sandbox_cannot_send_are_refused_when_the_problem_is_built(group, values,
                                                                               named):
    # a NumPy integer among the inputs stopped the search at its first evaluation with
    # "TypeError: Object of type int64 is not JSON serializable", naming no input
    fields = {"inputs": (1,), group: values}
    with pytest.raises(ValueError, match=re.escape(f"problem 'toy': {named}")):
        Problem("toy", SKELETON, "solve", score=closeness, **fields)
    assert json.loads(json.dumps(_toy((1, 2.5, [3], {"k": None})).inputs)) == [1, 2.5, [3],
                                                                                {"k": None}]
