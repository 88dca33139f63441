"""The sequence kinds: next-token prediction (:class:`LM`), translation (:class:`Seq2Seq`)
and the morphic LM of 004 (:class:`MorphicLM`), which trains through the model's own loss."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graded.checks import check_id_range
from graded.evaluation import baselines as B
from graded.kinds.base import (
    Batch,
    LossSum,
    MorphicModel,
    TaskKind,
    _check_one_prompt,
    _token_grades,
    _tokens,
    _vocabulary,
    _weighted_sum,
    _widened,
)
from graded.prompt_grading import prompt_grading
from graded.tasks.base import IGNORE_INDEX, TaskDataset
from graded.train.losses import sequence_cross_entropy


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
        return self.model_class()(model_config)

    def model_class(self) -> type[nn.Module] | None:
        from graded.transformer import TransformerLM

        return TransformerLM

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
        per_token = sequence_cross_entropy(_widened(output), targets, ignore_index=IGNORE_INDEX,
                                           label_smoothing=label_smoothing, reduction="none")
        return LossSum(_weighted_sum(per_token, weights, "target token"), self._count(batch, count))

    def metrics_for(self, data: Batch | TaskDataset) -> tuple[str, ...]:
        """Token accuracy and exact match, and ``masked_token_accuracy`` over the positions of
        ``metric_mask`` when the data has one (e.g. Dyck's closing brackets)."""
        extra = ("masked_token_accuracy",) if "metric_mask" in data else ()
        return self.metric_names + extra

    def report(self, loss: float, predictions: Tensor, data: Batch | TaskDataset
               ) -> dict[str, float]:
        return {**super().report(loss, predictions, data), "perplexity": _perplexity(loss)}

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
        pad, eos = task.vocab.pad_id, task.info().get("eos_id")
        if pad != eos:  # padding is never a target: a generated one would vanish from the text
            sampling = {**sampling,
                        "bad_words_ids": [*(sampling.get("bad_words_ids") or []), [pad]]}
        out = model.generate(ids, max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                             **self._start(task), **grading, **sampling)
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

    def model_class(self) -> type[nn.Module] | None:
        from graded.transformer import Seq2SeqTransformer

        return Seq2SeqTransformer

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

    def model_class(self) -> type[nn.Module] | None:
        return None  # a MorphicConfig, not a TransformerConfig

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


def _perplexity(loss: float) -> float:
    """exp(loss), the perplexity of a token-mean cross-entropy; inf where it overflows a float
    (a loss above ~709), NaN for a NaN loss."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


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
