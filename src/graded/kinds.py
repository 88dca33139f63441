"""Task kinds: batch keys, model factory, forward, loss, metrics, baselines and generation.

A task kind says what a batch holds and how a model meets it (the tensors are those of
:mod:`graded.tasks.base`):

============== =========================================== ========================= ===========
kind           inputs (+ ``key_padding_mask``)             targets                   loss counts
============== =========================================== ========================= ===========
lm             ``inputs`` (B,T) ids                        (B,T), -100 = ignore      tokens
seq2seq        ``inputs`` (B,S), ``decoder_inputs`` (B,T)  (B,T), -100 = ignore      tokens
classification ``inputs`` (B,T) ids or (B,T,F) features    (B,) class ids            rows
regression     ``inputs`` (B,T) ids or (B,T,F) features    (B,) or (B,K) floats      elements
============== =========================================== ========================= ===========

Every kind returns its training loss as a sum and the number of items summed (:class:`LossSum`),
so a caller averages by count over any batches it likes: the trainer's step objective is the
mean over every token of the global batch, whatever the split into ranks and micro-batches.
Losses are cross-entropy (002 §6, with the label smoothing of 002 §6.4) or squared error; the
metrics are those of :mod:`graded.evaluation.metrics`, computed once on the predictions
collected over all batches. ``forward`` never reads the targets.

The graded loss of the training recipes (000 Def 5.37 / 7.1, :mod:`graded.train.recipes`)
weights each loss item by w(q) of its grade q: :meth:`TaskKind.loss_grades` gives the grades of
the items, shaped as the targets (the target tokens' grades for lm and seq2seq, the task's
``output_grades`` of each target column for regression, of the true class for
classification), and ``loss(..., weights=w)`` sums w·ℓ over the items, the count unchanged.

A morphic LM (004) is an LM whose model follows :class:`MorphicModel`: it is trained through
its own ``training_loss`` (the LM loss plus its router terms, 004 §4.3) and evaluated through
``model(inputs, key_padding_mask)`` like any LM.

Adding a kind is adding one subclass of :class:`TaskKind` here with a new ``name`` (or a new
``architecture`` for an existing name); it registers itself (docs/training.md, "How to extend").

The grades a model that grades tokens needs to answer a prompt come from
:mod:`graded.prompt_grading`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graded.checks import check_finite_nonnegative, check_id_range
from graded.evaluation import baselines as B
from graded.evaluation.metrics import compute_metric
from graded.prompt_grading import prompt_grading
from graded.tasks.base import IGNORE_INDEX, TaskDataset
from graded.train.losses import sequence_cross_entropy

Batch = Mapping[str, Tensor]


def _token_grades(model: nn.Module, batch: Batch, key: str) -> dict[str, Tensor]:
    """``{key: batch[key]}`` for a model that grades tokens, which needs them; {} otherwise."""
    if not getattr(getattr(model, "config", None), "token_grading", False):
        return {}
    if key not in batch:
        raise ValueError(f"the model grades tokens (TransformerConfig.token_grading=True) but "
                         f"the batch has no {key!r}; use a task whose graded_object is "
                         "'tokens' (it provides them)")
    return {key: batch[key]}


@runtime_checkable
class MorphicModel(Protocol):
    """A model trained through its own loss (the morphic models of 004, :mod:`graded.morphic`).

    ``forward`` returns (B, T, V) logits from the inputs alone; ``training_loss`` returns the
    loss to minimise, a mean over the scored (target != ignore) tokens, and float metrics;
    both honour ``key_padding_mask`` (True = padding).
    """

    def forward(self, input_ids: Tensor, key_padding_mask: Tensor | None = None) -> Tensor: ...

    def training_loss(self, input_ids: Tensor, targets: Tensor,
                      key_padding_mask: Tensor | None = None
                      ) -> tuple[Tensor, dict[str, float]]: ...

    def generate(self, input_ids: Tensor, max_new_tokens: int, **sampling: Any) -> Tensor: ...


@dataclass
class LossSum:
    """A loss summed over ``count`` items (tokens, rows or elements) and extra metrics (floats,
    or 0-dim tensors that the trainer reads with others in one transfer).

    ``total`` keeps its graph; ``total / count`` is the mean (:attr:`mean`).
    """

    total: Tensor
    count: int
    metrics: dict[str, float | Tensor] = field(default_factory=dict)

    @property
    def mean(self) -> Tensor:
        return self.total / max(self.count, 1)


_REGISTRY: dict[tuple[str, str], TaskKind] = {}


class TaskKind:
    """Base of the task kinds; a subclass with a ``name`` registers itself for :func:`get_kind`."""

    name: ClassVar[str] = ""
    architecture: ClassVar[str] = "transformer"
    input_keys: ClassVar[tuple[str, ...]] = ("inputs",)
    optional_keys: ClassVar[tuple[str, ...]] = ("key_padding_mask", "token_grades")
    #: The batch keys of padding masks (True = padding).
    padding_keys: ClassVar[tuple[str, ...]] = ("key_padding_mask",)
    metric_names: ClassVar[tuple[str, ...]] = ()
    #: Whether :meth:`generate` continues the prompt with new tokens (the sequence kinds);
    #: the others answer from the prompt alone.
    generates_tokens: ClassVar[bool] = False
    #: Where the grades of the loss items come from (:meth:`loss_grades`), for messages.
    grades_source: ClassVar[str] = "no grades"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            _REGISTRY[(cls.name, cls.architecture)] = cls()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, architecture={self.architecture!r})"

    # ---- batches -----------------------------------------------------------------------
    @property
    def required_keys(self) -> tuple[str, ...]:
        """The keys every training batch has: the model inputs and ``targets``."""
        return (*self.input_keys, "targets")

    def check_batch(self, batch: Batch, *, targets: bool = True) -> None:
        """ValueError naming the missing keys when ``batch`` lacks a required one (only the
        input keys when ``targets`` is False)."""
        need = self.required_keys if targets else self.input_keys
        missing = [k for k in need if k not in batch]
        if missing:
            raise ValueError(f"a {self.name!r} batch needs keys {list(need)}; "
                             f"missing {missing}, got {sorted(batch)}")

    def check_data(self, model: nn.Module, data: Batch) -> bool:
        """Check once, on the host, the values ``model`` would check in every forward pass:
        the token ids of the input keys against its vocabulary, and token grades (finite,
        ≥ 0); ValueError naming the key and the range found. True when nothing is left to
        check, so that the steps may run inside :func:`graded.checks.checked_inputs` (no
        value read, no wait for a GPU); False where the model's vocabulary is unknown."""
        vocab = _vocabulary(model)
        checked = True
        for key in self.input_keys:
            ids = data.get(key)
            if ids is None or ids.dtype not in (torch.int64, torch.int32):
                continue  # features; a missing key fails in check_batch
            if vocab is None:
                checked = False
                continue
            check_id_range(ids, vocab, f"{key!r}: token ids")
        for key in ("token_grades", "decoder_token_grades"):
            if key in data:
                check_finite_nonnegative(data[key], repr(key))
        return checked

    def drop_empty_padding(self, batch: Batch) -> Batch:
        """``batch`` without its padding masks that mask nothing, read where they are on the
        host: a model inside :func:`graded.checks.checked_inputs` takes a mask as given, and
        without one it runs the fused kernels' mask-free path (the same outputs)."""
        empty = [k for k in self.padding_keys if k in batch and batch[k].device.type == "cpu"
                 and not bool(batch[k].any())]
        return {k: v for k, v in batch.items() if k not in empty} if empty else batch

    def count_items(self, batch: Batch) -> int:
        """Input tokens in ``batch``, padding excluded (the tokens/s figure)."""
        return _tokens(batch["inputs"], batch.get("key_padding_mask"))

    # ---- model -------------------------------------------------------------------------
    def build_model(self, model_config: Any, task: Any, *, pooling: str = "mean") -> nn.Module:
        """The kind's model for ``task`` from ``model_config``; ``pooling`` is used by the
        encoder kinds (classification, regression) only."""
        raise NotImplementedError(f"{self!r} has no model factory")

    def training_module(self, model: nn.Module) -> nn.Module:
        """The module whose ``forward`` the training step calls (what DDP wraps)."""
        return model

    def check_options(self, *, label_smoothing: float) -> None:
        """ValueError naming a training option the kind cannot honour (the trainer asks when
        it is built, before anything is written or trained)."""

    def forward(self, model: nn.Module, batch: Batch) -> Tensor:
        """The model's output on ``batch``; ``key_padding_mask`` is passed when present, and
        ``token_grades`` to a model that grades tokens (``TransformerConfig.token_grading``)."""
        self.check_batch(batch, targets=False)
        mask = batch.get("key_padding_mask")
        extra = _token_grades(model, batch, "token_grades")
        if mask is None and not extra:
            return model(batch["inputs"])
        return model(batch["inputs"], mask, **extra)

    # ---- loss --------------------------------------------------------------------------
    def loss_count(self, batch: Batch) -> int:
        """How many items the loss of ``batch`` sums over; reads ``batch["targets"]`` only
        (the trainer counts a step's items before it moves the batches to the device)."""
        raise NotImplementedError

    def loss_grades(self, batch: Batch, output_grades: Tensor | None = None) -> Tensor | None:
        """The grades q of the loss items of ``batch``, shaped as its targets, that the graded
        loss weights (module docstring); None where the items carry none. ``output_grades``
        are the task's grades of its output coordinates (``Task.output_grades``)."""
        return None

    def output_loss(self, output: Tensor, batch: Batch, *, label_smoothing: float = 0.0,
                    weights: Tensor | None = None, count: int | None = None) -> LossSum:
        """The summed loss of a model ``output`` against ``batch["targets"]``; ``weights``,
        shaped as the targets (:meth:`loss_grades`), weight each item's loss: Σ w·ℓ, the
        count staying the number of items, so weights all 1 give the plain loss exactly.
        ``count``, when given, is :meth:`loss_count` of the batch counted by the caller (the
        trainer counts on the host: counting targets on a GPU waits for it)."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch, *, label_smoothing: float = 0.0,
             weights: Tensor | None = None, count: int | None = None) -> LossSum:
        """The training loss of ``model`` on ``batch`` as a sum and a count; ``weights`` and
        ``count`` as :meth:`output_loss`'s."""
        self.check_batch(batch)
        return self.output_loss(self.forward(model, batch), batch,
                                label_smoothing=label_smoothing, weights=weights, count=count)

    def _count(self, batch: Batch, count: int | None) -> int:
        """``count`` when the caller counted the items, else :meth:`loss_count`."""
        return self.loss_count(batch) if count is None else count

    # ---- evaluation --------------------------------------------------------------------
    def prediction(self, output: Tensor, batch: Batch) -> Tensor:
        """What the metrics read from an output: class or token ids (argmax)."""
        return output.argmax(-1)

    def raw_prediction(self, output: Tensor, batch: Batch) -> Tensor:
        """The output as :func:`graded.train.predict` returns it (logits, or shaped values)."""
        return output

    def report(self, loss: float, predictions: Tensor, data: Batch | TaskDataset
               ) -> dict[str, float]:
        """``loss`` (the mean over all items) and the kind's metrics on all of ``data``."""
        return {"loss": loss, **{n: compute_metric(n, predictions, data)
                                 for n in self.metrics_for(data)}}

    def metrics_for(self, data: Batch | TaskDataset) -> tuple[str, ...]:
        """The metrics of the kind :meth:`report` gives on ``data``."""
        return self.metric_names

    def report_names(self, data: Batch | TaskDataset) -> tuple[str, ...]:
        """Every name :meth:`report` returns on ``data``: what ``TrainOptions.monitor`` may
        pick."""
        return ("loss", *self.metrics_for(data))

    def baselines(self, train: TaskDataset, test: TaskDataset, *, k: int = 5
                  ) -> dict[str, Tensor]:
        """Test predictions of the kind's trivial predictors (003 §3.2), by baseline name."""
        raise NotImplementedError(f"{self!r} has no baselines")

    # ---- generation --------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, model: nn.Module, task: Any, ids: Tensor, max_new_tokens: int,
                 **sampling: Any) -> str | dict[str, Any]:
        """The model's answer to a one-row prompt ``ids`` (1, T): decoded text for sequence
        kinds (``sampling``: the options of ``model.generate``), the predicted class and its
        probabilities or the predicted values for the others (which use neither
        ``max_new_tokens`` nor ``sampling``)."""
        _check_one_prompt(ids)
        grading = prompt_grading(model, task, ids, continues=False)
        out = model(ids, **grading)[0]
        return self._answer(out)

    def _answer(self, out: Tensor) -> dict[str, Any]:
        raise NotImplementedError


