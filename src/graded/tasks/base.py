"""The common task interface: a seeded generator that states its natural grading and its metric.

Every task is a dataclass whose fields are its configuration. ``generate(n, seed)`` returns a
:class:`TaskDataset` of tensors; ``split(kind, ...)`` returns a train and a test set made by one
of the split types of 003 §3.2 (random, by size, by family, relabelled).

Tensor conventions (the trainer relies on these keys):

- ``kind == "lm"``: ``inputs`` (N, T) long, ``targets`` (N, T) long with ``IGNORE_INDEX`` where
  no loss is taken, ``loss_mask`` (N, T) bool (True = scored), ``key_padding_mask`` (N, T) bool
  (True = padding, as in ``torch.nn.MultiheadAttention``).
- ``kind == "seq2seq"``: ``inputs`` (N, S) source ids with ``key_padding_mask``,
  ``decoder_inputs`` (N, T) (``<bos>`` then the answer) with ``decoder_key_padding_mask``,
  ``targets`` (N, T) (the answer then ``<eos>``, ``IGNORE_INDEX`` on padding), ``loss_mask``.
- ``kind == "classification"``: ``inputs`` (N, T) long token ids with ``key_padding_mask``, or
  (N, T, F) float features; ``targets`` (N,) long.
- ``kind == "regression"``: ``inputs`` (N, T, F) float (with ``key_padding_mask`` when T varies);
  ``targets`` (N, num_outputs) float.
- Optional ``token_grades`` (N, T) long: the natural grade of every token (nesting depth, monomial
  degree) where it depends on the example.
"""

from __future__ import annotations

import abc
import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from graded.checks import SEED_RANGE, check_bool, check_float, check_int
from graded.tasks.dataset import TaskDataset, Vocab

