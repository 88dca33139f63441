"""``predict`` reads the inputs only, for every task kind: on data without ``targets`` (nor the
masks that come with them) it returns the model's own outputs, called by hand; a regression
used to reshape its values to the targets and failed with ``KeyError: 'targets'``."""

from __future__ import annotations

import pytest
import torch
from test_kinds import morphic_model, task_and_model

from graded.kinds import KIND_NAMES, get_kind
from graded.train import predict

#: The keys a dataset holds for its targets (the rest are inputs and their masks).
TARGET_KEYS = ("targets", "loss_mask", "metric_mask")


def _model_outputs(kind_name, model, tensors):
    """The model called directly, in eval mode and without gradients: the reference."""
    with torch.no_grad():
        if kind_name == "seq2seq":
            return model(tensors["inputs"], tensors["decoder_inputs"],
                         src_key_padding_mask=tensors.get("key_padding_mask"),
                         tgt_key_padding_mask=tensors.get("decoder_key_padding_mask"))
        return model(tensors["inputs"], tensors.get("key_padding_mask"))


@pytest.mark.parametrize("kind_name", KIND_NAMES)
def test_predict_on_inputs_alone_returns_the_models_outputs(kind_name):
    _, model, data = task_and_model(kind_name)
    inputs = {k: v for k, v in data.tensors.items() if k not in TARGET_KEYS}
    assert "targets" not in inputs
    got = predict(model, inputs, kind_name, batch_size=5)  # 5 + 5 + 2 rows
    want = _model_outputs(kind_name, model, data.tensors).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_regression_predict_without_targets_gives_the_values_it_gives_with_them():
    """The library's regression targets are (N, num_outputs), the model's output shape: the
    prediction is the same tensor whether or not the data hold targets."""
    _, model, data = task_and_model("regression")
    assert data.tensors["targets"].dim() == 2
    inputs = {k: v for k, v in data.tensors.items() if k not in TARGET_KEYS}
    with_targets = predict(model, data.tensors, "regression", batch_size=5)
    assert with_targets.shape == data.tensors["targets"].shape
    torch.testing.assert_close(predict(model, inputs, "regression", batch_size=5), with_targets)


def test_regression_raw_prediction_reshapes_to_targets_only_where_the_batch_has_them():
    kind = get_kind("regression")
    out = torch.arange(3.0).reshape(3, 1)
    assert kind.raw_prediction(out, {"targets": torch.zeros(3)}).tolist() == [0.0, 1.0, 2.0]
    assert kind.raw_prediction(out, {"inputs": torch.zeros(3, 2, 1)}).tolist() == [
        [0.0], [1.0], [2.0]]


def test_morphic_lm_predict_on_inputs_alone_returns_the_models_logits():
    model = morphic_model().eval()
    torch.manual_seed(1)
    ids = torch.randint(0, 9, (4, 6))
    got = predict(model, {"inputs": ids}, "lm", batch_size=3)
    with torch.no_grad():
        want = model(ids)
    torch.testing.assert_close(got, want)


def test_predict_on_data_without_an_input_key_names_it():
    _, model, data = task_and_model("seq2seq")
    only_source = {"inputs": data.tensors["inputs"]}
    with pytest.raises(ValueError, match=r"missing \['decoder_inputs'\]"):
        predict(model, only_source, "seq2seq")
