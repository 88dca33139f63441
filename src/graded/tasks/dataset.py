"""The data of a task: :class:`Vocab`, its tokens and their ids, and :class:`TaskDataset`, its
examples as named tensors (the keys of :mod:`graded.tasks.base`'s conventions)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from graded.checks import check_bool
from graded.encodings.base import token_ids

__all__ = ["TaskDataset", "Vocab"]


class Vocab:
    """A fixed list of string tokens with ids equal to list positions.

    ``encode`` accepts a whitespace-separated string or a list of tokens; ``decode`` returns the
    list of tokens (``decode_str`` joins them with single spaces), so that
    ``decode_str(encode(s)) == s`` for every ``s`` in the documented format.
    """

    def __init__(self, tokens: Sequence[str], *, pad: str = "<pad>") -> None:
        tokens = list(tokens)
        if len(set(tokens)) != len(tokens):
            dup = sorted({t for t in tokens if tokens.count(t) > 1})
            raise ValueError(f"vocabulary tokens must be unique, got duplicates {dup}")
        if pad not in tokens:
            raise ValueError(f"pad token {pad!r} must be in the vocabulary")
        self.tokens: list[str] = tokens
        self.index: dict[str, int] = {t: i for i, t in enumerate(tokens)}
        self.pad = pad
        self.pad_id = self.index[pad]

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: object) -> bool:
        return token in self.index

    def id(self, token: str) -> int:
        """The id of one token; unknown tokens raise ``ValueError``."""
        try:
            return self.index[token]
        except KeyError:
            raise ValueError(
                f"unknown token {token!r}; the vocabulary has {len(self)} tokens, "
                f"e.g. {self.tokens[: min(8, len(self))]}"
            ) from None

    def encode(self, text: str | Iterable[str]) -> list[int]:
        """Token ids of a whitespace-separated string or an iterable of tokens."""
        toks = text.split() if isinstance(text, str) else list(text)
        return [self.id(t) for t in toks]

    def decode(self, ids: Iterable[int] | Tensor, *, skip_pad: bool = True) -> list[str]:
        """Tokens of a sequence of ids (padding dropped unless ``skip_pad=False``)."""
        skip_pad = check_bool("skip_pad", skip_pad)
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        out = []
        for i in token_ids(ids):  # a float id would be truncated to another token
            if not 0 <= i < len(self):
                raise ValueError(f"token id {i} out of range [0, {len(self)})")
            if skip_pad and i == self.pad_id:
                continue
            out.append(self.tokens[i])
        return out

    def decode_str(self, ids: Iterable[int] | Tensor) -> str:
        return " ".join(self.decode(ids))


class TaskDataset(torch.utils.data.Dataset):
    """A dict of tensors sharing their first (example) dimension, tagged with its task.

    Indexing one example returns a dict of row tensors, so a ``DataLoader`` with the default
    collate function yields batches as dicts with the same keys.
    """

    def __init__(self, tensors: dict[str, Tensor], *, task: str, kind: str,
                 info: dict[str, Any] | None = None) -> None:
        if "inputs" not in tensors or "targets" not in tensors:
            raise ValueError(f"a task dataset needs 'inputs' and 'targets', got {sorted(tensors)}")
        if not isinstance(kind, str) or not kind:  # the names: graded.kinds.KIND_NAMES
            raise ValueError(f"kind must be a task kind name, got {kind!r}")
        n = {k: v.shape[0] for k, v in tensors.items()}
        if len(set(n.values())) != 1:
            raise ValueError(f"all tensors need the same number of examples, got {n}")
        self.tensors = dict(tensors)
        self.task = task
        self.kind = kind
        self.info = dict(info or {})

    def __len__(self) -> int:
        return self.tensors["inputs"].shape[0]

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {k: v[i] for k, v in self.tensors.items()}

    def __contains__(self, key: object) -> bool:
        return key in self.tensors

    def keys(self) -> list[str]:
        return list(self.tensors)

    @property
    def inputs(self) -> Tensor:
        return self.tensors["inputs"]

    @property
    def targets(self) -> Tensor:
        return self.tensors["targets"]

    def get(self, key: str, default: Tensor | None = None) -> Tensor | None:
        return self.tensors.get(key, default)

    def subset(self, index: Tensor | Sequence[int] | Sequence[bool]) -> TaskDataset:
        """The examples at ``index`` (a long tensor or a list of ints), in that order, or where
        a boolean mask of one entry per example is True. Other entries (floats) raise
        ``TypeError`` rather than being truncated to other examples."""
        idx = torch.as_tensor(index)
        if idx.dtype == torch.bool:
            if idx.shape != (len(self),):
                raise ValueError(f"a boolean mask needs one entry per example, shape "
                                 f"({len(self)},), got {tuple(idx.shape)}")
            idx = idx.nonzero().flatten()
        elif idx.numel() and (idx.is_floating_point() or idx.is_complex()):
            raise TypeError(f"index must hold example numbers (ints) or a boolean mask, got "
                            f"dtype {idx.dtype}")
        idx = idx.to(torch.long)
        return self.replace(**{k: v[idx] for k, v in self.tensors.items()})

    def replace(self, **tensors: Tensor) -> TaskDataset:
        """A copy with some tensors replaced (same task, kind and info)."""
        return TaskDataset({**self.tensors, **tensors}, task=self.task, kind=self.kind,
                           info=self.info)

    def to(self, device: torch.device | str) -> TaskDataset:
        return self.replace(**{k: v.to(device) for k, v in self.tensors.items()})

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self.tensors.items())
        return f"TaskDataset(task={self.task!r}, kind={self.kind!r}, n={len(self)}, {shapes})"
