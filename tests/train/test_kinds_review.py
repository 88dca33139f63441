"""Task kinds (graded.kinds) under edge cases, against losses written out by hand: every
classification row is scored, class ids are checked once, regression refuses label smoothing
and mismatched outputs, and the LM's perplexity is exp(loss) however large."""

from __future__ import annotations

import math

import pytest
import torch

from graded.kinds import get_kind
from graded.tasks import IGNORE_INDEX, get_task
from graded.transformer import TransformerConfig


def _smoothed_cross_entropy(logits: torch.Tensor, target: int, eps: float) -> float:
    """−Σ_c q_c log p_c with q = (1 − ε)·one_hot + ε/V (002 §6.4), by a loop over classes."""
    z = [float(v) for v in logits.double()]
    m = max(z)
    log_norm = m + math.log(sum(math.exp(v - m) for v in z))
    n = len(z)
    return -sum(((1 - eps) * (c == target) + eps / n) * (z[c] - log_norm) for c in range(n))


def _listops_model():
    task = get_task("listops")
    info = task.info()
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=info["vocab_size"], input_dim=info["input_dim"],
                               d_model=16, n_heads=2, n_layers=1, d_ff=32,
                               max_len=task.max_len + 4, positional="learned",
                               pad_id=info["pad_id"])
    return task, get_kind("classification").build_model(config, task).eval()


@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_classification_loss_is_the_loop_sum_over_every_row(eps, dtype):
    torch.manual_seed(1)
    logits = torch.randn(5, 4).to(dtype)
    targets = torch.tensor([0, 3, 3, 1, 2])
    part = get_kind("classification").output_loss(logits, {"targets": targets},
                                                  label_smoothing=eps)
    expected = sum(_smoothed_cross_entropy(logits[i].float(), int(targets[i]), eps)
                   for i in range(5))
    assert part.count == 5
    assert float(part.total) == pytest.approx(expected, rel=1e-5)


def test_classification_loss_of_batch_one_with_a_single_class_is_zero():
    part = get_kind("classification").output_loss(torch.tensor([[2.5]]),
                                                  {"targets": torch.tensor([0])})
    assert (float(part.total), part.count) == (0.0, 1)


@pytest.mark.parametrize("bad", [IGNORE_INDEX, -1])
def test_a_negative_class_target_is_refused_not_dropped_from_a_loss_that_counts_it(bad):
    """A classification target has no ignore value: a row with target -100 used to vanish
    from the sum while the count (and so the mean's denominator) kept it."""
    logits = torch.randn(3, 4)
    with pytest.raises((IndexError, ValueError), match=str(bad)):
        get_kind("classification").output_loss(logits, {"targets": torch.tensor([0, bad, 2])})


@pytest.mark.parametrize("bad", [IGNORE_INDEX, 99])
def test_classification_check_data_names_class_ids_outside_the_models_classes(bad):
    task, model = _listops_model()
    data = dict(task.generate(6, seed=2).tensors)
    classes = task.num_outputs
    assert get_kind("classification").check_data(model, data)
    targets = data["targets"].clone()
    targets[1] = bad
    with pytest.raises(ValueError, match=rf"class ids must lie in \[0, {classes}\).*{bad}"):
        get_kind("classification").check_data(model, {**data, "targets": targets})


def test_classification_loss_grades_refuse_a_negative_class_id_instead_of_wrapping():
    """output_grades[-1] is the last class's grade: a target -1 used to take it silently."""
    grades = torch.tensor([0.0, 1.0, 2.0, 3.0])
    kind = get_kind("classification")
    assert kind.loss_grades({"targets": torch.tensor([3, 0])}, grades).tolist() == grades.tolist()
    with pytest.raises(ValueError, match=r"class ids in \[-1, 2\]; expected ids ≥ 0"):
        kind.loss_grades({"targets": torch.tensor([0, -1, 2])}, grades)


def test_regression_loss_is_the_loop_sum_of_squared_errors_in_float64_data():
    out = torch.tensor([[1.0, -2.0], [0.5, 4.0], [3.0, 3.0]], dtype=torch.float64)
    targets = torch.tensor([[0.0, -1.0], [0.5, 1.0], [2.0, 5.0]], dtype=torch.float64)
    expected = sum((float(out[i, j]) - float(targets[i, j])) ** 2
                   for i in range(3) for j in range(2))
    part = get_kind("regression").output_loss(out, {"targets": targets})
    assert part.count == 6
    assert float(part.total) == pytest.approx(expected)


