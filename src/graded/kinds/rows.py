"""The encoder kinds: one answer per example from a pooled encoder, a class
(:class:`Classification`) or real values (:class:`Regression`)."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from graded.checks import check_finite, check_finite_nonnegative, check_id_range, inputs_checked
from graded.evaluation import baselines as B
from graded.kinds.base import Batch, LossSum, TaskKind, _weighted_sum, _widened
from graded.tasks.base import TaskDataset
from graded.train.losses import sequence_cross_entropy

#: The ``ignore_index`` the classification loss passes to the cross-entropy: no int64 class id
#: equals it, so every row is scored and a negative id (``IGNORE_INDEX`` included) fails
#: instead of dropping its row from the sum while the count keeps it.
_NO_IGNORED_CLASS = -(2**63)


class Classification(TaskKind):
    """One class per example from an encoder with pooling."""

    name = "classification"
    metric_names = ("accuracy",)
    grades_source = "the task's output_grades, one per class"

    def build_model(self, model_config: Any, task: Any, *, pooling: str = "mean") -> nn.Module:
        return self.model_class()(model_config, task.num_outputs, pooling=pooling)

    def model_class(self) -> type[nn.Module] | None:
        from graded.transformer import TransformerClassifier

        return TransformerClassifier

    def check_data(self, model: nn.Module, data: Batch) -> bool:
        """:meth:`TaskKind.check_data`, and the targets: class ids in [0, number of classes)
        (every row is scored: a classification target has no ignore value), so that a bad
        target fails here, naming its range, rather than in a step."""
        checked = super().check_data(model, data)
        targets = data.get("targets")
        if targets is not None and targets.dim() == 1 and not targets.is_floating_point():
            classes = _num_outputs(model)
            if classes is None:  # the upper bound is the loss's to check
                check_finite_nonnegative(targets, "'targets': class ids")
            else:
                check_id_range(targets, classes, "'targets': class ids")
        return checked

    def loss_count(self, batch: Batch) -> int:
        return int(batch["targets"].shape[0])

    def loss_grades(self, batch: Batch, output_grades: Tensor | None = None) -> Tensor | None:
        """The grade of each class, shape (C,): the graded loss Σ_k w(q_k) ℓ_k of 000 Def 5.37 /
        7.1 (ℓ_k = −y_k log p_k) weights each class's term of a row's target distribution y,
        so :meth:`output_loss` takes one weight per class, not per row. With one-hot targets
        that is w(q_y)·(−log p_y); with label smoothing every class of a row has a share of
        its target and counts with its own weight. None without grades.

        The class ids are checked against the grades (two reads of the targets); inside
        :func:`graded.checks.checked_inputs`, where the data were checked once (the trainer
        asks for the grades of all its training data when it is built), they are not: on a
        GPU a step then does not wait for the device here."""
        if output_grades is None:
            return None
        targets = batch["targets"]
        if output_grades.dim() != 1:
            raise ValueError(f"output_grades of shape {tuple(output_grades.shape)}; expected "
                             "one grade per class")
        if inputs_checked():
            return output_grades.to(targets.device)
        top = int(targets.max()) if targets.numel() else -1
        if targets.numel() and int(targets.min()) < 0:
            raise ValueError(f"'targets': class ids in [{int(targets.min())}, {top}]; expected "
                             "ids ≥ 0 (a classification target has no ignore value)")
        if output_grades.dim() != 1 or top >= output_grades.shape[0]:
            raise ValueError(f"output_grades of shape {tuple(output_grades.shape)}; expected "
                             f"one grade per class, at least {top + 1}")
        return output_grades.to(targets.device)

    def check_loss_grades(self, model: nn.Module, grades: Tensor) -> None:
        """One grade per class of ``model``'s head: the graded loss weights every class's
        term (with label smoothing, each class of every row), so the task's ``output_grades``
        must have as many entries as the model has classes (a model of unknown shape is not
        checked)."""
        classes = _num_outputs(model)
        if classes is not None and tuple(grades.shape) != (classes,):
            raise ValueError(f"output_grades of shape {tuple(grades.shape)}; the model has "
                             f"{classes} classes: expected one grade per class, ({classes},)")

    def output_loss(self, output: Tensor, batch: Batch, *, label_smoothing: float = 0.0,
                    weights: Tensor | None = None, count: int | None = None) -> LossSum:
        targets = batch["targets"]
        if targets.dim() != 1:
            raise ValueError(f"classification needs (B,) class targets, got shape "
                             f"{tuple(targets.shape)}")
        if weights is not None:
            return LossSum(_class_weighted_sum(_widened(output), targets, weights, label_smoothing),
                           self._count(batch, count))
        per_row = sequence_cross_entropy(_widened(output), targets, ignore_index=_NO_IGNORED_CLASS,
                                         label_smoothing=label_smoothing, reduction="none")
        return LossSum(per_row.sum(), self._count(batch, count))

    def baselines(self, train: TaskDataset, test: TaskDataset, *, k: int = 5
                  ) -> dict[str, Tensor]:
        return B.classification_baselines(train, test, k=k)

    def _answer(self, out: Tensor) -> dict[str, Any]:
        probs = out.float().softmax(-1)
        return {"class": int(probs.argmax()),
                "probabilities": [round(float(p), 4) for p in probs]}


class Regression(Classification):
    """Real targets from an encoder with pooling; the loss is the squared error."""

    name = "regression"
    metric_names = ("mse", "mae", "r2")
    grades_source = "the task's output_grades, one per target column"

    def check_data(self, model: nn.Module, data: Batch) -> bool:
        """:meth:`TaskKind.check_data`, and the targets: real values, finite (a NaN target made
        the training loss NaN, reported as a learning rate too high, and the evaluation's
        loss NaN), so that a bad target fails here, naming its range."""
        checked = TaskKind.check_data(self, model, data)
        targets = data.get("targets")
        if targets is not None and targets.is_floating_point():
            check_finite(targets, "'targets': regression values")
        return checked

    def check_options(self, *, label_smoothing: float) -> None:
        if label_smoothing:
            raise ValueError(f"train.label_smoothing={label_smoothing}: the regression loss is "
                             "the squared error, which has no label smoothing; expected 0")

    def loss_count(self, batch: Batch) -> int:
        return int(batch["targets"].numel())

    def check_loss_grades(self, model: nn.Module, grades: Tensor) -> None:
        """Nothing more to check: :meth:`loss_grades` checked one grade per target column."""

    def loss_grades(self, batch: Batch, output_grades: Tensor | None = None) -> Tensor | None:
        """The grade of each target element: ``output_grades[k]`` for column k. None without
        grades."""
        if output_grades is None:
            return None
        targets = batch["targets"]
        columns = targets.shape[-1] if targets.dim() > 1 else 1
        if tuple(output_grades.shape) != (columns,):
            raise ValueError(f"output_grades of shape {tuple(output_grades.shape)}; expected "
                             f"one grade per target column, ({columns},)")
        return output_grades.to(targets.device).expand(targets.shape)

    def output_loss(self, output: Tensor, batch: Batch, *, label_smoothing: float = 0.0,
                    weights: Tensor | None = None, count: int | None = None) -> LossSum:
        self.check_options(label_smoothing=label_smoothing)
        targets = batch["targets"]
        values = _widened(self.raw_prediction(output, batch))
        per_element = F.mse_loss(values, targets.to(values.dtype), reduction="none")
        return LossSum(_weighted_sum(per_element, weights, "target element"),
                       self._count(batch, count))

    def prediction(self, output: Tensor, batch: Batch) -> Tensor:
        return self.raw_prediction(output, batch)

    def raw_prediction(self, output: Tensor, batch: Batch) -> Tensor:
        """The model's values shaped as the batch's targets where it holds them (checked: one
        row of values per target row); the model's output as it is otherwise, so that a
        prediction needs the inputs only."""
        targets = batch.get("targets")
        if targets is None:
            return output
        if output.numel() != targets.numel() or (
                targets.dim() and output.dim() and output.shape[0] != targets.shape[0]):
            raise ValueError(f"regression output {tuple(output.shape)} does not match targets "
                             f"{tuple(targets.shape)}: expected one row of values per target "
                             "row, as many values as targets")
        return output.reshape(targets.shape)

    def baselines(self, train: TaskDataset, test: TaskDataset, *, k: int = 5
                  ) -> dict[str, Tensor]:
        return B.regression_baselines(train, test, k=k)

    def _answer(self, out: Tensor) -> dict[str, Any]:
        return {"prediction": out.tolist()}


def _class_weighted_sum(logits: Tensor, targets: Tensor, weights: Tensor,
                        label_smoothing: float) -> Tensor:
    """Σ_i Σ_k w_k·y_ik·(−log p_ik), the graded cross-entropy of 000 Def 5.37 / 7.1 over the
    rows, with the class weights ``weights`` (C,) and each row's target distribution
    y_i = (1 − ε)·one_hot(t_i) + ε/C (002 §6.4): (1 − ε)·w_t·(−log p_t) + (ε/C)·Σ_k w_k·(−log p_k)
    a row. Without smoothing it is w_t times the plain cross-entropy of the row. The class ids
    index the weights as int64, whatever integer dtype the targets have (the cross-entropy
    takes them all): a uint8 index would be read as a mask of the rows, an int16 one refused."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    classes = logits.shape[-1]
    if tuple(weights.shape) != (classes,):
        raise ValueError(f"loss weights of shape {tuple(weights.shape)}; expected one per "
                         f"class, ({classes},), the model's outputs (the weights of the task's "
                         "output_grades, one grade per class)")
    w = weights.to(logits.dtype)
    nll = sequence_cross_entropy(logits, targets, ignore_index=_NO_IGNORED_CLASS,
                                 reduction="none")
    per_row = w[targets.long()] * nll
    if label_smoothing:
        spread = -(F.log_softmax(logits, -1) * w).sum(-1)
        per_row = (1.0 - label_smoothing) * per_row + (label_smoothing / classes) * spread
    return per_row.sum()


def _num_outputs(model: nn.Module) -> int | None:
    """The number of outputs of an encoder model's head (``TransformerClassifier``); None for
    a model of unknown shape."""
    proj = getattr(getattr(model, "head", None), "proj", None)
    n = getattr(proj, "out_features", None)
    return n if isinstance(n, int) else None
