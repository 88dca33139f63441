"""The scripts in examples/, the README's Python example and the Python examples of docs/ run
as a user would run them, without a warning of the library (a RuntimeWarning or UserWarning is
an error here). A document's ```python blocks run in order as one script (a later block
continues an earlier one), in an empty folder."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from concurrent_runs import AheadRuns, selected_items, selected_params

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
STRICT = ["-W", "error::RuntimeWarning", "-W", "error::UserWarning"]


def run(script: str, cwd: Path) -> str:
    return run_code([str(EXAMPLES / script)], cwd)


def run_code(args: list[str], cwd: Path) -> str:
    return output_of(subprocess.run(command(args), cwd=cwd, text=True, capture_output=True,
                                    timeout=600, check=False))


def command(args: list[str]) -> list[str]:
    return [sys.executable, *STRICT, *args]


def output_of(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


BLOCK = re.compile(r"```python\n(.*?)```", re.S)
# documents whose examples run for five seconds or more (on 2 cores): behind the slow marker
SLOW_DOCS = {"analysis.md", "morphic.md", "patternboost.md", "program_search.md", "tasks.md",
             "training.md"}


def readme_example() -> str:
    """The README's "Train a graded model on your own data" code block."""
    text = (ROOT / "README.md").read_text()
    after = text.split("**Train a graded model on your own data.**", 1)[1]
    return BLOCK.search(after).group(1)


def script_of(path: Path) -> str:
    return "\n\n".join(BLOCK.findall(path.read_text(encoding="utf-8")))


DOCS_WITH_CODE = [p for p in sorted((ROOT / "docs").glob("*.md")) if script_of(p)]


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """The runs of the selected tests below that run a document's examples, the README's
    example or a script of examples/, started together, two at a time (:mod:`concurrent_runs`):
    key -> (its output, checked for a zero exit status; its folder)."""
    folders = {}
    runs = AheadRuns()

    def start(key, args_in):
        tmp = folders[key] = tmp_path_factory.mktemp(f"ahead_{len(folders)}")
        runs.start(key, command(args_in(tmp)), tmp)

    for path in selected_params(request, test_the_python_examples_of_a_document_run, "path"):
        start(path.name, lambda tmp, path=path: [str(write_script(path, tmp))])
    if selected_items(request, test_readme_training_example_runs_without_warnings_and_learns):
        start("README", lambda tmp: ["-c", readme_example()])
    for test, script in (
            (test_graded_attention_dropin_example_matches_torch_at_neutral_grades,
             "graded_attention_dropin.py"),
            (test_finetune_gpt2_with_grades_example_starts_from_gpt2_and_moves_the_grades,
             "finetune_gpt2_with_grades.py")):
        if selected_items(request, test) and (
                "gpt2" not in script or importlib.util.find_spec("transformers") is not None):
            start(script, lambda tmp, script=script: [str(EXAMPLES / script)])
    yield lambda key: (output_of(runs.result(key)), folders[key])
    runs.close()


def write_script(path: Path, folder: Path) -> Path:
    script = folder / f"{path.stem}_examples.py"
    script.write_text(script_of(path), encoding="utf-8")
    return script


@pytest.mark.parametrize("path", [
    pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in SLOW_DOCS else [])
    for p in DOCS_WITH_CODE])
def test_the_python_examples_of_a_document_run(path, ahead):
    ahead(path.name)


def test_the_documents_with_examples_are_found():
    names = {p.name for p in DOCS_WITH_CODE}
    assert {"training.md", "analysis.md", "morphic.md", "program_search.md"} <= names


def test_readme_training_example_runs_without_warnings_and_learns(ahead):
    out, tmp_path = ahead("README")
    accuracy = float(re.search(r"'accuracy': ([0-9.]+)", out).group(1))
    assert accuracy > 0.9, out
    assert (tmp_path / "runs" / "mine" / "config.yaml").exists()


def test_graded_attention_dropin_example_matches_torch_at_neutral_grades(ahead):
    out, _ = ahead("graded_attention_dropin.py")
    diff = float(out.splitlines()[0].rsplit(":", 1)[1])
    assert diff < 1e-5


@pytest.mark.slow
def test_train_graded_classifier_example_learns(tmp_path):
    out = run("train_graded_classifier.py", tmp_path)
    assert "'accuracy': 0.9" in out or "'accuracy': 1.0" in out
    assert (tmp_path / "runs" / "example-egt" / "metrics.json").exists()


@pytest.mark.slow  # the example's process, 7 s on 2 cores: `pytest -m slow`
def test_finetune_gpt2_with_grades_example_starts_from_gpt2_and_moves_the_grades(ahead):
    pytest.importorskip("transformers")
    out, tmp_path = ahead("finetune_gpt2_with_grades.py")
    first = out.splitlines()[0]
    assert float(first.rsplit("=", 1)[1]) < 1e-5  # the grafted model computes GPT-2's logits
    assert "feature grades moved from 0 to" in out
    assert (tmp_path / "runs" / "gpt2-egt" / "config.yaml").exists()