class LM(TaskKind):
    """Next-token prediction with a decoder-only model (003 §2)."""

    name = "lm"
    optional_keys = ("key_padding_mask", "loss_mask", "metric_mask", "token_grades")
    metric_names = ("token_accuracy", "exact_match")
    generates_tokens = True
    grades_source = ("the grades of the target tokens, token_grades (from a task whose "
                     "graded_object is 'tokens')")
    #: The batch key of the grades of the tokens the targets are read from.
    token_grades_key: ClassVar[str] = "token_grades"

    def build_model(self, model_config: Any, task: Any, *, pooling: str = "mean") -> nn.Module:
        from graded.transformer import TransformerLM

        return TransformerLM(model_config)

    def check_data(self, model: nn.Module, data: Batch) -> bool:
        """:meth:`TaskKind.check_data`, and the targets: token ids in [0, vocabulary) where
        they are scored (``IGNORE_INDEX`` elsewhere), so that a bad target fails here, naming
        its range, rather than in a step (on a GPU, as a device assertion of the loss)."""
        checked = super().check_data(model, data)
        vocab, targets = _vocabulary(model), data.get("targets")
        if vocab is not None and targets is not None:
            check_id_range(targets[targets != IGNORE_INDEX], vocab, "'targets': token ids")
        return checked

    def loss_count(self, batch: Batch) -> int:
        return int((batch["targets"] != IGNORE_INDEX).sum())

    def loss_grades(self, batch: Batch, output_grades: Tensor | None = None) -> Tensor | None:
        """The grade of each target token: ``token_grades`` are aligned with the inputs and the
        target at t is the token at t + 1, so it takes ``token_grades[:, t + 1]``; the last
        position's target, the sequence's final token (``<eos>`` in the library's tasks, grade
        0 as every special token), takes 0. None without ``token_grades``."""
        grades = batch.get(self.token_grades_key)
        if grades is None:
            return None
        return F.pad(grades[:, 1:], (0, 1))

    def output_loss(self, output: Tensor, batch: Batch, *, label_smoothing: float = 0.0,
                    weights: Tensor | None = None, count: int | None = None) -> LossSum:
        targets = batch["targets"]
        per_token = sequence_cross_entropy(output.float(), targets, ignore_index=IGNORE_INDEX,
                                           label_smoothing=label_smoothing, reduction="none")
        return LossSum(_weighted_sum(per_token, weights, "target token"), self._count(batch, count))

    def metrics_for(self, data: Batch | TaskDataset) -> tuple[str, ...]:
        """Token accuracy and exact match, and ``masked_token_accuracy`` over the positions of
        ``metric_mask`` when the data has one (e.g. Dyck's closing brackets)."""
        extra = ("masked_token_accuracy",) if "metric_mask" in data else ()
        return self.metric_names + extra

    def report(self, loss: float, predictions: Tensor, data: Batch | TaskDataset
               ) -> dict[str, float]:
        return {**super().report(loss, predictions, data),
                "perplexity": math.exp(min(loss, 50.0))}

    def report_names(self, data: Batch | TaskDataset) -> tuple[str, ...]:
        return (*super().report_names(data), "perplexity")

    def baselines(self, train: TaskDataset, test: TaskDataset, *, k: int = 5
                  ) -> dict[str, Tensor]:
        return B.sequence_baselines(train, test, encoder_decoder=False)

    @torch.no_grad()
    def generate(self, model: nn.Module, task: Any, ids: Tensor, max_new_tokens: int,
                 **sampling: Any) -> str:
        _check_one_prompt(ids)
        grading = prompt_grading(model, task, ids, continues=max_new_tokens > 0 or bool(
            self._start(task)))
        out = model.generate(ids, max_new_tokens, eos_token_id=task.info().get("eos_id"),
                             pad_token_id=task.vocab.pad_id, **self._start(task), **grading,
                             **sampling)
        return task.vocab.decode_str(out[0])

    def _start(self, task: Any) -> dict[str, int]:
        """What the decoder starts from besides the prompt (nothing: it continues it)."""
        return {}


