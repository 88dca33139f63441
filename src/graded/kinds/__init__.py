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
the items (the target tokens' grades for lm and seq2seq, the task's ``output_grades`` of each
target column for regression, shaped as the targets; for classification the ``output_grades``
of every class, which weight the class terms of each row's target distribution, so that label
smoothing's share of every class counts with that class's weight), and
``loss(..., weights=w)`` sums w·ℓ over the items, the count unchanged.

A morphic LM (004) is an LM whose model follows :class:`MorphicModel`: it is trained through
its own ``training_loss`` (the LM loss plus its router terms, 004 §4.3) and evaluated through
``model(inputs, key_padding_mask)`` like any LM.

Adding a kind is adding one subclass of :class:`TaskKind` (:mod:`graded.kinds.base`) with a new
``name`` (or a new ``architecture`` for an existing name); it registers itself when its module is
imported (docs/training.md, "How to extend").

The grades a model that grades tokens needs to answer a prompt come from
:mod:`graded.prompt_grading`.

The kinds live in :mod:`graded.kinds.sequence` (lm, seq2seq, the morphic LM) and
:mod:`graded.kinds.rows` (classification, regression).
"""

from __future__ import annotations

from torch import nn

from graded.evaluation.metrics import compute_metric
from graded.kinds.base import _REGISTRY, Batch, LossSum, MorphicModel, TaskKind
from graded.kinds.rows import Classification, Regression
from graded.kinds.sequence import LM, MorphicLM, Seq2Seq
from graded.tasks.base import TaskDataset

__all__ = [
    "ARCHITECTURES",
    "KIND_NAMES",
    "LM",
    "Batch",
    "Classification",
    "LossSum",
    "MorphicLM",
    "MorphicModel",
    "Regression",
    "Seq2Seq",
    "TaskKind",
    "as_kind",
    "baseline_report",
    "get_kind",
    "run_baselines",
]

# The library's kinds, in the order messages list them (each registered by
# TaskKind.__init_subclass__; a kind defined later is in the registry get_kind reads, not here).
_LIBRARY_KINDS: tuple[type[TaskKind], ...] = (LM, Seq2Seq, Classification, Regression, MorphicLM)
KIND_NAMES: tuple[str, ...] = tuple(dict.fromkeys(k.name for k in _LIBRARY_KINDS))
ARCHITECTURES: tuple[str, ...] = tuple(dict.fromkeys(k.architecture for k in _LIBRARY_KINDS))


def get_kind(name: str, architecture: str = "transformer") -> TaskKind:
    """The kind object of task kind ``name`` for models of ``architecture``: the library's
    kinds (:data:`KIND_NAMES`) and any subclass of :class:`TaskKind` defined since."""
    names = tuple(dict.fromkeys(n for n, _ in _REGISTRY))
    if name not in names:
        raise ValueError(f"unknown task kind {name!r}; expected one of {names}")
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
