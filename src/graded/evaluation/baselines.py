"""Simple baselines that run beside every model (003 §3.2, "Baselines").

003 §3.2: a score means little until it is set beside trivial predictors (the majority class,
regression, nearest neighbours). Every baseline here fits on a train ``TaskDataset`` and predicts
a test one:

- classification: majority class; multinomial logistic regression (L2, full-batch L-BFGS);
  k-nearest neighbours (Euclidean, majority vote);
- regression: the train mean; ridge regression (closed form, with intercept); k-NN (mean);
- next-token (``lm``) and ``seq2seq``: the most frequent target per position; a bigram table
  (most frequent next token after the current one); 1-nearest neighbour on the prompt or source
  (copies the neighbour's targets; left out when every token is scored, as in Dyck). No linear
  model here: a per-position softmax over the one-hot prefix has T²·V² weights.

Features (``features``): real inputs are flattened (padding is zero); token inputs are one-hot
per position, flattened, or bag-of-tokens counts (each divided by the length) when the one-hot
would exceed ``max_onehot`` columns. Token and class ids of any integer dtype are read as int64
(int32 ones, say from NumPy, as the kinds' losses read them; ``one_hot`` and the cross-entropy
refused them).

Each task kind of :mod:`graded.kinds` picks its family (:func:`sequence_baselines`,
:func:`classification_baselines`, :func:`regression_baselines`);
:func:`graded.kinds.run_baselines` scores them with the task's metric.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from graded.checks import check_int
from graded.evaluation.splits import padding_mask
from graded.tasks.base import IGNORE_INDEX, TaskDataset

MAX_ONEHOT = 4096


def _vocab_size(train: TaskDataset, test: TaskDataset, *, token_targets: bool = False) -> int:
    """``info["vocab_size"]``, else one more than the largest token of either set: of the
    inputs, the decoder inputs and, with ``token_targets`` (next-token and seq2seq targets, not
    class labels), the scored targets (a target can be a token no input holds, such as the
    last one of a sequence)."""
    v = train.info.get("vocab_size")
    if v is None:
        tokens = [t for d in (train, test)
                  for t in (d.inputs, d.get("decoder_inputs"),
                            d.targets[d.targets != IGNORE_INDEX] if token_targets else None)
                  if t is not None and t.numel()]
        v = max(int(t.max()) for t in tokens) + 1
    return int(v)


def features(data: TaskDataset, *, vocab_size: int | None = None, length: int | None = None,
             max_onehot: int = MAX_ONEHOT) -> Tensor:
    """A (N, F) float64 feature matrix of the inputs (see the module docstring).

    ``length`` pads or truncates the sequence axis so train and test features align (a size
    split has shorter train sequences).
    """
    x = data.inputs
    pad = padding_mask(data)
    t = x.shape[1] if length is None else length
    if x.shape[1] < t:
        extra = t - x.shape[1]
        fill = 0 if x.is_floating_point() else int(data.info.get("pad_id") or 0)
        x = torch.cat([x, torch.full((x.shape[0], extra, *x.shape[2:]), fill, dtype=x.dtype)], 1)
        pad = torch.cat([pad, torch.ones(pad.shape[0], extra, dtype=torch.bool)], 1)
    x, pad = x[:, :t], pad[:, :t]
    if x.is_floating_point():
        x = x.double().masked_fill(pad.reshape(*pad.shape, *([1] * (x.ndim - 2))), 0.0)
        return x.reshape(x.shape[0], -1)
    if vocab_size is None:
        raise ValueError("token inputs need vocab_size to build one-hot features")
    onehot = F.one_hot(x.clamp(min=0).long(), vocab_size).double() * (~pad)[..., None]
    if t * vocab_size <= max_onehot:
        return onehot.reshape(x.shape[0], -1)
    lengths = (~pad).sum(1, keepdim=True).clamp(min=1)
    return onehot.sum(1) / lengths


def standardize(train: Tensor, test: Tensor) -> tuple[Tensor, Tensor]:
    """Scale columns by the train mean and std (constant columns are only centred)."""
    mu = train.mean(0)
    sd = train.std(0, unbiased=False)
    sd = torch.where(sd > 0, sd, torch.ones_like(sd))
    return (train - mu) / sd, (test - mu) / sd


# ---- classification ------------------------------------------------------------------------
def majority_class(y_train: Tensor, n_test: int) -> Tensor:
    """The most frequent train label (smallest id on ties), repeated n_test times."""
    counts = torch.bincount(y_train)
    return torch.full((n_test,), int(counts.argmax()), dtype=torch.long)


def logistic_regression(x_train: Tensor, y_train: Tensor, x_test: Tensor, *,
                        num_classes: int | None = None, l2: float = 1e-3,
                        max_iter: int = 100) -> Tensor:
    """Multinomial logistic regression; returns test logits (N_test, C).

    Minimises mean cross-entropy + (l2/2)‖W‖² (bias not penalised) from zero with L-BFGS
    (strong Wolfe line search), in float64: deterministic.
    """
    c = int(num_classes or int(y_train.max()) + 1)
    y = y_train.long()  # the cross-entropy takes int64 class ids only
    x = x_train.double()
    w = torch.zeros(x.shape[1], c, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(c, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-7, tolerance_change=1e-10)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ w + b, y) + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return x_test.double() @ w + b


def _neighbours(x_train: Tensor, x_test: Tensor, k: int, chunk: int = 1024) -> Tensor:
    """Indices (N_test, k) of the k nearest train rows (Euclidean; ties by train index); k ≥ 1,
    at most the number of train rows."""
    k = min(check_int("k", k, minimum=1), x_train.shape[0])
    out = []
    for s in range(0, x_test.shape[0], chunk):
        d = torch.cdist(x_test[s: s + chunk].double(), x_train.double())
        out.append(torch.sort(d, dim=1, stable=True).indices[:, :k])
    return torch.cat(out)


def knn_classify(x_train: Tensor, y_train: Tensor, x_test: Tensor, k: int = 5,
                 num_classes: int | None = None) -> Tensor:
    """Majority vote of the k nearest train labels (smallest label on ties)."""
    c = int(num_classes or int(y_train.max()) + 1)
    idx = _neighbours(x_train, x_test, k)
    votes = F.one_hot(y_train.long()[idx], c).sum(1)
    return votes.argmax(-1)


# ---- regression ----------------------------------------------------------------------------
def mean_predictor(y_train: Tensor, n_test: int) -> Tensor:
    """The train mean of every target column, repeated n_test times."""
    return y_train.double().mean(0, keepdim=True).expand(n_test, *y_train.shape[1:]).clone()


def ridge_regression(x_train: Tensor, y_train: Tensor, x_test: Tensor,
                     alpha: float = 1e-3) -> Tensor:
    """Closed-form ridge with an unpenalised intercept: W = (XcᵀXc + αI)⁻¹ Xcᵀ yc on centred
    data (float64); returns test predictions with the shape of ``y_train[0]``."""
    x = x_train.double()
    y = y_train.double().reshape(y_train.shape[0], -1)
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    gram = xc.T @ xc + alpha * torch.eye(x.shape[1], dtype=torch.float64)
    w = torch.linalg.solve(gram, xc.T @ yc)
    pred = (x_test.double() - mx) @ w + my
    return pred.reshape(x_test.shape[0], *y_train.shape[1:])


def knn_regress(x_train: Tensor, y_train: Tensor, x_test: Tensor, k: int = 5) -> Tensor:
    """Mean target of the k nearest train rows."""
    idx = _neighbours(x_train, x_test, k)
    return y_train.double()[idx].mean(1)


# ---- next-token prediction -----------------------------------------------------------------
def _align(t: Tensor, length: int, fill: int) -> Tensor:
    if t.shape[1] >= length:
        return t[:, :length]
    return torch.cat([t, torch.full((t.shape[0], length - t.shape[1]), fill, dtype=t.dtype)], 1)


def positional_majority(train: TaskDataset, test: TaskDataset, vocab_size: int) -> Tensor:
    """Per position, the most frequent scored train target (test shape (N, T))."""
    t = test.targets.shape[1]
    y = _align(train.targets, t, IGNORE_INDEX)
    keep = y != IGNORE_INDEX
    counts = torch.zeros(t, vocab_size, dtype=torch.long)
    pos = torch.arange(t).expand_as(y)
    counts.index_put_((pos[keep], y[keep]), torch.ones(int(keep.sum()), dtype=torch.long),
                      accumulate=True)
    return counts.argmax(-1).expand(test.targets.shape[0], t).clone()


def _current_tokens(data: TaskDataset, encoder_decoder: bool) -> Tensor:
    """The token each target follows: ``inputs`` (lm) or ``decoder_inputs`` (seq2seq)."""
    return data.tensors["decoder_inputs"] if encoder_decoder else data.inputs


def bigram(train: TaskDataset, test: TaskDataset, vocab_size: int, *,
           encoder_decoder: bool = False) -> Tensor:
    """The most frequent scored train target after each current (decoder) input token."""
    keep = train.targets != IGNORE_INDEX
    counts = torch.zeros(vocab_size, vocab_size, dtype=torch.long)
    counts.index_put_((_current_tokens(train, encoder_decoder)[keep], train.targets[keep]),
                      torch.ones(int(keep.sum()), dtype=torch.long), accumulate=True)
    return counts.argmax(-1)[_current_tokens(test, encoder_decoder)]


def prompt_nearest_neighbour(train: TaskDataset, test: TaskDataset, vocab_size: int, *,
                             encoder_decoder: bool = False) -> Tensor:
    """Copy the targets of the train example whose prompt (lm: the inputs before the first
    scored one, i.e. those not equal to a scored target, which input t + 1 is of target t;
    seq2seq: the source) is nearest in one-hot Hamming distance."""
    t = test.targets.shape[1]
    pad_id = int(test.info.get("pad_id") or 0)

    def prompt(d: TaskDataset) -> Tensor:
        if encoder_decoder:
            x = _align(d.inputs, max(train.inputs.shape[1], test.inputs.shape[1]), pad_id)
        else:
            x = _align(d.inputs, t, pad_id)
            scored = _align(d.targets, t, IGNORE_INDEX) != IGNORE_INDEX
            answer = torch.zeros_like(scored)  # input t + 1 is target t: part of the answer
            answer[:, 1:] = scored[:, :-1]
            x = torch.where(answer, torch.full_like(x, pad_id), x)
        return F.one_hot(x.long(), vocab_size).double().reshape(x.shape[0], -1)

    idx = _neighbours(prompt(train), prompt(test), 1)[:, 0]
    return _align(train.targets, t, IGNORE_INDEX)[idx].clamp(min=0)


# ---- per kind (graded.kinds chooses; graded.kinds.run_baselines scores) -------------
def sequence_baselines(train: TaskDataset, test: TaskDataset, *, encoder_decoder: bool
                       ) -> dict[str, Tensor]:
    """Next-token (``encoder_decoder=False``) or seq2seq test predictions: positional
    majority, bigram and, when there is a prompt to match, the prompt's nearest neighbour."""
    v = _vocab_size(train, test, token_targets=True)
    out = {"majority": positional_majority(train, test, v),
           "bigram": bigram(train, test, v, encoder_decoder=encoder_decoder)}
    has_prompt = encoder_decoder or bool(
        ((train.targets == IGNORE_INDEX) & ~padding_mask(train)).any())
    if has_prompt:  # a task scored on every token (Dyck) has no prompt to match
        out["knn"] = prompt_nearest_neighbour(train, test, v, encoder_decoder=encoder_decoder)
    return out


