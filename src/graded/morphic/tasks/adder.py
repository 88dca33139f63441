"""Task A: modular addition with adder morphisms, variable k (004 §5.3.1 in its App. A.3 form).

Sequences [x, ADD_k, =] with target (x + k) mod p at the "=" position (other positions are
ignored). Following App. A.3 (E = I_p, copy morphisms are identities, adders are the cyclic
permutations A_k), digit tokens carry the typed code Enc(x) = e_x in the grade ``num`` (a fixed
embedding) and the readout of ``num`` starts at the typed decoder (W = c·I_p, trainable);
everything else is learned. Without that start the readout has a symmetry, a readout shifted by
c paired with routing shifted by −c fits every k whose shifted adder exists, and training settles
there (``benchmarks/morphic_variable_k.py --no-typed-readout``; docs/morphic.md quotes the
measured accuracies); "the right adder" is only defined relative to a calibrated decoder.

- layer 1: one edge num ← sem, a grade-typed causal attention with identity values (a copy of
  the digit code from the position the query selects);
- layer 2: one edge num ← num per adder, either the internal linear morphism A_k
  (``tool="internal"``) or the external calculator x ↦ (x + k) mod p wrapped as
  Enc ∘ calculator ∘ Dec (``tool="external"``, non-differentiable); a per-destination softmax
  router must pick the adder from the causal context (the ADD_k token), per token.

Routing accuracy = fraction of "=" positions where layer 2's most probable option, the stay
option included, is the adder of the example (a token left on the skip path has picked no adder).

``distractor=`` adds one more edge num ← num to layer 2, named "distractor", after the adders,
whose block is useless for every example: "zero" (φ ≡ 0) or "random" (a fixed Gaussian matrix
R/√p, drawn from ``distractor_seed``). A router that learns to leave it unselected makes its
ablation cost nothing (004 §5.4 edge ablation), the control that ablation needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from graded.checks import check_id_range
from graded.morphic.attention_block import GradeTypedAttention
from graded.morphic.blocks import FixedLinearBlock
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.model import MorphicObjective, MorphicTransformer
from graded.morphic.state import GradedStateSpace
from graded.morphic.tools import calculator_adder

DISTRACTORS = (None, "zero", "random")


class VariableAdditionTask:
    def __init__(self, p: int = 11, shifts: Sequence[int] = (1, 2, 3, 4)) -> None:
        if not isinstance(p, int) or p < 2:
            raise ValueError(f"p must be an int >= 2, got {p!r}")
        bad = [k for k in shifts if isinstance(k, bool) or not isinstance(k, int)]
        if bad:  # int() would truncate 1.7 to 1 and read "3" and True as shifts
            raise ValueError(f"shifts must be ints, got {list(shifts)!r} (not ints: {bad!r})")
        shifts = list(shifts)
        if not shifts or len(set(k % p for k in shifts)) != len(shifts):
            raise ValueError(f"shifts must be non-empty and distinct mod p={p}, got {shifts}")
        self.p, self.shifts = p, tuple(shifts)
        self.add_token = {i: p + i for i in range(len(shifts))}
        self.eq_token = p + len(shifts)
        self.vocab_size = p + len(shifts) + 1

    def make(self, x: Tensor, adder: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """input_ids (B, 3), targets (B, 3) (−100 except at "="), adder index (B,).

        ``x`` must hold digits 0..p−1 and ``adder`` indices 0..|shifts|−1: a digit ≥ p is an
        operator token, and a negative index would wrap to the last adder."""
        _check_range("x", x, self.p, "digits")
        _check_range("adder", adder, len(self.shifts), "adder indices")
        shifts = torch.tensor(self.shifts, dtype=torch.long)
        ids = torch.stack([x, self.p + adder, torch.full_like(x, self.eq_token)], dim=1)
        targets = torch.full_like(ids, -100)
        targets[:, 2] = (x + shifts[adder]) % self.p
        return ids, targets, adder

    def sample(self, batch: int, generator: torch.Generator | None = None, *,
               pairs: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``batch`` examples drawn uniformly: (x, adder) over all pairs, or over the rows of
        ``pairs`` (n, 2) (e.g. :meth:`split`'s training pairs)."""
        if pairs is None:
            x = torch.randint(0, self.p, (batch,), generator=generator)
            adder = torch.randint(0, len(self.shifts), (batch,), generator=generator)
            return self.make(x, adder)
        rows = pairs[torch.randint(0, len(pairs), (batch,), generator=generator)]
        return self.make(rows[:, 0], rows[:, 1])

    def all_pairs(self) -> Tensor:
        """Every (x, adder index) pair, (p·|shifts|, 2), x-major."""
        x = torch.arange(self.p).repeat_interleave(len(self.shifts))
        adder = torch.arange(len(self.shifts)).repeat(self.p)
        return torch.stack([x, adder], dim=1)

    def all_examples(self) -> tuple[Tensor, Tensor, Tensor]:
        pairs = self.all_pairs()
        return self.make(pairs[:, 0], pairs[:, 1])

    def examples(self, pairs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The examples of the (x, adder) rows of ``pairs``."""
        return self.make(pairs[:, 0], pairs[:, 1])

    def split(self, n_held_out: int, seed: int = 0) -> tuple[Tensor, Tensor]:
        """Training and held-out (x, adder) pairs: ``n_held_out`` pairs drawn at random, each
        kept out only if every digit x, every adder and every answer (x + k) mod p still occurs
        in the training pairs, so that a held-out example combines parts all seen in training.
        ValueError if that many cannot be held out."""
        pairs = self.all_pairs()
        if isinstance(n_held_out, bool) or not isinstance(n_held_out, int) or not (
                0 < n_held_out < len(pairs)):  # True held out one pair
            raise ValueError(f"n_held_out must be an int in [1, {len(pairs) - 1}], got "
                             f"{n_held_out!r}")
        shifts = torch.tensor(self.shifts)
        train = torch.ones(len(pairs), dtype=torch.bool)
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))
        for i in order.tolist():
            if int((~train).sum()) == n_held_out:
                break
            train[i] = False
            kept = pairs[train]
            answers = (kept[:, 0] + shifts[kept[:, 1]]) % self.p
            covered = (len(kept[:, 0].unique()) == self.p
                       and len(kept[:, 1].unique()) == len(self.shifts)
                       and len(answers.unique()) == self.p)
            if not covered:
                train[i] = True
        if int((~train).sum()) != n_held_out:
            raise ValueError(f"cannot hold out {n_held_out} of {len(pairs)} pairs and still see "
                             "every digit, adder and answer in training")
        return pairs[train], pairs[~train]

    def typed_digits(self) -> Tensor:
        """Enc: the (V, p) table with row x = e_x for digit tokens and 0 for the others."""
        table = torch.zeros(self.vocab_size, self.p)
        table[: self.p] = torch.eye(self.p)
        return table


def _check_range(name: str, values: Tensor, n: int, what: str) -> None:
    """``values`` must be an integer tensor in [0, n); a ValueError naming it otherwise."""
    if not isinstance(values, Tensor) or values.is_floating_point() or values.is_complex():
        raise ValueError(f"{name} must be an integer tensor of {what} in [0, {n}), got "
                         f"{getattr(values, 'dtype', type(values).__name__)}")
    check_id_range(values, n, f"{name} ({what})")


def build_adder_model(
    task: VariableAdditionTask, *, tool: str = "internal", sem_dim: int = 16, rank: int = 8,
    beta: float = 5.0, pooling: str = "mean", readout_scale: float = 4.0,
    objective: MorphicObjective | None = None, max_len: int = 8,
    distractor: str | None = None, distractor_seed: int = 0, router_input: str = "context",
    train_routing: str = "context", typed_readout: bool = True,
) -> MorphicTransformer:
    """The two-layer model of the module doc. ``router_input`` is the adder router's
    ``input_type``: "context" (the pooled context and the token's own ``num`` code),
    "operator" (a learned embedding of the most recent ADD_k token, so the adder choice can
    depend on k only) or "operator_state" (the state at the ADD_k position).
    ``train_routing`` is both layers' (:class:`~graded.morphic.layer.MorphicLayer`).
    ``typed_readout=False`` leaves the readout of ``num`` at its default initialisation instead of
    the typed decoder c·I_p (the ablation of the module doc)."""
    if tool not in ("internal", "external"):
        raise ValueError(f"tool must be 'internal' or 'external', got {tool!r}")
    if not (isinstance(readout_scale, (int, float)) and math.isfinite(readout_scale)
            and readout_scale > 0):
        raise ValueError(f"readout_scale must be a finite number > 0 (the typed decoder "
                         f"c·I_p), got {readout_scale!r}")
    if distractor not in DISTRACTORS:
        raise ValueError(f"distractor must be one of {DISTRACTORS}, got {distractor!r}")
    p = task.p
    space = GradedStateSpace({"sem": sem_dim, "num": p})
    copy_edges = EdgeSet.explicit(space, [("sem", "num", "copy")])
    copy = GradeTypedAttention(sem_dim, p, num_heads=1, head_dim=8, identity_values=True)
    layer1 = MorphicLayer(space, copy_edges, [copy], router={"rank": rank}, beta=beta,
                          train_routing=train_routing)
    names = [f"add_{k}" for k in task.shifts] + (["distractor"] if distractor else [])
    add_edges = EdgeSet.explicit(space, [("num", "num", name) for name in names])
    if tool == "internal":
        adders = [FixedLinearBlock.cyclic_shift(p, k) for k in task.shifts]
    else:
        adders = [calculator_adder(k, p) for k in task.shifts]
    if distractor is not None:
        adders = [*adders, distractor_block(p, distractor, distractor_seed)]
    router = {"rank": rank, "pooling": pooling, "input_type": router_input}
    if router_input != "context":
        router["operator_tokens"] = list(task.add_token.values())
    layer2 = MorphicLayer(space, add_edges, adders, router=router, beta=beta,
                          train_routing=train_routing)
    return MorphicTransformer(
        space, [layer1, layer2], task.vocab_size, max_len=max_len, learned_grades=["sem"],
        typed_embeddings={"num": task.typed_digits()},
        readout_init={"num": readout_scale * task.typed_digits()} if typed_readout else None,
        objective=objective)


def distractor_block(p: int, kind: str, seed: int = 0) -> FixedLinearBlock:
    """A useless num ← num block: x ↦ 0 (``"zero"``) or x ↦ R x with R_ij ~ N(0, 1/p) fixed by
    ``seed`` (``"random"``); the zero map never gives the answer e_{x+k}, a random one only by
    chance."""
    if kind == "zero":
        return FixedLinearBlock(torch.zeros(p, p))
    if kind == "random":
        g = torch.Generator().manual_seed(seed)
        return FixedLinearBlock(torch.randn(p, p, generator=g) / p ** 0.5)
    raise ValueError(f"distractor kind must be 'zero' or 'random', got {kind!r}")


@torch.no_grad()
def evaluate_adder(model: MorphicTransformer, task: VariableAdditionTask,
                   data: tuple[Tensor, Tensor, Tensor] | None = None) -> dict[str, float]:
    """Answer and routing accuracy with context-only routing (``model(ids)``, no targets), and
    for comparison the routing accuracy of the utility-augmented logits ℓ̃ (which need targets).

    Routing is correct at "=" when the example's adder is layer 2's most probable option, the
    stay option included: the largest α_e exceeds the identity mass 1 − Σ_e α_e (every edge of
    layer 2 enters ``num``), and for ℓ̃ the argmax over [edges | stay] (``Router.choices``)."""
    ids, targets, adder = data if data is not None else task.all_examples()
    was_training = model.training
    model.eval()
    logits = model(ids)
    answer = (logits[:, 2].argmax(-1) == targets[:, 2]).float().mean()
    traces = model.routing(ids)
    alpha = traces[-1].alpha[:, 2]
    top = alpha.max(-1)
    stay = 1 - alpha.sum(-1)  # the identity mass of ``num``; 0 without a stay option
    routing = ((top.indices == adder) & (top.values > stay)).float().mean()
    _, utraces = model.utility_routing(ids, targets)
    router = model.layers[-1].router
    u_pick = router.choices(utraces[-1].utility_logits[:, 2])[..., 0]  # one group: ``num``
    u_routing = (u_pick == adder).float().mean()
    model.train(was_training)
    return {"answer_accuracy": float(answer), "routing_accuracy": float(routing),
            "utility_routing_accuracy": float(u_routing)}