def test_regression_refuses_label_smoothing_it_cannot_honour():
    """Label smoothing has no meaning for a squared error; it used to be accepted and
    ignored, both by the trainer's option check and by the loss."""
    kind = get_kind("regression")
    kind.check_options(label_smoothing=0.0)
    with pytest.raises(ValueError, match=r"label_smoothing=0.1.*expected 0"):
        kind.check_options(label_smoothing=0.1)
    with pytest.raises(ValueError, match=r"label_smoothing=0.3.*expected 0"):
        kind.output_loss(torch.zeros(2, 1), {"targets": torch.zeros(2)}, label_smoothing=0.3)


def test_regression_output_with_another_row_count_is_refused_not_reshaped():
    """(2, 3) outputs against (3, 2) targets have as many values but pair them wrongly."""
    kind = get_kind("regression")
    assert kind.raw_prediction(torch.ones(3, 1), {"targets": torch.zeros(3)}).shape == (3,)
    with pytest.raises(ValueError, match=r"output \(2, 3\) does not match targets \(3, 2\)"):
        kind.output_loss(torch.zeros(2, 3), {"targets": torch.zeros(3, 2)})


@pytest.mark.parametrize("loss", [0.0, 2.5, 60.0, 700.0])
def test_lm_perplexity_is_exp_of_the_loss_however_large(loss):
    """The perplexity used to be capped at e^50, misreporting any loss above 50."""
    targets = torch.tensor([[1, IGNORE_INDEX]])
    report = get_kind("lm").report(loss, torch.tensor([[1, 0]]), {"targets": targets})
    assert report["perplexity"] == pytest.approx(math.exp(loss))
    assert report["token_accuracy"] == 1.0


def test_lm_perplexity_of_an_overflowing_or_infinite_loss_is_inf():
    targets = torch.tensor([[1]])
    for loss in (1000.0, math.inf):
        report = get_kind("lm").report(loss, torch.tensor([[1]]), {"targets": targets})
        assert report["perplexity"] == math.inf


def test_lm_loss_with_all_padding_rows_is_the_loop_over_scored_tokens():
    torch.manual_seed(3)
    logits = torch.randn(3, 4, 6)
    targets = torch.tensor([[1, 2, IGNORE_INDEX, IGNORE_INDEX],
                            [IGNORE_INDEX] * 4,
                            [5, 0, 3, IGNORE_INDEX]])
    part = get_kind("lm").output_loss(logits, {"targets": targets}, label_smoothing=0.1)
    expected = sum(_smoothed_cross_entropy(logits[b, t], int(targets[b, t]), 0.1)
                   for b in range(3) for t in range(4) if targets[b, t] != IGNORE_INDEX)
    assert part.count == 5
    assert float(part.total) == pytest.approx(expected, rel=1e-5)
    empty = get_kind("lm").output_loss(logits[1:2], {"targets": targets[1:2]})
    assert (float(empty.total), empty.count, float(empty.mean)) == (0.0, 0, 0.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_regression_targets_that_are_not_finite_are_refused_naming_them(tmp_path, bad):
    """A NaN target gave an evaluation loss of NaN without a word, and a training run stopped
    at a later step with "training loss became nan ...; lower lr"."""
    from graded.train.objectives import evaluate
    from graded.train.options import TrainOptions
    from graded.train.trainer import Trainer

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 1))
    x = torch.randn(8, 2, 3, generator=torch.Generator().manual_seed(0))
    targets = torch.arange(8.0)
    targets[5] = bad
    data = {"inputs": x, "targets": targets}
    message = r"'targets': regression values must be finite, got values in \["
    with pytest.raises(ValueError, match=message):
        evaluate(model, data, "regression")
    with pytest.raises(ValueError, match=message):
        Trainer(model, data, None, kind="regression", run_dir=tmp_path / "run",
                options=TrainOptions(steps=2, batch_size=4, progress=False, tensorboard=False,
                                     device="cpu"))
    targets[5] = 5.0  # finite values pass
    assert set(evaluate(model, data, "regression")) == {"loss", "mse", "mae", "r2"}


def test_classification_loss_grades_of_checked_data_read_no_value():
    """A graded classification step read the targets twice (their max and min) for every
    micro-batch: on a GPU two waits for the device a step, inside checked_inputs too."""
    from graded.checks import checked_inputs
    from host_reads import HostReads

    kind = get_kind("classification")
    grades = torch.tensor([0.0, 0.5, 2.0])
    batch = {"targets": torch.tensor([2, 0, 1, 2])}
    with checked_inputs(True), HostReads() as reads:
        got = kind.loss_grades(batch, grades)
    assert reads.sites == []
    assert got.tolist() == [0.0, 0.5, 2.0]  # one grade per class
    with HostReads() as reads:  # unchecked data are checked here, as before
        unchecked = kind.loss_grades(batch, grades)
    assert len(reads.sites) == 2 and torch.equal(unchecked, got)
    with pytest.raises(ValueError, match=r"at least 4"):
        kind.loss_grades({"targets": torch.tensor([3])}, grades)