class Seq2Seq(LM):
    """Source-to-target translation with an encoder-decoder (002 Ch. 3)."""

    name = "seq2seq"
    input_keys = ("inputs", "decoder_inputs")
    optional_keys = ("key_padding_mask", "decoder_key_padding_mask", "loss_mask",
                     "metric_mask", "token_grades", "decoder_token_grades")
    padding_keys = ("key_padding_mask", "decoder_key_padding_mask")
    grades_source = ("the grades of the target tokens, decoder_token_grades (from a task "
                     "whose graded_object is 'tokens')")
    token_grades_key = "decoder_token_grades"

    def build_model(self, model_config: Any, task: Any, *, pooling: str = "mean") -> nn.Module:
        from graded.transformer import Seq2SeqTransformer

        return Seq2SeqTransformer(model_config)

    def count_items(self, batch: Batch) -> int:
        return super().count_items(batch) + _tokens(batch["decoder_inputs"],
                                                    batch.get("decoder_key_padding_mask"))

    def forward(self, model: nn.Module, batch: Batch) -> Tensor:
        self.check_batch(batch, targets=False)
        return model(batch["inputs"], batch["decoder_inputs"],
                     src_key_padding_mask=batch.get("key_padding_mask"),
                     tgt_key_padding_mask=batch.get("decoder_key_padding_mask"),
                     **_token_grades(model, batch, "token_grades"),
                     **_token_grades(model, batch, "decoder_token_grades"))

    def baselines(self, train: TaskDataset, test: TaskDataset, *, k: int = 5
                  ) -> dict[str, Tensor]:
        return B.sequence_baselines(train, test, encoder_decoder=True)

    def _start(self, task: Any) -> dict[str, int]:
        """The decoder starts from ``<bos>``; the prompt is the source."""
        return {"bos_token_id": task.info()["bos_id"]}


