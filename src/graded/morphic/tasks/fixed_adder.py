"""Task A1: modular addition with a fixed k and a learned adder (004 §5.3.1, App. A.3; notes C1).

G = {sem, num}, V_sem = V_num = ℝ^p. A sequence is one digit [x]. Its target at that position is
(x + k) mod p, the next token. The input state is z^{(sem)} = e_x, the typed code of App. A.3
(E = I_p), plus N(0, σ_n²) noise in training when σ_n > 0, and z^{(num)} = 0. The readout is the
typed decoder W = c·I_p on ``sem``, frozen; nothing reads ``num``. Every layer has the same four
edges:

- ``copy_in``  num ← sem, the identity (fixed: App. A.3's copy morphism);
- ``add``      num ← num, a learned ``LinearBlock`` without bias: the only block that must learn
  A_k;
- ``copy_out`` sem ← num, the identity (fixed);
- ``keep``     sem ← sem, the identity, a no-op under the replacement update.

The program V_sem → V_num →(A_k) V_num → V_sem uses one edge per layer, so it needs three layers:
copy_in, add, copy_out (``PROGRAM``).

**Update and normalisation.** Routing is global: one softmax over the four edges of a layer, with
no stay option (``stay=False``: ``keep`` is the identity already). The
update is ``gated_replace``, z^{(h)} + Σ_{e→h} α_e(φ_e − z^{(h)}). With a one-hot α a layer writes
only the destination of its edge and leaves the other grade alone, which is what the program needs.
Layers 1 and 2 must leave ``sem`` alone, and layer 3 must replace ``sem``, not add to it. So
``residual_typed``, which adds the copy, cannot express the program. A per-destination softmax
could express it, but it writes both grades in every layer, and it is not "one edge per layer".

**Training the routing.** The routers learn from their context logits (``train_routing="context"``),
through the language-model loss, not from the utilities. The readout reads only ``sem``, so every
write into ``num`` has utility ΔL = 0 exactly (notes C1, flaw (i)): the utilities cannot see
layers 1 and 2 doing their job. With one token per sequence the causal context at t = 0 is
empty, so routing depends only on the layer's router (its biases) and the source components. For
a fixed k that is enough, because the right edge depends on the layer, not on x.

**Initial values.** The adder starts at zero (``adder_init="zeros"``) and the readout scale at
c = 1 (App. A.3's W = I_p). Before training, the identity readout predicts x itself, confidently
wrong. Layer 1's ``copy_out`` copies the empty ``num`` over ``sem`` and removes that error at once.
A random adder that starts anti-correlated with A_k, or a large c, lets the routers settle on
that shortcut before the adder is useful (docs/morphic.md, task A1).

**What converges.** The readout cannot see a constant added to a column of φ_add (it adds the
same constant to every logit), and cross-entropy keeps rewarding a larger gain: A_k is not a
minimiser. So ‖φ_add − A_k‖_F does not go to 0. What goes to 0 is ``shape_distance``, the
distance up to gain and column shifts.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from graded.morphic.blocks import FixedLinearBlock, LinearBlock
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.model import MorphicObjective, MorphicTransformer
from graded.morphic.state import GradedStateSpace

EDGES = (("sem", "num", "copy_in"), ("num", "num", "add"), ("num", "sem", "copy_out"),
         ("sem", "sem", "keep"))
PROGRAM = ("copy_in", "add", "copy_out")
ADDER_LAYER = PROGRAM.index("add")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class FixedAdditionTask:
    """[x] → (x + k) mod p for one fixed k; ``noise`` is σ_n, the std of the noise on z^{(sem)}."""

    def __init__(self, p: int = 7, k: int = 3, noise: float = 0.0) -> None:
        if not _is_int(p) or p < 2:
            raise ValueError(f"p must be an int >= 2, got {p!r}")
        if not _is_int(k):
            raise ValueError(f"k must be an int, got {k!r}")
        if k % p == 0:
            raise ValueError(f"k must not be 0 mod p={p} (the answer would be x itself), got {k}")
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not (
                0 <= noise < math.inf):  # inf noise made every training state inf or NaN
            raise ValueError(f"noise must be a finite float >= 0, got {noise!r}")
        self.p, self.k, self.noise = p, k, float(noise)
        self.vocab_size = p

    def make(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """input_ids (B, 1) = x and targets (B, 1) = (x + k) mod p."""
        ids = x.long().reshape(-1, 1)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.p):
            raise ValueError(f"digits must lie in [0, {self.p}), got values from {int(ids.min())} "
                             f"to {int(ids.max())}")
        return ids, (ids + self.k) % self.p

    def sample(self, batch: int, generator: torch.Generator | None = None
               ) -> tuple[Tensor, Tensor]:
        if not _is_int(batch) or batch <= 0:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        return self.make(torch.randint(0, self.p, (batch,), generator=generator))

    def all_examples(self) -> tuple[Tensor, Tensor]:
        return self.make(torch.arange(self.p))

    def adder_matrix(self) -> Tensor:
        """A_k, the cyclic shift A_k e_d = e_{d+k} (App. A.3)."""
        return FixedLinearBlock.cyclic_shift(self.p, self.k).matrix.clone()


class NoisyCodeTransformer(MorphicTransformer):
    """A ``MorphicTransformer`` that adds N(0, σ²) noise to chosen grades of the embedded state in
    training mode. Like dropout, it is off in evaluation mode."""

    def __init__(self, *args, input_noise: float = 0.0, noisy_grades: tuple[str, ...] = (),
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(input_noise, bool) or not isinstance(input_noise, (int, float)) or not (
                0 <= input_noise < math.inf):
            raise ValueError(f"input_noise must be a finite float >= 0, got {input_noise!r}")
        self.input_noise = float(input_noise)
        self.register_buffer("noise_mask", self.space.grade_mask(noisy_grades).float())

    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        z = super().embed_tokens(input_ids)
        if self.training and self.input_noise > 0:
            z = z + self.input_noise * torch.randn_like(z) * self.noise_mask
        return z


def build_fixed_adder_model(
    task: FixedAdditionTask, *, rank: int = 4, readout_scale: float = 1.0,
    adder_init: str = "zeros", train_routing: str = "context", beta: float = 5.0,
    objective: MorphicObjective | None = None,
) -> NoisyCodeTransformer:
    """Three layers over ``EDGES``. Only the ``add`` blocks and the routers are trained."""
    if not isinstance(task, FixedAdditionTask):
        raise TypeError(f"task must be a FixedAdditionTask, got {type(task).__name__}")
    if isinstance(readout_scale, bool) or not readout_scale > 0:
        raise ValueError(f"readout_scale must be > 0, got {readout_scale!r}")
    if adder_init not in ("zeros", "default"):
        raise ValueError(f"adder_init must be 'zeros' or 'default', got {adder_init!r}")
    p = task.p
    space = GradedStateSpace({"sem": p, "num": p})
    edges = EdgeSet.explicit(space, EDGES)
    identity = torch.eye(p)
    layers = []
    for _ in PROGRAM:
        adder = LinearBlock(p, p)
        if adder_init == "zeros":
            torch.nn.init.zeros_(adder.proj.weight)
        blocks = {"copy_in": FixedLinearBlock(identity), "add": adder,
                  "copy_out": FixedLinearBlock(identity), "keep": FixedLinearBlock(identity)}
        layers.append(MorphicLayer(
            space, edges, [blocks[e.name] for e in edges], beta=beta,
            router={"rank": rank, "normalization": "global", "stay": False},
            update="gated_replace",
            train_routing=train_routing))
    model = NoisyCodeTransformer(
        space, layers, task.vocab_size, positional="none", learned_grades=[],
        typed_embeddings={"sem": identity}, objective=objective,
        readout_init={"sem": readout_scale * identity, "num": torch.zeros(p, p)},
        input_noise=task.noise, noisy_grades=("sem",))
    with torch.no_grad():
        model.readout.bias.zero_()
    model.readout.requires_grad_(False)
    return model


def adder_block(model: MorphicTransformer, layer: int = ADDER_LAYER) -> Tensor:
    """The learned matrix (d_num, d_num) of one layer's ``add`` edge."""
    names = [e.name for e in model.layers[layer].edges]
    return model.layers[layer].blocks[names.index("add")].proj.weight.detach().clone()


