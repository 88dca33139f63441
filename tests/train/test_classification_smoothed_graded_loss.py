"""With label smoothing, the graded classification loss weights each class's share of a row's
target distribution by that class's weight: Σ_i Σ_k w_k·y_ik·(−log p_ik) with
y_i = (1 − ε)·one_hot(t_i) + ε/C, the letter of 000 Eq. 63 / Def 7.1 (ℓ_k = −y_k log p_k). The
rows used to be weighted by the true class's weight alone, w_t·(smoothed cross-entropy)."""

import math

import pytest
import torch
import torch.nn.functional as F

from graded.kinds import get_kind
from graded.losses import graded_cross_entropy
from graded.train.recipes import get_recipe
from graded.transformer import TransformerClassifier, TransformerConfig

CLASSES = 5
CLASS_GRADES = torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0])


def naive(logits, targets, weights, eps):
    """The double sum written out with math.log and math.exp."""
    total = 0.0
    for row, t in zip(logits.tolist(), targets.tolist(), strict=True):
        log_z = math.log(sum(math.exp(v) for v in row))
        for k, v in enumerate(row):
            y = (1.0 - eps) * (k == t) + eps / len(row)
            total += float(weights[k]) * y * -(v - log_z)
    return total


def kind_loss(logits, targets, weights, eps):
    batch = {"targets": targets}
    return get_kind("classification").output_loss(logits, batch, label_smoothing=eps,
                                                  weights=weights)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_smoothed_graded_cross_entropy_weights_every_class_term(eps):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, CLASSES, generator=gen, dtype=torch.float64)
    targets = torch.tensor([0, 4, 2, 2, 1, 3, 4])
    kind = get_kind("classification")
    weights = 2.0 ** kind.loss_grades({"targets": targets}, CLASS_GRADES)  # λ = 2
    got = kind_loss(logits, targets, weights, eps)
    want = naive(logits, targets, weights, eps)
    assert got.count == 7
    assert float(got.total) == pytest.approx(want, rel=1e-6)  # scored in float32
    # graded.losses with the smoothed distribution as probability targets: the same sum
    smoothed = (1 - eps) * F.one_hot(targets, CLASSES).double() + eps / CLASSES
    reference = graded_cross_entropy(logits, smoothed, weights.double(), reduction="sum")
    assert float(got.total) == pytest.approx(float(reference), rel=1e-6)


def test_class_weights_all_one_give_the_plain_smoothed_loss():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, CLASSES, generator=gen)
    targets = torch.tensor([1, 0, 4, 3, 2, 2])
    got = kind_loss(logits, targets, torch.ones(CLASSES), 0.2)
    plain = F.cross_entropy(logits, targets, label_smoothing=0.2, reduction="sum")
    assert float(got.total) == pytest.approx(float(plain), rel=1e-6)


def test_the_recipe_weights_of_a_model_give_the_written_out_loss_with_smoothing():
    """Through the EGT recipe's weights λ^q of a model's grading, as the trainer computes them."""
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=12, max_len=8, d_model=16, n_heads=2, n_layers=1,
                               d_ff=32, grading="exponential", grading_base=2.0,
                               learnable_grades=True)
    model = TransformerClassifier(config, CLASSES)
    ids = torch.randint(0, 12, (4, 8), generator=torch.Generator().manual_seed(2))
    targets = torch.tensor([4, 0, 3, 1])
    kind = get_kind("classification")
    recipe = get_recipe("egt-alg7.1")
    weights = recipe.loss_weights(model, kind.loss_grades({"targets": targets}, CLASS_GRADES))
    got = kind.loss(model, {"inputs": ids, "targets": targets}, label_smoothing=0.3,
                    weights=weights)
    with torch.no_grad():
        logits = kind.forward(model, {"inputs": ids, "targets": targets})
    lam = float(next(g for g in model.modules() if hasattr(g, "set_base")).base)
    want = naive(logits.double(), targets, [lam ** float(q) for q in CLASS_GRADES], 0.3)
    assert float(got.total.detach()) == pytest.approx(want, rel=1e-5)


def test_class_weights_of_the_wrong_size_and_bad_smoothing_are_refused():
    logits = torch.zeros(2, CLASSES)
    targets = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"expected one per class, \(5,\)"):
        kind_loss(logits, targets, torch.ones(2), 0.1)
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\), got 1.5"):
        kind_loss(logits, targets, torch.ones(CLASSES), 1.5)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_class_ids_of_any_integer_dtype_weight_their_own_class(dtype, eps):
    """Targets of any integer dtype (the plain loss takes them all) are class ids: as a uint8
    index the weights were read as a mask of the rows (five non-zero ids of five classes gave
    every class's weight in class order, whatever the ids), an int16 index was refused."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, CLASSES, generator=gen, dtype=torch.float64)
    targets = torch.tensor([4, 1, 1, 3, 2], dtype=dtype)
    kind = get_kind("classification")
    batch = {"targets": targets}
    weights = 2.0 ** kind.loss_grades(batch, CLASS_GRADES)
    got = kind.output_loss(logits, batch, label_smoothing=eps, weights=weights)
    want = naive(logits, targets.long(), [2.0 ** float(q) for q in CLASS_GRADES], eps)
    assert float(got.total) == pytest.approx(want, rel=1e-6)


def test_output_grades_of_another_length_than_the_models_classes_are_named():
    """Grades for three classes against a model of four outputs (every target among the
    three) reach the loss, whose refusal names the output_grades they came from, not only
    "loss weights"."""
    kind = get_kind("classification")
    batch = {"targets": torch.tensor([0, 2, 1])}
    weights = 2.0 ** kind.loss_grades(batch, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"expected one per class, \(4,\), the model's outputs "
                                         r"\(the weights of the task's output_grades"):
        kind.output_loss(torch.zeros(3, 4), batch, weights=weights)


def test_a_trainer_refuses_output_grades_of_another_length_than_the_models_classes(tmp_path):
    """Checked when the trainer is built, not at its first step: three grades for a
    classifier of four classes."""
    from graded.train.options import TrainOptions
    from graded.train.trainer import Trainer

    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=12, max_len=8, d_model=16, n_heads=2, n_layers=1,
                               d_ff=32, grading="exponential", grading_base=2.0,
                               learnable_grades=True)
    model = TransformerClassifier(config, 4)
    ids = torch.randint(0, 12, (8, 8), generator=torch.Generator().manual_seed(3))
    data = {"inputs": ids, "targets": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])}
    options = TrainOptions(steps=1, batch_size=4, progress=False, tensorboard=False,
                           device="cpu")
    with pytest.raises(ValueError, match=r"output_grades of shape \(3,\); the model has 4 "
                                         r"classes: expected one grade per class, \(4,\)"):
        Trainer(model, data, None, kind="classification", options=options,
                run_dir=tmp_path / "run", recipe="egt-alg7.1",
                output_grades=torch.tensor([0.0, 1.0, 2.0]))
    assert not (tmp_path / "run").exists()  # refused before the run folder is made
