"""A Trainer built with an argument of the wrong type or value is refused when it is built (or,
for ``fit``'s ``pause_after``, before ``fit`` writes anything), naming the argument, the value
given and what it takes; not an AttributeError deep in the set-up, nor a run folder written and
then abandoned (a ``seed`` of 1.5 used to fail inside ``fit``, after its lock, manifest and
``config.yaml`` were written)."""

from __future__ import annotations

import pytest
from tiny_training import OPTIONS, TinyClassifier, make_data, make_trainer

from graded.train.options import TrainOptions
from graded.train.trainer import Trainer

GOOD = {"seed": 0, "recipe": None, "config": None, "resume_command": None, "overwrite": False}


def _build(run_dir, *, model=None, train=None, evaluation="default", options="default",
           **kwargs):
    return Trainer(model if model is not None else TinyClassifier(),
                   train if train is not None else make_data(96, 1),
                   make_data(48, 2) if evaluation == "default" else evaluation,
                   kind="classification",
                   options=TrainOptions(**OPTIONS) if options == "default" else options,
                   run_dir=run_dir, **{**GOOD, **kwargs})


@pytest.mark.parametrize(("argument", "value", "expected"), [
    ("seed", 1.5, r"seed must be an int, got 1\.5 \(float\)"),
    ("seed", "1", r"seed must be an int, got '1' \(str\)"),
    ("seed", True, r"seed must be an int, got True \(bool\)"),
    ("options", {"steps": 3}, r"options must be a TrainOptions or None, got dict \{'steps': 3\}"),
    ("options", {}, r"options must be a TrainOptions or None, got dict \{\}"),
    ("recipe", 5, r"recipe must be a recipe name, a Recipe or None, got int 5"),
    ("config", [1, 2], r"config must be a dict \(JSON values\) or None, got list \[1, 2\]"),
    ("resume_command", 5, r"resume_command must be a str or None, got int 5"),
    ("overwrite", "yes", r"overwrite must be True or False, got 'yes' \(str\)"),
    ("model", "model", r"model must be a torch\.nn\.Module, got str 'model'"),
    ("train", (1, 2), r"train_data must be a dict of tensors .*got tuple \(1, 2\)"),
    ("evaluation", [1], r"eval_data must be a dict of tensors .*or None\), got list \[1\]"),
])
def test_an_argument_of_the_wrong_type_is_refused_when_built_naming_it(tmp_path, argument,
                                                                       value, expected):
    with pytest.raises(TypeError, match=expected):
        _build(tmp_path / "run", **{argument: value})
    assert not (tmp_path / "run").exists()


def test_training_data_of_arrays_are_refused_naming_the_key(tmp_path):
    data = {name: t.numpy() for name, t in make_data(96, 1).items()}
    with pytest.raises(TypeError, match=r"train_data\['inputs'\] must be a torch\.Tensor, "
                                        r"got ndarray array"):
        _build(tmp_path / "run", train=data)


def test_a_run_dir_that_is_no_path_is_refused_naming_it(tmp_path):
    with pytest.raises(TypeError, match=r"run_dir must be a path \(str or Path\), got NoneType "
                                        "None"):
        _build(None)


def test_a_seed_torch_cannot_take_is_refused_naming_the_range(tmp_path):
    with pytest.raises(ValueError, match=rf"^seed must be <= {2**64 - 1}, got {2**64}$"):
        _build(tmp_path / "run", seed=2**64)
    with pytest.raises(ValueError, match=rf"^seed must be >= {-2**63}, got {-2**63 - 1}$"):
        _build(tmp_path / "run", seed=-2**63 - 1)


def test_a_config_torch_cannot_store_is_refused_when_built_not_after_the_steps(tmp_path):
    with pytest.raises(TypeError, match=r"config: cannot store object value .* expected a "
                                        "dict of JSON values"):
        _build(tmp_path / "run", config={"note": object()})
    assert not (tmp_path / "run").exists()


def test_a_config_of_numpy_numbers_is_stored_as_plain_numbers(tmp_path):
    """What the checkpoints store of it (jsonable): config.yaml, written with yaml.safe_dump,
    used to fail on a numpy number, after the lock file was written."""
    np = pytest.importorskip("numpy")
    trainer = _build(tmp_path / "run", config={"n": np.int64(3), "shape": (1, 2)})
    trainer.fit(pause_after=1)
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert "n: 3" in text and "shape:\n- 1\n- 2" in text


@pytest.mark.parametrize(("pause_after", "error", "expected"), [
    (-1, ValueError, r"^pause_after must be >= 0, got -1$"),
    (2.5, TypeError, r"^pause_after must be an int, got 2\.5 \(float\)$"),
    (True, TypeError, r"^pause_after must be an int, got True \(bool\)$"),
])
def test_a_bad_pause_after_is_refused_before_fit_writes_anything(tmp_path, pause_after, error,
                                                                 expected):
    trainer = make_trainer(tmp_path / "run")
    with pytest.raises(error, match=expected):
        trainer.fit(pause_after=pause_after)
    assert not (tmp_path / "run").exists()


def test_pause_after_zero_saves_the_state_before_any_step_and_resumes_exactly(tmp_path):
    full = make_trainer(tmp_path / "full", steps=6).fit()
    paused = make_trainer(tmp_path / "run", steps=6).fit(pause_after=0)
    assert paused.step == 0 and paused.losses == []
    rest = make_trainer(tmp_path / "run", steps=6).fit(resume_from=tmp_path / "run")
    assert rest.losses == full.losses


def test_early_stopping_without_evaluation_data_is_refused_naming_both(tmp_path):
    """It counts evaluations, and a run with eval_data=None makes none: it used to be taken
    and the run never stopped early."""
    options = TrainOptions(**{**OPTIONS, "early_stopping": {"patience": 2}})
    with pytest.raises(ValueError, match=r"train\.early_stopping \(patience 2\) needs evaluation "
                                         r"data: with eval_data=None .*expected eval_data, or "
                                         "early_stopping=None"):
        _build(tmp_path / "run", evaluation=None, options=options)


@pytest.mark.parametrize(("train", "expected"), [
    ({}, r"^training data: dataset is empty: expected a dict of tensors$"),
    ("zero rows", r"^training data: no examples \(tensors \['inputs', 'targets'\] have 0 rows\); "
                  r"expected at least train\.batch_size$"),
    ("ragged", r"^training data: dataset tensors disagree on their first dimension: "
               r"\{'inputs': 10, 'targets': 9\}$"),
])
def test_training_data_without_examples_or_of_ragged_lengths_are_refused_naming_them(
        tmp_path, train, expected):
    """These errors did not say which data they were about (an evaluation set's do), and 0
    rows read as a batch size out of [1, 0]."""
    if train == "zero rows":
        train = make_data(0, 1)
    elif train == "ragged":
        train = {"inputs": make_data(10, 1)["inputs"], "targets": make_data(9, 1)["targets"]}
    with pytest.raises(ValueError, match=expected):
        _build(tmp_path / "run", train=train, evaluation=None)


def test_a_numpy_seed_is_kept_as_an_int(tmp_path):
    """The seed goes through graded.checks.check_int: a NumPy integer is taken, as the
    Python int the run's files can store."""
    import numpy as np

    trainer = _build(tmp_path / "run", seed=np.int64(3))
    assert trainer.seed == 3 and type(trainer.seed) is int
