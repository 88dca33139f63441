"""Evaluation and prediction over a whole dataset, batch by batch, for any task kind.

The kind (:mod:`graded.kinds`, a name or a kind object) says how to call the model, what the
loss sums and which metrics to report; here the batches are run under ``torch.no_grad`` in eval
mode. The loss is the sum over all batches divided by the total count (tokens, rows or
elements), and the metrics are those of :mod:`graded.evaluation.metrics` on the predictions of
all batches together, so no figure depends on the batch size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn

from graded.kinds import TaskKind, as_kind
from graded.train.data import Batch, iterate


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Mapping[str, Tensor],
    kind: str | TaskKind,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Loss and the kind's metrics over all of ``data``.

    lm / seq2seq: ``loss`` (token mean), ``perplexity``, ``token_accuracy``, ``exact_match``
    and, when the data has a ``metric_mask`` (e.g. Dyck's closing brackets),
    ``masked_token_accuracy``; classification: ``loss``, ``accuracy``; regression: ``loss``
    (the mean squared error), ``mse``, ``mae``, ``r2`` (definitions:
    :func:`graded.evaluation.compute_metric`).
    """
    kind = as_kind(kind, model)
    total, count, preds = 0.0, 0, []
    for batch, out in _outputs(model, data, kind, batch_size, device):
        part = kind.output_loss(out, batch)
        total += float(part.total)
        count += part.count
        preds.append(kind.prediction(out, batch).cpu())
    return kind.report(total / max(count, 1), torch.cat(preds), data)


@torch.no_grad()
def predict(
    model: nn.Module,
    data: Mapping[str, Tensor],
    kind: str | TaskKind,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Model outputs on all of ``data`` (logits, or values shaped like ``targets``), on CPU."""
    kind = as_kind(kind, model)
    return torch.cat([kind.raw_prediction(out, batch).float().cpu()
                      for batch, out in _outputs(model, data, kind, batch_size, device)])


def _outputs(model: nn.Module, data: Mapping[str, Tensor], kind: TaskKind, batch_size: int,
             device: torch.device | str) -> Iterator[tuple[Batch, Tensor]]:
    """Each batch of ``data`` with the model's output on it, in eval mode (restored after)."""
    was_training = model.training
    model.eval()
    try:
        for batch in iterate(data, batch_size, torch.device(device)):
            yield batch, kind.forward(model, batch)
    finally:
        model.train(was_training)