class Classification(TaskKind):
    """One class per example from an encoder with pooling."""

    name = "classification"
    metric_names = ("accuracy",)
    grades_source = "the task's output_grades, one per class"

    def build_model(self, model_config: Any, task: Any, *, pooling: str = "mean") -> nn.Module:
        from graded.transformer import TransformerClassifier

        return TransformerClassifier(model_config, task.num_outputs, pooling=pooling)

    def loss_count(self, batch: Batch) -> int:
        return int(batch["targets"].shape[0])

    def loss_grades(self, batch: Batch, output_grades: Tensor | None = None) -> Tensor | None:
        """The grade of each row's true class: with one-hot targets Σ_k w(q_k) ℓ_k of 000
        Def 5.37 / 7.1 (ℓ_k = −y_k log p_k) is w(q_y)·(−log p_y). None without grades."""
        if output_grades is None:
            return None
        targets = batch["targets"]
        top = int(targets.max()) if targets.numel() else -1
        if output_grades.dim() != 1 or top >= output_grades.shape[0]:
            raise ValueError(f"output_grades of shape {tuple(output_grades.shape)}; expected "
                             f"one grade per class, at least {top + 1}")
        return output_grades.to(targets.device)[targets]

    def output_loss(self, output: Tensor, batch: Batch, *, label_smoothing: float = 0.0,
                    weights: Tensor | None = None, count: int | None = None) -> LossSum:
        targets = batch["targets"]
        if targets.dim() != 1:
            raise ValueError(f"classification needs (B,) class targets, got shape "
                             f"{tuple(targets.shape)}")
        per_row = sequence_cross_entropy(output.float(), targets,
                                         label_smoothing=label_smoothing, reduction="none")
        return LossSum(_weighted_sum(per_row, weights, "row"), self._count(batch, count))

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

    def loss_count(self, batch: Batch) -> int:
        return int(batch["targets"].numel())

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
        targets = batch["targets"]
        per_element = F.mse_loss(self.raw_prediction(output, batch).float(), targets.float(),
                                 reduction="none")
        return LossSum(_weighted_sum(per_element, weights, "target element"),
                       self._count(batch, count))

    def prediction(self, output: Tensor, batch: Batch) -> Tensor:
        return self.raw_prediction(output, batch)

    def raw_prediction(self, output: Tensor, batch: Batch) -> Tensor:
        targets = batch["targets"]
        if output.numel() != targets.numel():
            raise ValueError(f"regression output {tuple(output.shape)} does not match targets "
                             f"{tuple(targets.shape)}")
        return output.reshape(targets.shape)

    def baselines(self, train: TaskDataset, test: TaskDataset, *, k: int = 5
                  ) -> dict[str, Tensor]:
        return B.regression_baselines(train, test, k=k)

    def _answer(self, out: Tensor) -> dict[str, Any]:
        return {"prediction": out.tolist()}