def _standard_features(train: TaskDataset, test: TaskDataset) -> tuple[Tensor, Tensor]:
    v = None if train.inputs.is_floating_point() else _vocab_size(train, test)
    length = max(train.inputs.shape[1], test.inputs.shape[1])
    return standardize(features(train, vocab_size=v, length=length),
                       features(test, vocab_size=v, length=length))


def classification_baselines(train: TaskDataset, test: TaskDataset, *, k: int = 5
                             ) -> dict[str, Tensor]:
    """Test predictions of the majority class, logistic regression and k-NN."""
    xtr, xte = _standard_features(train, test)
    c = train.info.get("num_outputs") or int(max(train.targets.max(), test.targets.max())) + 1
    return {
        "majority": majority_class(train.targets, len(test)),
        "logistic": logistic_regression(xtr, train.targets, xte, num_classes=c),
        "knn": knn_classify(xtr, train.targets, xte, k=k, num_classes=c),
    }


def regression_baselines(train: TaskDataset, test: TaskDataset, *, k: int = 5
                         ) -> dict[str, Tensor]:
    """Test predictions of the train mean, ridge regression and k-NN."""
    xtr, xte = _standard_features(train, test)
    return {
        "mean": mean_predictor(train.targets, len(test)),
        "ridge": ridge_regression(xtr, train.targets, xte),
        "knn": knn_regress(xtr, train.targets, xte, k=k),
    }
