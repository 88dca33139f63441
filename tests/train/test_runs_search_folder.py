"""A folder holding a search run of graded.search is refused by the trainer and `graded train`
(the mirror of the search refusing a folder that holds a training run), and left as it was."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
from pathlib import Path

import pytest
import yaml
from tiny_training import make_trainer

from graded.train.runs import RunError

SKELETON = '''def solve(x):
    return float(value(x))


# EVOLVE-BLOCK-START
def value(x):
    return 0.0
# EVOLVE-BLOCK-END
'''


def _closeness(x, artefact):
    return -abs(artefact - 10.0)


def _program_search(folder: Path) -> None:
    """A finished program search of four evaluations in ``folder``."""
    from graded.search.program.database import DatabaseConfig
    from graded.search.program.engine import SearchConfig, run_search
    from graded.search.program.offline import OfflineProposer
    from graded.search.program.problem import Problem

    problem = Problem("toy", SKELETON, "solve", (1, 2), _closeness, time_limit_s=5.0,
                      memory_mb=512)
    config = SearchConfig(budget=4, workers=2, seed=3, isolation="none",
                          database=DatabaseConfig(islands=2, reset_period=6))
    with cf.ThreadPoolExecutor(2) as pool:
        run_search(problem, OfflineProposer(seed=3), config, out=folder, executor=pool)


def _patternboost(folder: Path) -> None:
    """PatternBoost's round 0 (its initial database) in ``folder``."""
    from graded.search.patternboost import PatternBoostConfig, run_patternboost

    run_patternboost(PatternBoostConfig(
        problem="triangle-free", n=5, problem_options={"bits_per_token": 2}, rounds=0,
        initial=20, keep=8, database_size=20, samples=16, train_steps=4, batch_size=8,
        model={"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}, progress=False,
        chunk_size=16, workers=1), folder)


def _contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("searched")
    _program_search(base / "program")
    _patternboost(base / "patternboost")
    return {"program": base / "program", "patternboost": base / "patternboost"}


@pytest.mark.parametrize(("search", "files"), [
    ("program", r"database\.json, evaluations\.csv"), ("patternboost", r"state\.json")])
@pytest.mark.parametrize("overwrite", [False, True])
def test_the_trainer_refuses_a_search_folder_and_leaves_it_as_it_was(searched, search, files,
                                                                      overwrite):
    folder = searched[search]
    before = _contents(folder)
    trainer = make_trainer(folder, steps=3)
    trainer.overwrite = overwrite  # removing what the trainer wrote would not clear the folder
    with pytest.raises(RunError, match=rf"{folder} holds a search run \({files}\)"):
        trainer.fit()
    assert _contents(folder) == before  # not even the lock file


def test_the_trainer_refuses_to_resume_into_a_search_folder(searched, tmp_path):
    make_trainer(tmp_path / "run", steps=4).fit(pause_after=2)
    folder = searched["program"]
    before = _contents(folder)
    with pytest.raises(RunError, match="holds a search run"):
        make_trainer(folder, steps=4).fit(resume_from=tmp_path / "run")
    assert _contents(folder) == before


def test_graded_train_refuses_a_search_folder_naming_it(searched, tmp_path, capsys):
    from graded.cli import main

    folder = searched["program"]
    config = {"name": folder.name, "seed": 0,
              "task": {"name": "modular", "options": {"p": 11, "train_fraction": 0.5},
                       "n_train": 40, "n_eval": 20},
              "model": {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16,
                        "positional": "learned", "pooling": "last", "grading": None},
              "train": {"steps": 2, "batch_size": 8, "progress": False},
              "output": {"dir": str(folder.parent)}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    before = _contents(folder)
    for extra in ([], ["--set", "output.overwrite=true"]):
        assert main(["train", str(path), *extra]) == 2
        err = capsys.readouterr().err
        assert f"run folder {folder} holds a search run (database.json, evaluations.csv)" in err
        assert _contents(folder) == before


def test_a_folder_with_only_a_users_own_files_still_trains(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.json").write_text("{}")
    assert make_trainer(tmp_path / "run", steps=3).fit().step == 3
