"""The Python examples of docs/ run as a reader would run them: each file's ```python blocks in
order, as one script (a later block continues an earlier one), in an empty folder, with
RuntimeWarning and UserWarning as errors. (README.md's example: tests/test_examples.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
# examples that run for a minute or more: behind the slow marker
SLOW = {"patternboost.md"}


def script_of(path: Path) -> str:
    return "\n\n".join(BLOCK.findall(path.read_text(encoding="utf-8")))


WITH_CODE = [p for p in DOCS if script_of(p)]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name, marks=[pytest.mark.slow]
                                               if p.name in SLOW else []) for p in WITH_CODE])
def test_the_python_examples_of_a_document_run(path, tmp_path):
    script = tmp_path / f"{path.stem}_examples.py"
    script.write_text(script_of(path), encoding="utf-8")
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-W",
                           "error::UserWarning", str(script)], cwd=tmp_path, text=True,
                          capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_documents_with_examples_are_found():
    names = {p.name for p in WITH_CODE}
    assert {"training.md", "analysis.md", "morphic.md", "program_search.md"} <= names
