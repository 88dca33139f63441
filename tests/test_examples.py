"""The scripts in examples/ and the README's Python example run as a user would run them,
without a warning of the library (a RuntimeWarning or UserWarning is an error here)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
STRICT = ["-W", "error::RuntimeWarning", "-W", "error::UserWarning"]


def run(script: str, cwd: Path) -> str:
    return run_code([str(EXAMPLES / script)], cwd)


def run_code(args: list[str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, *STRICT, *args], cwd=cwd, text=True,
                          capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def readme_example() -> str:
    """The README's "Train a graded model on your own data" code block."""
    text = (ROOT / "README.md").read_text()
    after = text.split("**Train a graded model on your own data.**", 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_readme_training_example_runs_without_warnings_and_learns(tmp_path):
    out = run_code(["-c", readme_example()], tmp_path)
    accuracy = float(re.search(r"'accuracy': ([0-9.]+)", out).group(1))
    assert accuracy > 0.9, out
    assert (tmp_path / "runs" / "mine" / "config.yaml").exists()


def test_graded_attention_dropin_example_matches_torch_at_neutral_grades(tmp_path):
    out = run("graded_attention_dropin.py", tmp_path)
    diff = float(out.splitlines()[0].rsplit(":", 1)[1])
    assert diff < 1e-5


@pytest.mark.slow
def test_train_graded_classifier_example_learns(tmp_path):
    out = run("train_graded_classifier.py", tmp_path)
    assert "'accuracy': 0.9" in out or "'accuracy': 1.0" in out
    assert (tmp_path / "runs" / "example-egt" / "metrics.json").exists()


def test_finetune_gpt2_with_grades_example_starts_from_gpt2_and_moves_the_grades(tmp_path):
    pytest.importorskip("transformers")
    out = run("finetune_gpt2_with_grades.py", tmp_path)
    first = out.splitlines()[0]
    assert float(first.rsplit("=", 1)[1]) < 1e-5  # the grafted model computes GPT-2's logits
    assert "feature grades moved from 0 to" in out
    assert (tmp_path / "runs" / "gpt2-egt" / "config.yaml").exists()