IGNORE_INDEX = -100
SPLIT_KINDS = ("random", "size", "family", "relabelled")
GRADED_OBJECTS = ("positions", "tokens", "features", "vocabulary", "none")
MAX_SEED = SEED_RANGE[1]  # the largest seed a torch.Generator takes


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as an int in [0, ``MAX_SEED``], the seeds a ``torch.Generator`` takes; the one
    check of a seed given to ``generate``, ``split`` and ``relabel``."""
    return check_int(name, seed, minimum=0, maximum=MAX_SEED)


def derived_seed(seed: int, offset: int) -> int:
    """The seed ``seed + offset`` that a split derives from its ``seed`` (its test draw, its
    relabelling, its top-up draws), reduced modulo 2**64 into [0, ``MAX_SEED``] so that every
    seed a task takes derives seeds it takes. It is ``seed + offset`` itself for every seed up
    to ``MAX_SEED − offset``: the splits of those seeds are unchanged by the reduction."""
    return (operator.index(seed) + offset) % (MAX_SEED + 1)  # a NumPy seed as a Python int


@dataclasses.dataclass
class Task(abc.ABC):
    """Base class of every task generator (a dataclass; its fields are the configuration).

    Class attributes a task sets:

    - ``name``: registry name; ``kind``: one of ``graded.kinds.KIND_NAMES``; ``metric``: the
      headline metric (a name in ``graded.evaluation.metrics.METRICS``);
    - ``graded_object``: what the grading tuple ``grades`` grades: ``"positions"`` (token
      positions of a fixed format), ``"tokens"`` (a data-dependent grade per token, given per
      example in ``token_grades``; ``grades`` then lists the possible values), ``"features"``
      (coordinates of real input features), ``"vocabulary"`` or ``"none"``.

    Subclasses implement ``_generate(n, seed)``, ``grades`` and, where meaningful,
    ``size_configs``, ``families`` with ``family_configs``, and ``relabel``.
    """

    name: ClassVar[str] = "task"
    kind: ClassVar[str] = "classification"
    metric: ClassVar[str] = "accuracy"
    graded_object: ClassVar[str] = "none"
    #: Whether a token's grade depends only on that token and those before it (the grades of a
    #: prefix are a prefix of the grades): then generated tokens can be graded as they come.
    causal_grades: ClassVar[bool] = False

    # ---- what subclasses provide -------------------------------------------------------
    @property
    @abc.abstractmethod
    def grades(self) -> tuple[float, ...]:
        """The natural grading tuple (what it grades: ``graded_object``)."""

    @property
    def vocab(self) -> Vocab | None:
        """The token vocabulary, or None for tasks on real features (see ``input_dim``)."""
        return None

    @property
    def input_dim(self) -> int | None:
        """Feature dimension F of real-valued inputs (N, T, F), or None for token inputs."""
        return None

    @property
    def num_outputs(self) -> int | None:
        """Classes (classification) or target dimension (regression); None for ``lm``."""
        return None

    @property
    def output_grades(self) -> tuple[float, ...] | None:
        """The grades of the output coordinates, one per target column (regression) or class
        (classification), which the graded loss of the training recipes weights (000 Def 5.37
        / 7.1, :mod:`graded.train.recipes`); None (the default) where the outputs carry no
        grades. Sequence tasks grade their target tokens per example in ``token_grades``."""
        return None

    @property
    @abc.abstractmethod
    def max_len(self) -> int:
        """The longest sequence length T this configuration generates."""

    @abc.abstractmethod
    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        """The tensors of ``n`` examples drawn with ``seed`` (see the module docstring)."""

    def grade_tokens(self, tokens: str | Sequence[str]) -> list[int]:
        """The grade of every token of ``tokens`` (a space-separated string or a token list in
        the format of the task's inputs: a prompt, a seq2seq source, or a decoder sequence from
        ``<bos>``), as the task's datasets grade that sequence in ``token_grades``
        (``decoder_token_grades``). Tasks whose ``graded_object`` is ``"tokens"`` implement it;
        the others raise ValueError naming the task. Unknown tokens raise ValueError."""
        raise ValueError(f"task {self.name!r} does not grade its tokens (graded_object="
                         f"{self.graded_object!r}); token grades come from a task whose "
                         "graded_object is 'tokens'")

    def _tokens(self, tokens: str | Sequence[str]) -> list[str]:
        """``tokens`` as a list, each checked against the vocabulary."""
        toks = tokens.split() if isinstance(tokens, str) else list(tokens)
        self.vocab.encode(toks)  # ValueError naming an unknown token
        return toks

    def size_configs(self) -> tuple[Task, Task]:
        """Configurations generating small (train) and large (test) objects (003 §3.2)."""
        raise ValueError(f"a size split is not meaningful for task {self.name!r}")

    def families(self) -> tuple[str, ...]:
        """Names of the families of objects this task can draw from (003 §3.2: a family split
        trains on some graph families and tests on others); empty for a task without families.
        A task with families puts a ``family`` tensor (N,) of indices into this tuple in its
        data."""
        return ()

    def family_configs(self) -> tuple[Task, Task]:
        """Configurations drawing from the training families and from the held-out ones."""
        raise ValueError(f"a family split is not meaningful for task {self.name!r}")

    def split_configs(self, kind: str) -> tuple[Task, Task]:
        """The train and test configurations of a split by ``"size"`` or ``"family"``."""
        if kind == "size":
            return self.size_configs()
        if kind == "family":
            return self.family_configs()
        raise ValueError(f"only 'size' and 'family' splits have configurations, got {kind!r}")

    def relabel(self, data: TaskDataset, seed: int) -> TaskDataset:
        """The same objects under a label-preserving bijection of the inputs (003 §3.2), a
        function of ``seed`` (checked by :func:`check_seed` in every task that has one)."""
        raise ValueError(f"a relabelled split is not meaningful for task {self.name!r}")

    def canonicalize(self, data: TaskDataset) -> TaskDataset:
        """Canonical copies of the objects; the train side of a relabelled split."""
        return data

    # ---- shared machinery --------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The configuration as a plain dict (``get_task(name, **config())`` rebuilds it)."""
        return dataclasses.asdict(self)

    def with_options(self, **changes: Any) -> Task:
        """A copy of this task with some options changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def generate(self, n: int, seed: int = 0) -> TaskDataset:
        """``n`` examples, a deterministic function of the configuration and ``seed``
        (0 <= seed <= ``MAX_SEED``, the seeds a ``torch.Generator`` takes, for every task)."""
        check_int("n", n, minimum=1)
        check_seed(seed)
        tensors = self._generate(n, seed)
        return TaskDataset(tensors, task=self.name, kind=self.kind, info=self.info())

    def info(self) -> dict[str, Any]:
        """Metadata the trainer needs to build a model for this task."""
        v = self.vocab
        return {
            "task": self.name, "kind": self.kind, "metric": self.metric,
            "graded_object": self.graded_object, "grades": tuple(self.grades),
            "vocab_size": len(v) if v is not None else None,
            "pad_id": v.pad_id if v is not None else None,
            "bos_id": v.id("<bos>") if v is not None and "<bos>" in v else None,
            "eos_id": v.id("<eos>") if v is not None and "<eos>" in v else None,
            "input_dim": self.input_dim, "num_outputs": self.num_outputs,
            "max_len": self.max_len, "config": self.config(),
        }

    def split(self, kind: str = "random", n_train: int = 1000, n_test: int = 1000,
              seed: int = 0, *, unseen: bool = True) -> tuple[TaskDataset, TaskDataset]:
        """Train and test sets by one of the split types of 003 §3.2.

        - ``"random"``: one pool of ``n_train + n_test`` examples, partitioned at random;
        - ``"size"``: train on small objects, test on larger ones (``size_configs``);
        - ``"family"``: train on some families of objects, test on held-out ones
          (``family_configs``);
        - ``"relabelled"``: train on canonical copies (``canonicalize``), test on fresh objects
          presented under a label-preserving bijection (``relabel``).

        Whatever the kind, no test input occurs among the training inputs (``unseen_test``).
        ``unseen=False`` keeps the test candidates as drawn, repeats of training inputs
        included: an i.i.d. sample of the test distribution, whose loss estimates the
        population risk rather than the loss on unseen objects. ``unseen`` is True or False
        (``TypeError`` otherwise: ``unseen="false"`` would be read as True).

        The test set, its relabelling and its top-up draws take seeds derived from ``seed``
        (``seed + 1``, ``seed + 2``, ...: :func:`derived_seed`, modulo 2**64 near ``MAX_SEED``).
        """
        if kind not in SPLIT_KINDS:
            raise ValueError(f"split kind must be one of {SPLIT_KINDS}, got {kind!r}")
        check_int("n_train", n_train, minimum=1)
        check_int("n_test", n_test, minimum=1)
        seed = check_seed(seed)
        finish = unseen_test if check_bool("unseen", unseen) else _as_drawn
        if kind == "random":
            pool = self.generate(n_train + n_test, seed)
            perm = torch.randperm(n_train + n_test, generator=torch.Generator().manual_seed(seed))
            train = pool.subset(perm[:n_train])
            return train, finish(train, pool.subset(perm[n_train:]), n_test,
                                 lambda m, s: self.generate(m, s), seed)
        if kind in ("size", "family"):
            train_task, test_task = self.split_configs(kind)
            train = train_task.generate(n_train, seed)
            test = test_task.generate(n_test, derived_seed(seed, 1))
            return train, finish(train, test, n_test, lambda m, s: test_task.generate(m, s), seed)
        train = self.canonicalize(self.generate(n_train, seed))
        test = self.relabel(self.generate(n_test, derived_seed(seed, 1)), derived_seed(seed, 2))
        return train, finish(train, test, n_test,
                             lambda m, s: self.relabel(self.generate(m, s), derived_seed(s, 1)),
                             seed)


# ---- train/test disjointness ----------------------------------------------------------------
TOP_UP_DRAWS = 6  # fresh draws (of n_test, 2·n_test, 4·n_test, ... examples) before giving up


def input_keys(data: TaskDataset) -> list[bytes]:
    """One hashable key per example: the bytes of its ``inputs`` row (equal iff the inputs are;
    floating -0.0 is keyed as 0.0, which it equals)."""
    x = data.inputs.detach().cpu()
    if x.is_floating_point():
        x = x + 0.0  # -0.0 + 0.0 is 0.0: one key for two equal inputs
    x = x.contiguous()
    return [row.tobytes() for row in x.reshape(len(x), -1).numpy()]


def concat_datasets(parts: Sequence[TaskDataset]) -> TaskDataset:
    """The examples of ``parts`` one after the other (same task, kind, info and keys)."""
    keys = parts[0].keys()
    return parts[0].replace(**{k: torch.cat([p.tensors[k] for p in parts]) for k in keys})


def _as_drawn(train: TaskDataset, candidates: TaskDataset, n_test: int,
              draw: Callable[[int, int], TaskDataset], seed: int) -> TaskDataset:
    """The test candidates as drawn (``Task.split(..., unseen=False)``)."""
    return candidates


def unseen_test(train: TaskDataset, candidates: TaskDataset, n_test: int,
                draw: Callable[[int, int], TaskDataset], seed: int) -> TaskDataset:
    """``n_test`` test examples whose inputs occur nowhere in ``train`` (no train/test leakage).

    A generated pool can repeat an object (a short Dyck word, a small graph with the same
    numbering, a relabelled modular pair that is a training pair), and an input seen in training
    with its answer measures memory, not the rule a split tests. The test set is the
    ``candidates`` whose inputs are unseen, in order, topped up from fresh draws
    ``draw(m, seed')`` (seed' = :func:`derived_seed` of ``seed`` and 1_000_003 times the
    draw's number); when ``candidates`` are all unseen they are returned unchanged.
    ``ValueError`` when the task has too few distinct objects for the sizes asked for.
    """
    seen = set(input_keys(train))
    parts: list[TaskDataset] = []
    have, source, m = 0, candidates, n_test
    for attempt in range(TOP_UP_DRAWS + 1):
        keep = [i for i, key in enumerate(input_keys(source)) if key not in seen]
        if keep:
            parts.append(source.subset(keep[: n_test - have]))
            have += len(parts[-1])
        if have == n_test:
            return parts[0] if len(parts) == 1 else concat_datasets(parts)
        if attempt < TOP_UP_DRAWS:
            source = draw(m, derived_seed(seed, 1_000_003 * (attempt + 1)))
            m *= 2
    raise ValueError(
        f"only {have} of n_test={n_test} test examples could be drawn whose inputs are not "
        f"among the {len(train)} training examples ({len(seen)} distinct): the task has too "
        "few distinct objects for these sizes; ask for fewer examples or a larger configuration"
    )


# ---- validation helpers ---------------------------------------------------------------------
def check_numbers(name: str, value: Any, *, length: int | None = None,
                  integer: bool = False) -> tuple[Any, ...]:
    """``value`` as a tuple of finite numbers (``int`` with ``integer``): the check of a tuple
    option such as ``lambda_range`` or ``weights`` (a list, tuple, array or tensor).

    ``TypeError`` naming ``name`` when ``value`` is not a sequence (a string, a bare number) or
    an entry is not a number (``bool`` included), ``ValueError`` for a length other than
    ``length`` or a non-finite entry; an entry's error names it as ``name[i]``. The caller
    checks the values' range, which differs per option.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence | Tensor | np.ndarray):
        raise TypeError(f"{name} must be a sequence of numbers, got {value!r} "
                        f"({type(value).__name__})")
    items = list(value)
    if length is not None and len(items) != length:
        raise ValueError(f"{name} must hold {length} numbers, got {len(items)}: {value!r}")
    check = check_int if check_bool("integer", integer) else check_float
    return tuple(check(f"{name}[{i}]", v) for i, v in enumerate(items))


def pad_sequences(seqs: Sequence[Sequence[int]], length: int, pad_value: int) -> Tensor:
    """A (N, length) long tensor of right-padded integer sequences."""
    out = torch.full((len(seqs), length), pad_value, dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"sequence {i} has length {len(s)} > {length}")
        out[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
    return out


def lm_tensors(seqs: Sequence[Sequence[int]], scored_from: Sequence[int], length: int,
               pad_id: int, token_grades: Sequence[Sequence[int]] | None = None
               ) -> dict[str, Tensor]:
    """Next-token tensors from whole sequences (length of each <= ``length + 1``).

    ``inputs[t] = seq[t]``, ``targets[t] = seq[t + 1]``; position t is scored
    (``loss_mask``) when ``t + 1 >= scored_from[i]``, i.e. the target token belongs to the part
    of the sequence the model must produce. Unscored targets are ``IGNORE_INDEX``.
    ``token_grades`` (per whole-sequence token) are aligned with ``inputs``.
    """
    full = pad_sequences(seqs, length + 1, pad_id)
    lengths = torch.tensor([len(s) for s in seqs])
    pos = torch.arange(length)
    real = (pos[None, :] + 1) < lengths[:, None]  # target position inside the sequence
    start = torch.tensor(list(scored_from))
    loss_mask = real & ((pos[None, :] + 1) >= start[:, None])
    targets = torch.where(loss_mask, full[:, 1:], torch.full_like(full[:, 1:], IGNORE_INDEX))
    out = {
        "inputs": full[:, :-1],
        "targets": targets,
        "loss_mask": loss_mask,
        "key_padding_mask": (pos[None, :]) >= (lengths[:, None] - 1),
    }
    if token_grades is not None:
        out["token_grades"] = pad_sequences(token_grades, length + 1, 0)[:, :-1]
    return out
