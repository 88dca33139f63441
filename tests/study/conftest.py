"""What every experiment's findings must satisfy, shared by the experiment tests."""

import math
from pathlib import Path

import pytest

from graded.study.core import CLAIMS


def _check_findings(findings, experiment, out: Path, *, finite: bool = True) -> None:
    """One finding per claim of ``experiment``, in order, each well formed, its figures on disk.
    ``finite=False`` admits a non-finite estimate (an experiment that reports a quantity it could
    not measure), whose interval is then not checked."""
    assert [f.claim for f in findings] == list(experiment.claims)
    for f in findings:
        assert f.claim in CLAIMS and f.experiment == experiment.name
        assert f.verdict in ("holds", "fails", "inconclusive")
        assert f.seeds >= 1 and f.quantity and f.control and f.detail
        if finite or math.isfinite(f.estimate):
            assert math.isfinite(f.estimate) and f.low <= f.estimate <= f.high
        for name in f.figures:
            assert (out / name).is_file(), name


@pytest.fixture
def check_findings():
    return _check_findings
