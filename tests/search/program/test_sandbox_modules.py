"""The sandbox's parts (limits, the child's runner, the result) are still reachable from
``graded.search.program.sandbox``, as the same objects."""

import importlib

import pytest

import graded.search.program.sandbox as sandbox
from moved_names import own_names  # tests/ is on the path (conftest.py)

PARTS = ["graded.search.program.sandbox_limits", "graded.search.program.sandbox_result",
         "graded.search.program.sandbox_runner"]


@pytest.mark.parametrize("part", PARTS)
def test_every_name_of_a_part_is_the_same_object_from_the_sandbox_module(part):
    module = importlib.import_module(part)
    own = own_names(module)
    assert own
    for name in own:
        # the runner's text keeps its old name, _RUNNER, in the sandbox module
        there = "_RUNNER" if name == "RUNNER" else name
        assert getattr(sandbox, there) is getattr(module, name), name


def test_the_sandbox_writes_the_runner_of_its_part_module():
    from graded.search.program.sandbox_runner import RUNNER

    assert "def main():" in RUNNER and RUNNER.rstrip().endswith("main()")
    out = sandbox.Sandbox(sandbox.Limits(wall_s=10), isolation="none", preimport=()).run(
        "def f(x):\n    return x + 1\n", "f", [1])
    assert out.ok and out.artefacts == [2]
