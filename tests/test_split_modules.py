"""Modules split off others (centralities off graph attention, the grade learning-rate bound
off the recipes, a task's data off the task interface, one checkpoint folder off a run's
checkpoints, the weighted terms off the graded losses, the learning study's tasks off its arms
and training loop, one run folder off the resume rule): the old module still gives the same
objects under the old names, and the split keeps the classes' behaviour."""

import importlib

import pytest
import torch

from moved_names import own_names  # tests/ is on the path (conftest.py)

# new module -> (old module, the names the old one still gives)
MOVED = {
    "graded.nn.centrality": ("graded.nn.graph", None),
    "graded.train.checkpoint_folder": ("graded.train.checkpoint", None),
    "graded.tasks.dataset": ("graded.tasks.base", None),
    "graded.train.grade_lr": ("graded.train.recipes", ["grade_lr_bound"]),
    "graded.loss_terms": ("graded.losses", ["BaseLoss", "GradesArg", "_elementwise",
                                            "_exponential_factors", "_scales", "_weighted",
                                            "_weights"]),
    "graded.study.learning_tasks": ("graded.study.learning", None),
    "graded.train.run_folder": ("graded.train.runs", None),
}


@pytest.mark.parametrize("new", sorted(MOVED))
def test_the_old_module_gives_the_moved_names_as_the_same_objects(new):
    module = importlib.import_module(new)
    old_name, names = MOVED[new]
    old = importlib.import_module(old_name)
    names = names if names is not None else sorted(module.__all__)
    assert names and set(names) <= own_names(module)
    for name in names:
        assert getattr(old, name) is getattr(module, name), name


def test_the_package_exports_are_the_moved_objects():
    import graded.nn
    import graded.tasks
    from graded.nn.centrality import centrality
    from graded.tasks.dataset import TaskDataset, Vocab

    assert graded.nn.centrality is centrality
    assert graded.tasks.TaskDataset is TaskDataset and graded.tasks.Vocab is Vocab


def test_a_generated_task_dataset_is_the_moved_class():
    from graded.tasks import get_task
    from graded.tasks.dataset import TaskDataset

    data = get_task("dyck").generate(4, seed=0)
    assert type(data) is TaskDataset
    assert torch.equal(data.subset([1, 0]).inputs, data.inputs[[1, 0]])
