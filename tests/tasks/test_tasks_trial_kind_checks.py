"""The kinds' data checks name the bad value and a real expectation, and their losses equal
the torch.nn.functional references on task data."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graded.kinds import get_kind
from graded.tasks import get_task
from graded.tasks.base import IGNORE_INDEX


@pytest.mark.parametrize("bad", [[-1, -1], [-3, -100]])
def test_classification_check_data_of_a_model_of_unknown_classes_refuses_negative_ids(bad):
    model = nn.Linear(3, 2)  # no classifier head: the number of classes is unknown
    data = {"inputs": torch.randn(2, 1, 3), "targets": torch.tensor(bad)}
    with pytest.raises(ValueError, match=r"'targets': class ids must be finite and >= 0") as err:
        get_kind("classification").check_data(model, data)
    assert f"[{min(bad)}, {max(bad)}]" in str(err.value)
    assert "[0, 0)" not in str(err.value)  # an empty range is no expectation


def test_classification_check_data_of_a_model_of_unknown_classes_passes_valid_ids():
    data = {"inputs": torch.randn(3, 1, 3), "targets": torch.tensor([0, 4, 2])}
    assert get_kind("classification").check_data(nn.Linear(3, 2), data)


def test_lm_loss_on_polynomial_data_equals_the_functional_cross_entropy():
    data = get_task("polynomials", max_degree=2, coeff_range=2).generate(6, seed=1)
    vocab = data.info["vocab_size"]
    logits = torch.randn(*data.targets.shape, vocab, generator=torch.Generator().manual_seed(0))
    part = get_kind("lm").output_loss(logits, data.tensors, label_smoothing=0.1)
    reference = F.cross_entropy(logits.reshape(-1, vocab), data.targets.reshape(-1),
                                ignore_index=IGNORE_INDEX, label_smoothing=0.1)
    assert part.count == int(data.tensors["loss_mask"].sum())
    torch.testing.assert_close(part.mean, reference)


def test_regression_loss_on_weighted_projective_data_equals_the_functional_mse():
    data = get_task("weighted_projective").generate(7, seed=2)
    out = torch.randn(data.targets.shape, generator=torch.Generator().manual_seed(0))
    part = get_kind("regression").output_loss(out, data.tensors)
    assert part.count == data.targets.numel()
    torch.testing.assert_close(part.mean, F.mse_loss(out, data.targets))


@pytest.mark.parametrize("kind, name", [("regression", "weighted_projective"),
                                        ("classification", "weighted_projective_pair"),
                                        ("regression", "multiscale")])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_check_data_refuses_a_non_finite_input_feature_by_name(kind, name, bad):
    data = dict(get_task(name).generate(4, seed=0).tensors)
    model = nn.Linear(2, 2)
    assert get_kind(kind).check_data(model, data)  # the generated features are finite
    inputs = data["inputs"].clone()
    inputs[2, 0, 0] = bad
    with pytest.raises(ValueError, match=r"'inputs': features must be finite, got values in "
                                         rf"\[.*{bad}.*\]"):
        get_kind(kind).check_data(model, {**data, "inputs": inputs})


class _MeanRegressor(nn.Module):
    """(B, T, F) features -> (B, K) values: mean over T, then a linear map."""

    def __init__(self, features: int, outputs: int) -> None:
        super().__init__()
        self.out = nn.Linear(features, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x.mean(dim=1))


def test_a_trainer_refuses_a_nan_feature_when_built_not_as_a_learning_rate_too_high(tmp_path):
    from graded.train.options import TrainOptions
    from graded.train.trainer import Trainer

    task = get_task("weighted_projective")
    train, held = (dict(d.tensors) for d in task.split("random", 16, 8, seed=0))
    train["inputs"] = train["inputs"].clone()
    train["inputs"][3, 0, 1] = float("nan")
    options = TrainOptions(steps=2, batch_size=8, eval_every=2, warmup_steps=1, progress=False,
                           tensorboard=False, device="cpu")
    with pytest.raises(ValueError, match=r"'inputs': features must be finite"):
        Trainer(_MeanRegressor(task.input_dim, task.num_outputs), train, held,
                kind="regression", options=options, run_dir=tmp_path / "run").fit()
