"""Every benchmark script runs end to end in its ``--quick`` form (tiny sizes), so the scripts
that produce the README's figures do not rot. Outputs go to a temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))
WRITES_TO = {"c4_free_table": ["--out", "{tmp}/c4"], "listops_backends": ["--out", "{tmp}/lo"],
             "long_sequence": ["--out", "{tmp}/ls"],
             "patternboost_triangle_free": ["--out", "{tmp}/pb", "--workers", "1"],
             "morphic_variable_k": ["--tool", "internal", "--report", "{tmp}/mvk"]}


def test_every_benchmark_is_covered():
    assert set(WRITES_TO) <= set(SCRIPTS)
    for name in SCRIPTS:
        assert "--quick" in (BENCHMARKS / f"{name}.py").read_text(), name


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_quick_run_succeeds(name, tmp_path):
    extra = [a.format(tmp=tmp_path) for a in WRITES_TO.get(name, [])]
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", *extra],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), f"{name} printed nothing"