class MorphicLM(LM):
    """A morphic LM (004): trained through ``model.training_loss`` (its LM loss plus router
    terms, each a mean over the scored tokens), evaluated and generated like any LM.

    The loss sum is that mean times the scored-token count; averaging by count over ranks and
    micro-batches gives the global token mean of every term that is a token mean (Ω's group
    lasso, a norm over the batch, is not one: it is weighted like the others).
    """

    architecture = "morphic"
    grades_source = "no grades (it trains through the model's own loss)"

    def check_data(self, model: nn.Module, data: Batch) -> bool:
        """:meth:`TaskKind.check_data`, and the padding: right padding only (the model is
        causal), checked here once instead of in every step."""
        from graded.morphic.model import check_right_padding

        checked = super().check_data(model, data)
        if "key_padding_mask" in data and "inputs" in data:
            check_right_padding(data["key_padding_mask"], data["inputs"])
        return checked

    def build_model(self, model_config: Any, task: Any, *, pooling: str = "mean") -> nn.Module:
        from graded.morphic import build_morphic_model

        return build_morphic_model(model_config)

    def training_module(self, model: nn.Module) -> nn.Module:
        return _TrainingLoss(model)

    def check_options(self, *, label_smoothing: float) -> None:
        if label_smoothing:
            raise ValueError(f"train.label_smoothing={label_smoothing}: a morphic LM trains "
                             "through its own loss, which has no label smoothing; expected 0")

    def loss_grades(self, batch: Batch, output_grades: Tensor | None = None) -> Tensor | None:
        return None

    def loss(self, model: nn.Module, batch: Batch, *, label_smoothing: float = 0.0,
             weights: Tensor | None = None, count: int | None = None) -> LossSum:
        if weights is not None:
            raise ValueError("a morphic LM trains through its own loss: it takes no loss weights")
        if label_smoothing:
            raise ValueError(f"a morphic LM trains through its own loss: label_smoothing must "
                             f"be 0, got {label_smoothing}")
        self.check_batch(batch)
        call = model.training_loss if isinstance(model, MorphicModel) else model
        mean, metrics = call(batch["inputs"], batch["targets"], batch.get("key_padding_mask"))
        n = self._count(batch, count)
        extra = {k: v.detach() if isinstance(v, Tensor) else float(v)  # read by the trainer
                 for k, v in (metrics or {}).items() if k != "loss"}
        return LossSum(mean * n, n, extra)


