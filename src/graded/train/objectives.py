"""Evaluation and prediction over a whole dataset, batch by batch, for any task kind.

The kind (:mod:`graded.kinds`, a name or a kind object) says how to call the model, what the
loss sums and which metrics to report; here the batches are run under ``torch.no_grad`` in eval
mode. The loss is the sum over all batches divided by the total count (tokens, rows or
elements), and the metrics are those of :mod:`graded.evaluation.metrics` on the predictions of
all batches together, so no figure depends on the batch size.

The data are checked once (:meth:`TaskKind.check_data`) and the batches then run inside
:func:`graded.checks.checked_inputs`; each batch's loss items are counted on its host copy,
the loss summed and the predictions kept on the device and read once at the end: on a GPU an
evaluation waits for the device once, not several times per batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn

from graded.checks import check_int, checked_inputs
from graded.kinds import TaskKind, as_kind
from graded.train.data import Batch, dataset_size, to_device


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
    kind.check_batch(data)  # the targets too (predict needs only the inputs): ValueError
    total, count, preds = None, 0, []
    for host, batch, out in _outputs(model, data, kind, batch_size, device):
        n = kind.loss_count(host)  # on the host copy: no wait for the device
        part = kind.output_loss(out, batch, count=n)
        total = part.total if total is None else total + part.total
        count += n
        preds.append(kind.prediction(out, batch))
    loss = float(total) / max(count, 1) if total is not None else 0.0  # the one read
    return kind.report(loss, torch.cat(preds).cpu(), data)


@torch.no_grad()
def predict(
    model: nn.Module,
    data: Mapping[str, Tensor],
    kind: str | TaskKind,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Model outputs on all of ``data``, on CPU: logits, or a regression's values (shaped
    like ``targets`` where ``data`` holds them, as the model gives them otherwise). Only the
    inputs are read: ``data`` needs no ``targets``."""
    kind = as_kind(kind, model)
    return torch.cat([kind.raw_prediction(out, batch).float().cpu()
                      for _, batch, out in _outputs(model, data, kind, batch_size, device)])


def _outputs(model: nn.Module, data: Mapping[str, Tensor], kind: TaskKind, batch_size: int,
             device: torch.device | str) -> Iterator[tuple[Batch, Batch, Tensor]]:
    """Each batch of ``data`` as sliced (on the data's device: the host for the library's
    data sets), as moved to ``device``, and the model's output on it; in eval mode (restored
    after), and inside :func:`checked_inputs` when ``kind`` could check the data once; a
    padding mask that masks nothing is dropped on the host, as in training."""
    check_int("batch_size", batch_size, minimum=1)
    n = dataset_size(data)
    if n == 0:  # nothing to average: torch.cat of no predictions failed with its own message
        raise ValueError(f"the data hold no examples (tensors {sorted(data)} have 0 rows); "
                         "expected at least one to evaluate or predict")
    was_training = model.training
    checked = kind.check_data(model, data)
    model.eval()
    try:
        for start in range(0, n, batch_size):
            host = kind.drop_empty_padding({name: t[start:start + batch_size]
                                            for name, t in data.items()})
            batch = to_device(host, device)
            with checked_inputs(checked):
                out = kind.forward(model, batch)
            yield host, batch, out
    finally:
        model.train(was_training)