def nearest_permutation(matrix: Tensor) -> Tensor:
    """The permutation matrix P closest to ``matrix`` in Frobenius norm.

    ‖M − P‖²_F = ‖M‖²_F − 2⟨M, P⟩ + n, so P maximises Σ_j M[σ(j), j]. That is an assignment
    problem, solved here by the Hungarian algorithm in its O(n³) potentials form."""
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"matrix must be square, got shape {tuple(matrix.shape)}")
    cost = (-matrix.double()).T.tolist()  # cost[i][j]: input i assigned to output j
    n = len(cost)
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)  # potentials of rows and columns (1-based)
    owner, way = [0] * (n + 1), [0] * (n + 1)  # owner[column] = row, 0 = free
    for row in range(1, n + 1):
        owner[0], col = row, 0
        slack, used = [inf] * (n + 1), [False] * (n + 1)
        while owner[col] != 0:  # grow an alternating tree until it reaches a free column
            used[col] = True
            r, delta, nxt = owner[col], inf, 0
            for c in range(1, n + 1):
                if not used[c]:
                    reduced = cost[r - 1][c - 1] - u[r] - v[c]
                    if reduced < slack[c]:
                        slack[c], way[c] = reduced, col
                    if slack[c] < delta:
                        delta, nxt = slack[c], c
            for c in range(n + 1):
                if used[c]:
                    u[owner[c]] += delta
                    v[c] -= delta
                else:
                    slack[c] -= delta
            col = nxt
        while col:  # augment along the tree path
            prev = way[col]
            owner[col] = owner[prev]
            col = prev
    perm = torch.zeros(n, n, dtype=matrix.dtype)
    for c in range(1, n + 1):
        perm[c - 1, owner[c] - 1] = 1.0
    return perm