class _TrainingLoss(nn.Module):
    """Routes ``forward(inputs, targets, mask)`` to ``model.training_terms`` (the library's
    morphic models) or ``model.training_loss`` so DDP and ``torch.compile`` can wrap it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: Tensor, targets: Tensor, key_padding_mask: Tensor | None = None
                ) -> tuple[Tensor, dict[str, float | Tensor]]:
        # training_terms, where the model has it, reads no values: one graph under torch.compile
        call = getattr(self.model, "training_terms", None) or self.model.training_loss
        return call(inputs, targets, key_padding_mask)


def _weighted_sum(per_item: Tensor, weights: Tensor | None, item: str) -> Tensor:
    """Σ ℓ over the items, or Σ w·ℓ (the graded loss) with ``weights`` shaped as the items."""
    if weights is None:
        return per_item.sum()
    if weights.shape != per_item.shape:
        raise ValueError(f"loss weights of shape {tuple(weights.shape)}; expected one per "
                         f"{item}, {tuple(per_item.shape)}")
    return (per_item * weights.to(per_item.dtype)).sum()


def _vocabulary(model: nn.Module) -> int | None:
    """The number of token ids ``model`` embeds (its config's ``vocab_size``, or a morphic
    model's ``vocab_size``); None for a model over real features or one of unknown kind."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None) if config is not None else None
    if vocab is None:
        vocab = getattr(model, "vocab_size", None)
    return vocab if isinstance(vocab, int) else None


def _tokens(x: Tensor, mask: Tensor | None) -> int:
    if mask is not None:
        return int((~mask).sum())
    return int(x.shape[0] * (x.shape[1] if x.dim() > 1 else 1))


def _check_one_prompt(ids: Tensor) -> None:
    if ids.dim() < 2 or ids.shape[0] != 1:
        raise ValueError(f"generate takes one prompt of shape (1, T), got {tuple(ids.shape)}")


# The registry: every subclass above with a ``name`` is in it (see ``TaskKind.__init_subclass__``).
KIND_NAMES: tuple[str, ...] = tuple(dict.fromkeys(name for name, _ in _REGISTRY))
ARCHITECTURES: tuple[str, ...] = tuple(dict.fromkeys(arch for _, arch in _REGISTRY))


def get_kind(name: str, architecture: str = "transformer") -> TaskKind:
    """The kind object of task kind ``name`` for models of ``architecture``."""
    if name not in KIND_NAMES:
        raise ValueError(f"unknown task kind {name!r}; expected one of {KIND_NAMES}")
    if (name, architecture) not in _REGISTRY:
        archs = [a for n, a in _REGISTRY if n == name]
        raise ValueError(f"task kind {name!r} has no {architecture!r} architecture; "
                         f"available: {archs}")
    return _REGISTRY[(name, architecture)]


def as_kind(kind: str | TaskKind, model: nn.Module | None = None) -> TaskKind:
    """``kind`` itself, or the kind object of a name: the morphic one when ``model`` follows
    :class:`MorphicModel` (seen through a DDP wrapper), else the transformer one."""
    if isinstance(kind, TaskKind):
        return kind
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a name in {KIND_NAMES} or a TaskKind, got {kind!r}")
    inner = getattr(model, "module", model)
    return get_kind(kind, "morphic" if isinstance(inner, MorphicModel) else "transformer")


def run_baselines(train: TaskDataset, test: TaskDataset, *, metric: str | None = None,
                  k: int = 5) -> dict[str, float]:
    """Score every baseline of the datasets' kind on ``test`` after fitting on ``train``.

    ``metric`` defaults to the task's headline metric (``train.info["metric"]``).
    """
    if train.kind != test.kind:
        raise ValueError(f"train and test kinds differ: {train.kind!r} vs {test.kind!r}")
    metric = metric or train.info.get("metric")
    if metric is None:
        raise ValueError("no metric given and the dataset does not name one")
    preds = get_kind(train.kind).baselines(train, test, k=k)
    return {name: compute_metric(metric, p, test) for name, p in preds.items()}


def baseline_report(train: TaskDataset, test: TaskDataset, *, k: int = 5
                    ) -> dict[str, dict[str, float]]:
    """Every baseline of the datasets' kind, fitted on ``train``, scored on ``test`` by every
    metric the kind's evaluation reports there (:meth:`TaskKind.metrics_for`; not the loss,
    which baselines that predict labels have not): ``{baseline: {metric: value}}``, to read
    beside a model's evaluation metric by metric."""
    if train.kind != test.kind:
        raise ValueError(f"train and test kinds differ: {train.kind!r} vs {test.kind!r}")
    kind = get_kind(train.kind)
    preds = kind.baselines(train, test, k=k)
    return {name: {m: compute_metric(m, p, test) for m in kind.metrics_for(test)}
            for name, p in preds.items()}
