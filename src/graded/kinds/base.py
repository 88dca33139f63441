"""The base of the task kinds: :class:`TaskKind`, the sum-and-count :class:`LossSum` of a loss,
the :class:`MorphicModel` protocol, and the registry the kinds enter (:mod:`graded.kinds`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from graded.checks import check_finite, check_finite_nonnegative, check_id_range
from graded.evaluation.metrics import compute_metric
from graded.prompt_grading import prompt_grading
from graded.tasks.base import TaskDataset

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


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


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
        """Register ``cls`` under (name, architecture) when it sets either of them itself.

        A subclass that sets neither (a helper between a kind and its variants) inherits its
        parent's name and is not registered, so it does not replace the parent's kind. A name
        taken by another class is refused, naming both classes; the same class defined again
        (its module reloaded) replaces its earlier definition."""
        super().__init_subclass__(**kwargs)
        if "name" not in vars(cls) and "architecture" not in vars(cls):
            return
        if not isinstance(cls.name, str) or not isinstance(cls.architecture, str):
            raise TypeError(f"task kind {cls.__qualname__}: name and architecture must be "
                            f"strings, got name={cls.name!r}, "
                            f"architecture={cls.architecture!r}")
        if not cls.name:
            return
        key = (cls.name, cls.architecture)
        existing = _REGISTRY.get(key)
        if existing is not None and _qualified(type(existing)) != _qualified(cls):
            raise ValueError(f"task kind {cls.name!r} ({cls.architecture!r} architecture) is "
                             f"already registered to {_qualified(type(existing))}; "
                             f"{_qualified(cls)} needs another name")
        _REGISTRY[key] = cls()

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
        the token ids of the input keys against its vocabulary, real input features (finite:
        a NaN or ∞ feature made the first step's loss NaN, reported as a learning rate too
        high) and token grades (finite, ≥ 0); ValueError naming the key and the range found.
        True when nothing is left to check, so that the steps may run inside
        :func:`graded.checks.checked_inputs` (no value read, no wait for a GPU); False where
        the model's vocabulary is unknown."""
        vocab = _vocabulary(model)
        checked = True
        for key in self.input_keys:
            ids = data.get(key)
            if ids is not None and ids.is_floating_point():
                check_finite(ids, f"{key!r}: features")
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

    def model_class(self) -> type[nn.Module] | None:
        """The class of the model :meth:`build_model` makes from a
        :class:`~graded.transformer.TransformerConfig`, whose ``UNREAD_FIELDS`` a run config
        may not set (:func:`graded.transformer.models.unread_fields`); None for a kind whose
        model takes another config."""
        return None

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
        """The grades q of the loss items of ``batch``, shaped as its targets (classification:
        one per class, as each class's term of a row's target distribution is weighted), that
        the graded loss weights (module docstring); None where the items carry none.
        ``output_grades`` are the task's grades of its output coordinates
        (``Task.output_grades``)."""
        return None

    def check_loss_grades(self, model: nn.Module, grades: Tensor) -> None:
        """Refuse the grades of :meth:`loss_grades` that do not fit ``model`` (checked once,
        when a trainer is built); every kind's grades fit the batch they were read from."""

    def output_loss(self, output: Tensor, batch: Batch, *, label_smoothing: float = 0.0,
                    weights: Tensor | None = None, count: int | None = None) -> LossSum:
        """The summed loss of a model ``output`` against ``batch["targets"]``; ``weights``,
        shaped as :meth:`loss_grades`'s grades, weight each item's loss: Σ w·ℓ, the
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
        """What the metrics read from an output: class or token ids (argmax), as float64 with
        NaN where an entry's logits hold a NaN, so that the metrics score it NaN as they do
        its logits (:mod:`graded.evaluation.metrics`): ``argmax`` takes a NaN for the largest
        logit, and the all-NaN logits of a diverged model were scored as guesses (accuracy
        2/3 beside a NaN loss). Since it does, an entry's logits hold a NaN exactly where the
        logit it picks is one: marked from that, without a read of the device or a mask the
        size of the logits (float64 holds every id exactly)."""
        ids = output.argmax(-1)
        if not output.is_floating_point():
            return ids
        picked = output.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        return ids.double().masked_fill(picked.isnan(), math.nan)

    def raw_prediction(self, output: Tensor, batch: Batch) -> Tensor:
        """The output as :func:`graded.train.predict` returns it (logits, or a regression's
        values, shaped as the batch's targets where it holds them); no kind needs targets."""
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


def _widened(output: Tensor) -> Tensor:
    """A model output in float32 at least, the precision its loss is computed in: half
    precision widened, float64 kept (``.float()`` rounded a float64 model's loss to float32: a
    regression error of 8e-6 about targets near 1e8 read 0.0)."""
    return output.to(torch.promote_types(output.dtype, torch.float32))


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