def shape_distance(matrix: Tensor, target: Tensor) -> dict[str, float]:
    """The distance of ``matrix`` to ``target`` up to gain and column shifts, and the gain.

    ``shape_distance`` = min_{s, b} ‖s·M + 1bᵀ − T‖_F / ‖C T‖_F = sin∠(C M, C T), where
    C = I − 11ᵀ/n removes column means. ``gain`` = ⟨C M, C T⟩ / ‖C T‖²_F, so M ≈ gain·T up to
    column shifts."""
    n = target.shape[0]
    centre = torch.eye(n, dtype=torch.float64) - 1.0 / n
    x, y = centre @ matrix.double(), centre @ target.double()
    cos = (x * y).sum() / (x.norm() * y.norm()).clamp_min(1e-300)
    return {"shape_distance": float((1 - cos.clamp(-1, 1) ** 2).sqrt()),
            "gain": float((x * y).sum() / y.norm() ** 2)}


@torch.no_grad()
def evaluate_fixed_adder(model: MorphicTransformer, task: FixedAdditionTask, *,
                         noisy_samples: int = 0, seed: int = 0) -> dict[str, float]:
    """Metrics with context-only routing (``model(ids)``, no targets), on all p digits:

    - ``answer_accuracy``;
    - ``routing_accuracy_layer{i}``: the fraction of digits where layer i's argmax α is
      ``PROGRAM[i - 1]``; ``routing_accuracy``: the fraction where every layer picks its edge;
    - the learned adder φ = φ_add of layer 2, against A_k: ``adder_distance`` =
      ‖φ − A_k‖_F / ‖A_k‖_F; ``permutation_distance`` = ‖φ − P‖_F / ‖P‖_F for the nearest
      permutation P; ``nearest_permutation_is_adder`` (1.0 when P = A_k); ``shape_distance``
      and ``gain`` (``shape_distance`` above);
    - with ``noisy_samples`` > 0: ``noisy_answer_accuracy`` on that many digits, with the
      task's input noise drawn from ``seed``.
    """
    if not _is_int(noisy_samples) or noisy_samples < 0:
        raise ValueError(f"noisy_samples must be an int >= 0, got {noisy_samples!r}")
    if model.space.labels != ("sem", "num") or model.space.dim("num") != task.p:
        raise ValueError(f"model is not an A1 model for p={task.p}: grades "
                         f"{dict((g, model.space.dim(g)) for g in model.space.labels)}")
    ids, targets = task.all_examples()
    was_training = model.training
    model.eval()
    out = {"answer_accuracy": float((model(ids)[:, 0].argmax(-1) == targets[:, 0]).float().mean())}
    hits = []
    for i, (trace, name) in enumerate(zip(model.routing(ids), PROGRAM), start=1):
        names = [e.name for e in model.layers[i - 1].edges]
        hit = trace.alpha[:, 0].argmax(-1) == names.index(name)
        out[f"routing_accuracy_layer{i}"] = float(hit.float().mean())
        hits.append(hit)
    out["routing_accuracy"] = float(torch.stack(hits).all(0).float().mean())
    phi, a_k = adder_block(model), task.adder_matrix()
    perm = nearest_permutation(phi)
    out["adder_distance"] = float((phi - a_k).norm() / a_k.norm())
    out["permutation_distance"] = float((phi - perm).norm() / perm.norm())
    out["nearest_permutation_is_adder"] = float(torch.equal(perm, a_k))
    out.update(shape_distance(phi, a_k))
    if noisy_samples:
        ids, targets = task.sample(noisy_samples, torch.Generator().manual_seed(seed))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model.train()  # switches the input noise on; routing stays context-only
            logits = model(ids)
            model.eval()
        out["noisy_answer_accuracy"] = float((logits[:, 0].argmax(-1) == targets[:, 0])
                                             .float().mean())
    model.train(was_training)
    return out
