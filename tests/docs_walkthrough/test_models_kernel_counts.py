"""docs/models.md: the table of operators and kernels per forward pass and per training step is
what `python benchmarks/host_overhead.py --dtype bfloat16 --compare-folds` counts now.

The counts do not depend on the machine's load or the timed rounds (the benchmark counts one
call of each arm), only on the code: the table once kept the counts of c1ff645 (711 kernels for
an ungraded step) after the code had moved on (651). Here the benchmark's own `build` counts
them and the page's rows are read back and compared.
"""

import re
from pathlib import Path

import pytest
import torch

from test_benchmarks import _load  # tests/ is on the path (conftest.py)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "models.md"
ROWS = {"ungraded": ("ungraded", None), "LGT": ("LGT", "LGT, previous folds"),
        "EGT": ("EGT", None), "LGT, fixed grades": ("LGT fixed", "LGT fixed, previous folds"),
        "EGT, fixed grades": ("EGT fixed", None)}


def page_table(text: str) -> dict[str, list[tuple[int, int | None]]]:
    """Row label -> per column (count, count with the previous folds or None)."""
    start = text.index("| model | kernels before the first product | operators / forward |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        label, *cells = [c.strip() for c in line.strip("|").split("|")]
        rows[label] = [(int(m.group(1)), int(m.group(2)) if m.group(2) else None)
                       for m in (re.match(r"(\d+)(?: \((?:previous folds: )?(\d+)\))?$", c)
                                 for c in cells)]
    return rows


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_the_pages_kernel_counts_are_the_benchmarks():
    module = _load("host_overhead")
    torch.manual_seed(0)
    _, _, counts = module.build(batch=2, length=module.SHAPE["max_len"], dtype=torch.bfloat16,
                                compare_folds=True)
    columns = ("lead_in", "operators", "forward", "step")
    measured = {label: [(counts[c][arm], None if previous is None else counts[c][previous])
                        for c in columns]
                for label, (arm, previous) in ROWS.items()}
    assert page_table(DOC.read_text(encoding="utf-8")) == measured


def test_the_table_reader_reads_counts_and_the_previous_folds_beside_them():
    text = ("| model | kernels before the first product | operators / forward | x |\n|---|\n"
            "| LGT | 23 (previous folds: 36) | 540 (545) | 7 |\n\nafter\n")
    assert page_table(text) == {"LGT": [(23, 36), (540, 545), (7, None)]}
