"""Modular arithmetic a ∘ b mod p, the grokking setting (Power et al. 2022; 004 §5.3.1).

Each example is the four tokens ``a op b =`` with a, b in 0..p-1 and the label is c = a ∘ b mod p
(p classes). Operations: ``add`` (a + b), ``sub`` (a - b), ``mul`` (a·b), ``div`` (a·b⁻¹, b ≠ 0,
p prime) and ``quad`` (a² + ab + b²). The table of all pairs is split into train and test by
``train_fraction``, as in the grokking experiments. The task has no natural grading: it is the
ungraded control (``grades == ()``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import Tensor

from graded.checks import check_bool, check_choice, check_float, check_int
from graded.tasks.base import (
    SPLIT_KINDS,
    Task,
    TaskDataset,
    Vocab,
    check_seed,
    derived_seed,
)

OPERATIONS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "quad": "^"}
_CHUNK = 1 << 20  # held-out positions checked at a time by a relabelled split


def is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


def modular_op(a: Tensor, b: Tensor, p: int, operation: str) -> Tensor:
    """c = a ∘ b mod p elementwise (long tensors); division uses b^(p-2) (Fermat)."""
    if operation == "add":
        return (a + b) % p
    if operation == "sub":
        return (a - b) % p
    if operation == "mul":
        return (a * b) % p
    if operation == "quad":
        return (a * a + a * b + b * b) % p
    if operation == "div":
        return (a * _pow_mod(b, p - 2, p)) % p
    raise ValueError(f"operation must be one of {tuple(OPERATIONS)}, got {operation!r}")


def _pow_mod(x: Tensor, e: int, p: int) -> Tensor:
    result = torch.ones_like(x)
    base = x % p
    while e:
        if e & 1:
            result = (result * base) % p
        base = (base * base) % p
        e >>= 1
    return result


@dataclasses.dataclass
class ModularArithmetic(Task):
    """Predict a ∘ b mod p from the tokens ``a op b =`` (SPEC C10).

    ``generate(n, seed)`` draws n distinct pairs from the table (all p² pairs; p(p-1) for
    ``div``); ``split("random")`` with no sizes uses the whole table and ``train_fraction``.
    Inputs (N, 4) long; targets (N,) long in 0..p-1.

    Grades (``graded_object = "none"``): none; this is the ungraded control task.
    """

    p: int = 97
    operation: str = "add"
    train_fraction: float = 0.5

    name: ClassVar[str] = "modular"
    kind: ClassVar[str] = "classification"
    metric: ClassVar[str] = "accuracy"
    graded_object: ClassVar[str] = "none"

    def __post_init__(self) -> None:
        check_int("p", self.p, minimum=2, maximum=10_000)
        check_choice("operation", self.operation, tuple(OPERATIONS))
        check_float("train_fraction", self.train_fraction, minimum=0.0, maximum=1.0,
                    strict_min=True)
        if self.operation in ("div", "mul", "quad") and not is_prime(self.p):
            raise ValueError(f"operation {self.operation!r} needs a prime p, got p={self.p}")
        self._vocab = Vocab(["<pad>", *map(str, range(self.p)), *OPERATIONS.values(), "="])

    @property
    def vocab(self) -> Vocab:
        return self._vocab

    @property
    def grades(self) -> tuple[float, ...]:
        return ()

    @property
    def num_outputs(self) -> int:
        return self.p

    @property
    def max_len(self) -> int:
        return 4

    def table(self) -> tuple[Tensor, Tensor]:
        """All admissible pairs (a, b) in row-major order."""
        a, b = torch.meshgrid(torch.arange(self.p), torch.arange(self.p), indexing="ij")
        a, b = a.reshape(-1), b.reshape(-1)
        if self.operation == "div":
            keep = b != 0
            a, b = a[keep], b[keep]
        return a, b

    def encode_pairs(self, a: Tensor, b: Tensor) -> dict[str, Tensor]:
        op = self.vocab.id(OPERATIONS[self.operation])
        eq = self.vocab.id("=")
        n = a.shape[0]
        inputs = torch.stack([a + 1, torch.full((n,), op), b + 1, torch.full((n,), eq)], dim=1)
        return {
            "inputs": inputs,
            "targets": modular_op(a, b, self.p, self.operation),
            "key_padding_mask": torch.zeros(n, 4, dtype=torch.bool),
        }

    def operands(self, data: TaskDataset) -> tuple[Tensor, Tensor]:
        """(a, b) decoded from the inputs (number tokens have id value + 1)."""
        return data.inputs[:, 0] - 1, data.inputs[:, 2] - 1

    @property
    def table_size(self) -> int:
        """The number of admissible pairs: p², or p(p - 1) for ``div`` (b ≠ 0)."""
        return self.p * (self.p - (self.operation == "div"))

    def table_pairs(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """The pairs (a, b) at positions ``index`` of :meth:`table`, computed from the
        positions (row-major: a = index // columns) without building the table."""
        if self.operation == "div":  # columns b = 1..p-1
            return index // (self.p - 1), index % (self.p - 1) + 1
        return index // self.p, index % self.p

    def table_positions(self, a: Tensor, b: Tensor) -> Tensor:
        """The positions in :meth:`table` of the pairs (a, b): the inverse of
        :meth:`table_pairs` (for ``div``, b ≠ 0)."""
        if self.operation == "div":
            return a * (self.p - 1) + (b - 1)
        return a * self.p + b

    def _examples_at(self, index: Tensor) -> TaskDataset:
        """The examples at positions ``index`` of :meth:`table`, as :meth:`generate` makes
        them: ``generate(n, seed)`` is ``_examples_at`` of the first n positions of the seed's
        order of the table."""
        return TaskDataset(self.encode_pairs(*self.table_pairs(index)), task=self.name,
                           kind=self.kind, info=self.info())

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        total = self.table_size
        if n > total:
            raise ValueError(f"n={n} exceeds the {total} distinct pairs of the table "
                             f"(p={self.p}, operation={self.operation!r})")
        idx = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:n]
        return self.encode_pairs(*self.table_pairs(idx))

    def split(self, kind: str = "random", n_train: int | None = None,
              n_test: int | None = None, seed: int = 0, *, unseen: bool = True
              ) -> tuple[TaskDataset, TaskDataset]:
        """Disjoint train/test pairs of the table; sizes default to ``train_fraction``.

        ``"relabelled"`` presents held-out pairs under an automorphism σ (``relabel``). σ maps
        the table onto itself, so the shown pair (σa, σb) of a held-out pair (a, b) can be a
        training pair, with its training answer; those are left out, and the test set is the
        held-out pairs whose image is held out too (by default all of them, about
        (1 - train_fraction)² of the table). ``unseen=False`` keeps them (the first ``n_test``
        shown pairs, by default all held-out pairs).
        """
        check_choice("split kind", kind, SPLIT_KINDS)
        unseen = check_bool("unseen", unseen)  # read by "relabelled" only, checked for any kind
        if kind in ("size", "family"):
            return super().split(kind)  # raises: the table has no sizes or families
        total = self.table_size
        if n_train is None:
            n_train = max(1, min(total - 1, round(self.train_fraction * total)))
        check_int("n_train", n_train, minimum=1, maximum=total - 1)
        if n_test is not None:
            check_int("n_test", n_test, minimum=1)
            if n_train + n_test > total:
                raise ValueError(f"n_train + n_test = {n_train + n_test} exceeds the {total} "
                                 "pairs")
        if kind == "relabelled":
            return self._relabelled_split(n_train, n_test, seed, unseen)
        # the first examples of generate(total, seed) are generate(m, seed) for every m: a
        # random split of given sizes encodes only the pairs it returns, not the whole table
        size = total if n_test is None else n_train + n_test
        pool = self.generate(size, seed)
        return pool.subset(torch.arange(n_train)), pool.subset(torch.arange(n_train, size))

    def _relabelled_split(self, n_train: int, n_test: int | None, seed: int, unseen: bool
                          ) -> tuple[TaskDataset, TaskDataset]:
        """The relabelled split of :meth:`split`, encoding only the pairs it returns.

        The table's order is ``generate(table_size, seed)``'s: its first ``n_train`` positions
        train, the rest are held out. A held-out pair is kept when the position of its image
        (σa, σb) is not a training position (a mask of one byte per pair); the held-out
        positions are scanned in chunks, and the scan stops at the ``n_test``-th kept pair. So
        the split is the one of encoding the whole table, keying every example by its inputs
        and relabelling every held-out pair, without the memory of that (gigabytes near
        p = 10⁴): the order (8 bytes per pair), the mask and what is returned.
        """
        seed = check_seed(seed)
        sigma = self.automorphism(derived_seed(seed, 1))  # raises for ``quad``
        order = torch.randperm(self.table_size, generator=torch.Generator().manual_seed(seed))
        train = self._examples_at(order[:n_train])
        held_out = order[n_train:]
        in_train = None
        if unseen:
            in_train = torch.zeros(self.table_size, dtype=torch.bool)
            in_train[order[:n_train]] = True
        wanted = len(held_out) if n_test is None else n_test
        kept: list[Tensor] = []
        found = 0
        for start in range(0, len(held_out), _CHUNK):
            part = held_out[start:start + _CHUNK]
            if in_train is not None:
                a, b = self.table_pairs(part)
                part = part[~in_train[self.table_positions(sigma[a], sigma[b])]]
            kept.append(part[:wanted - found])
            found += len(kept[-1])
            if found == wanted:
                break
        if n_test is None:
            n_test = found
        if n_test > found or n_test == 0:  # then every held-out pair was scanned
            raise ValueError(
                f"a relabelled split with n_train={n_train} has {found} held-out pairs "
                f"whose relabelled pair is not a training pair, fewer than n_test="
                f"{max(n_test, 1)}; lower n_train or n_test"
            )
        test = self._examples_at(torch.cat(kept))
        return train, self.relabel(test, derived_seed(seed, 1))

    def automorphism(self, seed: int) -> Tensor:
        """A table σ of 0..p-1 with σ(a ∘ b) = σ(a) ∘ σ(b): x ↦ u·x (u a unit ≠ 1) for add/sub;
        x ↦ x^e (gcd(e, p-1) = 1, e ≠ 1) for mul/div. ``quad`` has none of these
        (u·x maps c to u²c), so a relabelled split raises for it."""
        g = torch.Generator().manual_seed(seed)
        x = torch.arange(self.p)
        if self.operation in ("add", "sub"):
            units = [u for u in range(2, self.p) if _gcd(u, self.p) == 1]
            if not units:
                raise ValueError(f"Z/{self.p} has no unit other than 1 to relabel by")
            u = units[int(torch.randint(len(units), (1,), generator=g))]
            return (u * x) % self.p
        if self.operation in ("mul", "div"):
            exps = [e for e in range(2, self.p - 1) if _gcd(e, self.p - 1) == 1]
            if not exps:
                raise ValueError(f"(Z/{self.p})^× has no automorphism other than the identity")
            e = exps[int(torch.randint(len(exps), (1,), generator=g))]
            return _pow_mod(x, e, self.p)
        raise ValueError(f"a relabelled split is not meaningful for operation "
                         f"{self.operation!r}")

    def relabel(self, data: TaskDataset, seed: int) -> TaskDataset:
        """Every number relabelled by an automorphism σ: (σa, σb) ↦ σc."""
        seed = check_seed(seed)
        sigma = self.automorphism(seed)
        a, b = self.operands(data)
        out = self.encode_pairs(sigma[a], sigma[b])
        return data.replace(inputs=out["inputs"], targets=sigma[data.targets])


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
