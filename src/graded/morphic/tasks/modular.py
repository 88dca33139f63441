"""Modular addition over several moduli, with held-out adder sets and held-out moduli.

A generalisation of task A2 (004 §5.3.1, App. A.3) in which the modulus is part of the input:
sequences [x, ADD_k, MOD_p, =] with target (x + k) mod p at "=" (other positions ignored), for
moduli p ∈ ``moduli``, shifts k ∈ ``shifts`` and digits x < p. The model composes three tool
layers, so that every setting (p, adder set) is reachable by the same tools:

- layer 1, copies (grade-typed causal attention with identity values): num ← sem brings the digit
  code e_x, mod ← sem brings the modulus code e_j (p = ``moduli[j]``) to the "=" position;
- layer 2, adders: one edge num ← num per shift k, the integer shift e_s ↦ e_{s+k} (no wrap:
  ``num`` has width max(moduli) + max(shifts), enough for every sum x + k); the router must pick
  k from the context (the ADD_k token);
- layer 3, reduction: one edge num ← mod, the fixed bilinear tool
  φ(z_mod, z_num) = Σ_j z_mod[j] R_{p_j} z_num with R_p e_s = e_{s mod p}: with z_mod = e_j it is
  "reduce mod p_j", for every modulus of the task, seen in training or not. Every example needs
  it, so it is an always-on block (``stay=False``: one edge, no choice). With a stay option the
  router could learn to skip it and the readout to absorb part of the reduction for the training
  moduli (measured: 2 of 4 runs did, and then failed on held-out moduli).

Digits carry the typed code e_x in ``num`` and MOD_p tokens e_j in ``mod`` (fixed embeddings,
App. A.3's E = I); the readout of ``num`` starts at the typed decoder c·I on the digit columns,
as in A2; everything else (sem embeddings, positions, attention, routers, readout) is learned.

**What "held out" means** (each split returns (x, adder index, modulus index) triples):

- :meth:`ModularAdditionTask.split_adders` (held-out adder sets): for each modulus p some shifts
  are held out; training sees every (p, k) pair except those, and evaluation is on every x with
  the held-out pairs. Every modulus, every shift, and for each modulus every digit x < p and
  every answer, occur in training: only the combination (p, k) is new. The tools apply as they
  are; the routers must pick add_k in a context holding a MOD_p token never seen beside ADD_k.
- :meth:`ModularAdditionTask.split_moduli` (held-out moduli): the moduli in ``held_out`` never
  occur in training (their MOD token is never seen, so its learned embedding is untrained). The
  tools cover them (the reduction holds R_p for every modulus of the task), every digit and
  answer they need is a training digit and answer (a held-out modulus must not exceed the largest
  training modulus), and every shift occurs in training. The copy attention, the routers and the
  readout must carry over to an unseen token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from graded.checks import check_id_range
from graded.morphic.attention_block import GradeTypedAttention
from graded.morphic.blocks import FixedLinearBlock
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.model import MorphicObjective, MorphicTransformer
from graded.morphic.state import GradedStateSpace


def _int_list(name: str, values: Sequence[int], minimum: int) -> tuple[int, ...]:
    out = tuple(values)
    bad = [v for v in out if isinstance(v, bool) or not isinstance(v, int) or v < minimum]
    if not out or bad or len(set(out)) != len(out):
        raise ValueError(f"{name} must be a non-empty list of distinct ints >= {minimum}, got "
                         f"{list(out)!r}")
    return out


class ModularAdditionTask:
    """[x, ADD_k, MOD_p, =] → (x + k) mod p over ``moduli`` × ``shifts`` (module doc).

    Token ids: digits 0..P−1 (P = max(moduli)), ADD_k = P + index of k, MOD_p = P + |shifts| +
    index of p, "=" last."""

    def __init__(self, moduli: Sequence[int] = (5, 7, 11), shifts: Sequence[int] = (1, 2, 3, 4)
                 ) -> None:
        self.moduli = _int_list("moduli", moduli, 2)
        self.shifts = _int_list("shifts", shifts, 1)
        self.max_digit = max(self.moduli)
        self.width = self.max_digit + max(self.shifts)  # room for every integer sum x + k
        n_add = len(self.shifts)
        self.add_token = {i: self.max_digit + i for i in range(n_add)}
        self.mod_token = {j: self.max_digit + n_add + j for j in range(len(self.moduli))}
        self.eq_token = self.max_digit + n_add + len(self.moduli)
        self.vocab_size = self.eq_token + 1
        self.sequence_length = 4

    # ------------------------------------------------------------------ examples
    def all_triples(self) -> Tensor:
        """Every (x, adder index, modulus index) with x < p, (n, 3), modulus-major."""
        rows = [(x, i, j) for j, p in enumerate(self.moduli) for i in range(len(self.shifts))
                for x in range(p)]
        return torch.tensor(rows, dtype=torch.long)

    def make(self, triples: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """input_ids (B, 4), targets (B, 4) (−100 except at "="), adder and modulus indices."""
        if triples.dim() != 2 or triples.shape[1] != 3:
            raise ValueError(f"triples must be (n, 3) rows (x, adder, modulus), got shape "
                             f"{tuple(triples.shape)}")
        x, adder, modulus = triples.unbind(1)
        shifts, moduli = torch.tensor(self.shifts), torch.tensor(self.moduli)
        for name, index, n in (("adder", adder, len(self.shifts)),
                               ("modulus", modulus, len(self.moduli))):
            # a negative index would wrap to the last shift or modulus, silently
            check_id_range(index, n, f"every {name} index")
        if bool((x < 0).any() | (x >= moduli[modulus]).any()):
            raise ValueError("every digit x must satisfy 0 <= x < its modulus")
        ids = torch.stack([x, self.max_digit + adder,
                           self.max_digit + len(self.shifts) + modulus,
                           torch.full_like(x, self.eq_token)], dim=1)
        targets = torch.full_like(ids, -100)
        targets[:, 3] = (x + shifts[adder]) % moduli[modulus]
        return ids, targets, adder, modulus

    def sample(self, batch: int, generator: torch.Generator | None = None, *,
               triples: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``batch`` examples drawn uniformly from ``triples`` (default: all of them)."""
        triples = self.all_triples() if triples is None else triples
        return self.make(triples[torch.randint(0, len(triples), (batch,), generator=generator)])

    def answers(self, triples: Tensor) -> Tensor:
        shifts, moduli = torch.tensor(self.shifts), torch.tensor(self.moduli)
        return (triples[:, 0] + shifts[triples[:, 1]]) % moduli[triples[:, 2]]

    # -------------------------------------------------------------------- splits
    def split_adders(self, per_modulus: int = 1, seed: int = 0) -> tuple[Tensor, Tensor]:
        """Training and held-out triples: for each modulus, ``per_modulus`` shifts drawn at
        random are held out (every x with them), redrawn until every shift still occurs in
        training with some modulus (module doc). ValueError if that cannot be done."""
        n = len(self.shifts)
        if isinstance(per_modulus, bool) or not isinstance(per_modulus, int) or not (
                0 < per_modulus < n):
            raise ValueError(f"per_modulus must be an int in [1, {n - 1}] (each modulus keeps a "
                             f"shift), got {per_modulus!r}")
        if per_modulus * len(self.moduli) > (len(self.moduli) - 1) * n:
            raise ValueError(f"cannot hold out {per_modulus} of {n} shifts for each of "
                             f"{len(self.moduli)} moduli and still train every shift")
        gen = torch.Generator().manual_seed(seed)
        for _ in range(1000):
            held = {j: set(torch.randperm(n, generator=gen)[:per_modulus].tolist())
                    for j in range(len(self.moduli))}
            if all(any(i not in held[j] for j in held) for i in range(n)):
                break
        else:  # pragma: no cover - the bound above makes a valid draw likely
            raise ValueError("no held-out adder sets keep every shift in training")
        triples = self.all_triples()
        out = torch.tensor([int(a) in held[int(m)] for _, a, m in triples.tolist()])
        return triples[~out], triples[out]

    def split_moduli(self, held_out: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Training triples of the other moduli, held-out triples of ``held_out`` (moduli, not
        indices). Each held-out modulus must not exceed the largest training modulus, so its
        digits and answers are training digits and answers (module doc)."""
        held = list(held_out)
        unknown = [p for p in held if p not in self.moduli]
        if not held or unknown or len(set(held)) != len(held):
            raise ValueError(f"held_out must be distinct moduli of the task {list(self.moduli)},"
                             f" got {held!r}")
        kept = [p for p in self.moduli if p not in held]
        if not kept:
            raise ValueError("held_out leaves no modulus to train on")
        too_big = [p for p in held if p > max(kept)]
        if too_big:
            raise ValueError(f"held-out moduli {too_big} exceed the largest training modulus "
                             f"{max(kept)}: their digits and answers would never be trained")
        triples = self.all_triples()
        out = torch.tensor([self.moduli[m] in held for m in triples[:, 2].tolist()])
        return triples[~out], triples[out]

    # ----------------------------------------------------------------- encodings
    def typed_codes(self) -> dict[str, Tensor]:
        """Enc per grade: digits x ↦ e_x in ``num`` (V, width), MOD_p ↦ e_j in ``mod``."""
        num = torch.zeros(self.vocab_size, self.width)
        num[: self.max_digit, : self.max_digit] = torch.eye(self.max_digit)
        mod = torch.zeros(self.vocab_size, len(self.moduli))
        for j, token in self.mod_token.items():
            mod[token, j] = 1.0
        return {"num": num, "mod": mod}


class ModularReduction(nn.Module):
    """The fixed bilinear tool φ(z_mod, z_num) = Σ_j z_mod[j] R_{p_j} z_num, R_p e_s = e_{s mod p}
    (reduce the integer code in ``num`` by the modulus coded in ``mod``)."""

    differentiable = True
    token_local = True
    reads_dest = True

    def __init__(self, moduli: Sequence[int], width: int) -> None:
        super().__init__()
        moduli = _int_list("moduli", moduli, 2)
        reduce = torch.zeros(len(moduli), width, width)
        for j, p in enumerate(moduli):
            s = torch.arange(width)
            reduce[j, s % p, s] = 1.0
        self.register_buffer("reduce", reduce)

    def forward(self, x_src: Tensor, x_dst: Tensor) -> Tensor:
        per_modulus = torch.einsum("...w,jvw->...jv", x_dst, self.reduce.to(x_dst.dtype))
        return (x_src.unsqueeze(-1) * per_modulus).sum(-2)


def integer_shift(width: int, k: int) -> FixedLinearBlock:
    """e_s ↦ e_{s+k} for s + k < width (no wrap-around), as a fixed ``width``×``width`` map."""
    matrix = torch.zeros(width, width)
    s = torch.arange(width - k)
    matrix[s + k, s] = 1.0
    return FixedLinearBlock(matrix)


def build_modular_model(
    task: ModularAdditionTask, *, sem_dim: int = 16, rank: int = 8, beta: float = 5.0,
    readout_scale: float = 4.0, router_input: str = "context",
    objective: MorphicObjective | None = None,
) -> MorphicTransformer:
    """The three-layer model of the module doc; ``router_input`` is the adder router's
    ``input_type`` (:class:`graded.morphic.router.Router`)."""
    if not isinstance(task, ModularAdditionTask):
        raise TypeError(f"task must be a ModularAdditionTask, got {type(task).__name__}")
    width, n_mod = task.width, len(task.moduli)
    space = GradedStateSpace({"sem": sem_dim, "num": width, "mod": n_mod})
    copies = EdgeSet.explicit(space, [("sem", "num", "copy_digit"), ("sem", "mod", "copy_mod")])
    # the modulus copy keys on ``sem`` (token and position): a held-out modulus's typed code
    # e_j would meet an untrained key column
    layer1 = MorphicLayer(space, copies, [
        GradeTypedAttention(sem_dim, width, num_heads=1, head_dim=8, identity_values=True),
        GradeTypedAttention(sem_dim, n_mod, num_heads=1, head_dim=8, identity_values=True,
                            key_source="source")], router={"rank": rank}, beta=beta)
    adders = EdgeSet.explicit(space, [("num", "num", f"add_{k}") for k in task.shifts])
    router = {"rank": rank, "input_type": router_input}
    if router_input != "context":
        router["operator_tokens"] = list(task.add_token.values())
    layer2 = MorphicLayer(space, adders, [integer_shift(width, k) for k in task.shifts],
                          router=router, beta=beta)
    reduce = EdgeSet.explicit(space, [("mod", "num", "reduce")])
    # every example needs the reduction: an always-on block (one edge, no stay option)
    layer3 = MorphicLayer(space, reduce, [ModularReduction(task.moduli, width)],
                          router={"rank": rank, "stay": False}, beta=beta)
    codes = task.typed_codes()
    return MorphicTransformer(
        space, [layer1, layer2, layer3], task.vocab_size, max_len=task.sequence_length,
        learned_grades=["sem"], typed_embeddings=codes,
        readout_init={"num": readout_scale * codes["num"]}, objective=objective)


@torch.no_grad()
def evaluate_modular(model: MorphicTransformer, task: ModularAdditionTask, triples: Tensor
                     ) -> dict[str, float]:
    """With context-only routing (``model(ids)``, no targets) on ``triples``: answer accuracy,
    adder routing accuracy (at "=", layer 2's most probable option, stay included, is the
    example's adder) and the fraction of "=" tokens whose reduction edge is selected (layer 3)."""
    ids, targets, adder, _ = task.make(triples)
    was_training = model.training
    model.eval()
    answer = (model(ids)[:, 3].argmax(-1) == targets[:, 3]).float().mean()
    traces = model.routing(ids)
    alpha = traces[1].alpha[:, 3]
    picked = alpha.argmax(-1)
    stay = 1 - alpha.sum(-1)  # the identity mass of ``num`` (the stay option)
    routed = (alpha.gather(-1, picked.unsqueeze(-1)).squeeze(-1) > stay) & (picked == adder)
    reduce = (traces[2].alpha[:, 3, 0] > 0.5).float().mean()
    model.train(was_training)
    return {"answer_accuracy": float(answer), "routing_accuracy": float(routed.float().mean()),
            "reduce_rate": float(reduce)}
