"""The demo's parts (its runs, its workers, its report) are still reachable from
``graded.demo``, and the function a spawned worker starts resolves to the same object."""

import importlib
import pickle

import pytest

import graded.demo as demo
from moved_names import own_names  # tests/ is on the path (conftest.py)

PARTS = ["graded.demo_runs", "graded.demo_workers", "graded.demo_report"]


@pytest.mark.parametrize("part", PARTS)
def test_every_name_of_a_part_is_the_same_object_from_graded_demo(part):
    module = importlib.import_module(part)
    own = own_names(module)
    assert own
    for name in own:
        assert getattr(demo, name) is getattr(module, name), name


def test_the_spawned_worker_target_is_found_under_its_pickled_name():
    # spawn pickles the worker's target by module and name; the child imports that module
    from graded.demo_workers import _worker_loop

    assert pickle.loads(pickle.dumps(demo._worker_loop)) is _worker_loop
    assert _worker_loop.__module__ == "graded.demo_workers"
