"""Data a run cannot use are refused up front: data without the ``targets`` a loss needs, naming
the missing key, by the trainer when it is built (not by a KeyError at the first step or
evaluation, after the run folder was written) and by ``evaluate`` (``predict`` needs only the
inputs); an evaluation set without examples by the trainer when it is built (not at the first
evaluation, which fails the run with the steps before it unsaved)."""

from __future__ import annotations

import pytest
import torch
from tiny_training import TinyClassifier, make_data

from graded.train.objectives import evaluate, predict
from graded.train.options import TrainOptions
from graded.train.trainer import Trainer

OPTIONS = TrainOptions(steps=3, batch_size=8, eval_every=3, warmup_steps=1, progress=False,
                       tensorboard=False)
MISSING = r"needs keys \['inputs', 'targets'\]; missing \['targets'\], got \['inputs'\]"


@pytest.mark.parametrize("which", ["training", "evaluation"])
def test_a_trainer_refuses_data_without_targets_when_built_and_writes_nothing(tmp_path, which):
    data = make_data(32, 1)
    inputs_only = {"inputs": data["inputs"]}
    train, held = (inputs_only, data) if which == "training" else (data, inputs_only)
    with pytest.raises(ValueError, match=rf"^{which} data: a 'classification' batch {MISSING}"):
        Trainer(TinyClassifier(), train, held, kind="classification", options=OPTIONS,
                run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_evaluate_refuses_data_without_targets_and_predict_takes_them():
    torch.manual_seed(0)
    model = TinyClassifier()
    inputs = make_data(10, 1)["inputs"]
    with pytest.raises(ValueError, match=MISSING):
        evaluate(model, {"inputs": inputs}, "classification")
    model.eval()
    with torch.no_grad():
        want = model(inputs)
    got = predict(model, {"inputs": inputs}, "classification", batch_size=3)
    torch.testing.assert_close(got, want)


def test_a_trainer_refuses_an_evaluation_set_without_examples_when_built(tmp_path):
    with pytest.raises(ValueError, match=r"^evaluation data: no examples \(tensors \['inputs', "
                       r"'targets'\] have 0 rows\)"):
        Trainer(TinyClassifier(), make_data(32, 1), make_data(0, 2), kind="classification",
                options=OPTIONS, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    # eval_data=None, as the message says, trains the same run without evaluating
    done = Trainer(TinyClassifier(), make_data(32, 1), None, kind="classification",
                   options=OPTIONS, run_dir=tmp_path / "plain").fit()
    assert done.step == 3 and done.final_eval == {}
