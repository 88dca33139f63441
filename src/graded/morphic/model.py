"""``MorphicTransformer``: embeddings, stacked ``MorphicLayer``s and a linear readout (004 §4).

The protocol the trainer and CLI rely on:

- ``model(input_ids, key_padding_mask=None) -> logits`` (B, T, V): evaluation; routes with
  context logits only.
- ``model.training_loss(input_ids, targets, key_padding_mask=None) -> (loss, metrics)``: the
  only entry point that takes targets; computes utilities, L_GT and the router-distillation
  term. The loss is a mean over the scored tokens (targets != ``ignore_index``); every term
  is 0 when no token is scored.
- ``model.generate(input_ids, max_new_tokens, ...)``: context-only routing, greedy or sampled.

This is the protocol :class:`graded.kinds.MorphicModel`. Padding: every block and the router read
only positions s ≤ t (causal attention, causal pooling of the strictly earlier states, per-token
updates), so padding after a row's last real token (right padding, which every task makes) cannot
change the outputs at its real tokens, and the loss skips it through the ``ignore_index``
targets. Padding before a real token would be read by it: such a ``key_padding_mask`` is refused.

The readout is linear (no final norm), so the exact utility formula of ``utilities.py`` holds at
every layer; each layer's utilities use the shared readout on that layer's state (the logit-lens
reading of 004 App. B). Typed embeddings (fixed per-token tables in chosen grades, e.g. the one-hot
digit code Enc of 004 App. A.3) are buffers added to the learned embedding; ``readout_init``
starts chosen readout slices at a typed decoder (App. A.3's W = I_p), and they stay trainable.

Training objective (per batch; ``MorphicObjective`` holds the weights):
L = L_LM + λ Σ_layers penalty + μ Σ_layers Ω + κ Σ_layers KL(α(β(ΔL − τ)) ‖ α(ℓ)) [+ REINFORCE].
The KL term is this library's addition (004 never says how to route without targets): it
teaches the context logits ℓ the routing that the utilities reveal (the Gibbs routing of 004
Prop 6.10), so evaluation can drop them. The teacher is the utility part of ℓ̃ alone: a teacher
ℓ̃ = ℓ + β(ΔL − τ) contains the student, and the KL is then minimised by inflating ℓ until βΔL
no longer matters, which freezes whatever routing ℓ had (``MorphicObjective(distill_teacher=
"full")`` keeps that teacher as an ablation; docs/morphic.md quotes its measured effect).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from graded.checks import check_int, check_token_ids, inputs_checked
from graded.morphic.layer import LayerTrace, MorphicLayer, UtilityProbe
from graded.morphic.objective import (
    OMEGAS,
    PENALTIES,
    _masked_mean,
    reinforce_surrogate,
    routing_regularizer,
    utility_penalty,
)
from graded.morphic.router import Router
from graded.morphic.state import GradedStateSpace
from graded.morphic.utilities import ATTACHES, UTILITY_KINDS
from graded.transformer import generation

DISTILL_TEACHERS = ("utility", "full")


@dataclass
class MorphicObjective:
    """Weights of L_GT: λ (``utility_weight``), μ (``omega_weight``), κ (``distill_weight``).

    ``distill_teacher`` is the teacher of the distillation term: ``"utility"`` (default) the
    utility part β(ΔL − τ) alone, ``"full"`` the whole ℓ̃ = ℓ + β(ΔL − τ) (ℓ attached, as in
    the student), kept only as the ablation that shows why the default drops ℓ (module doc).
    ``penalty`` is the utility penalty's form (:data:`~graded.morphic.objective.PENALTIES`):
    ``"sum"`` Σ_e ψ over the edges, ``"expectation"`` Σ_e p_e ψ under the routing kernel."""

    utility_weight: float = 0.1
    omega: str = "entropy_penalty"
    omega_weight: float = 1e-3
    distill_weight: float = 1.0
    reinforce_weight: float = 1.0
    utility: str = "exact"
    attach: str = "phi"
    distill_teacher: str = "utility"
    penalty: str = "sum"

    def __post_init__(self) -> None:
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {self.penalty!r}")
        if self.omega not in OMEGAS:
            raise ValueError(f"omega must be one of {OMEGAS}, got {self.omega!r}")
        if self.utility not in UTILITY_KINDS:
            raise ValueError(f"utility must be one of {UTILITY_KINDS}, got {self.utility!r}")
        if self.attach not in ATTACHES:
            raise ValueError(f"attach must be one of {ATTACHES}, got {self.attach!r}")
        if self.distill_teacher not in DISTILL_TEACHERS:
            raise ValueError(f"distill_teacher must be one of {DISTILL_TEACHERS}, got "
                             f"{self.distill_teacher!r}")
        for name in ("utility_weight", "omega_weight", "distill_weight", "reinforce_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 <= value < math.inf):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


class MorphicTransformer(nn.Module):
    def __init__(
        self, space: GradedStateSpace, layers: Sequence[MorphicLayer], vocab_size: int, *,
        max_len: int = 256, positional: str = "learned",
        learned_grades: Sequence[str] | None = None,
        typed_embeddings: Mapping[str, Tensor] | None = None,
        readout_init: Mapping[str, Tensor] | None = None,
        objective: MorphicObjective | None = None, ignore_index: int = -100,
    ) -> None:
        super().__init__()
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        ignore_index = check_int("ignore_index", ignore_index)
        if positional not in ("learned", "none"):
            raise ValueError(f"positional must be 'learned' or 'none', got {positional!r}")
        max_len = check_int("max_len", max_len, minimum=1)
        if not layers:  # the objective's per-layer terms and metrics need at least one
            raise ValueError("a MorphicTransformer needs at least one MorphicLayer, got none")
        for i, layer in enumerate(layers):  # labels, dims and indices: the slice layout
            if layer.space is not space and layer.space.grades != space.grades:
                raise ValueError(f"layer {i} uses the grades {list(layer.space.grades)}; "
                                 f"expected the model's, {list(space.grades)}")
            tokens = layer.router.operator_tokens.tolist()  # an id past the vocabulary never occurs
            if tokens and max(tokens) >= vocab_size:
                raise ValueError(f"layer {i}'s router reads operator_tokens {tokens}; expected "
                                 f"token ids below vocab_size = {vocab_size}")
        self.space, self.vocab_size, self.max_len = space, vocab_size, max_len
        self.ignore_index = ignore_index
        self.objective = objective or MorphicObjective()
        self.layers = nn.ModuleList(layers)
        d = space.total_dim
        self.embed = nn.Embedding(vocab_size, d)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.positional = positional
        self.pos = nn.Embedding(max_len, d) if positional == "learned" else None
        if self.pos is not None:
            nn.init.normal_(self.pos.weight, std=0.02)
        grades = space.labels if learned_grades is None else list(learned_grades)
        self.register_buffer("learned_mask", space.grade_mask(grades).float())
        typed = torch.zeros(vocab_size, d)
        for label, table in (typed_embeddings or {}).items():
            _check_table(f"typed embedding for {label!r}", table, (vocab_size, space.dim(label)))
            typed[:, space.slices[label]] = table
        self.register_buffer("typed", typed)
        self.readout = nn.Linear(d, vocab_size)
        for label, table in (readout_init or {}).items():
            _check_table(f"readout_init for {label!r}", table, (vocab_size, space.dim(label)))
            with torch.no_grad():
                self.readout.weight[:, space.slices[label]] = table

    # ------------------------------------------------------------- internals
    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        ok = isinstance(input_ids, Tensor) and input_ids.dtype == torch.long
        if not ok or input_ids.dim() != 2:
            raise TypeError(f"input_ids must be a (B, T) LongTensor, got "
                            f"{getattr(input_ids, 'dtype', type(input_ids))} "
                            f"{tuple(getattr(input_ids, 'shape', ()))}")
        t = input_ids.shape[1]
        if t > self.max_len:
            raise ValueError(f"sequence length {t} exceeds max_len {self.max_len}")
        check_token_ids(input_ids, self.vocab_size)
        z = self.embed(input_ids)
        if self.pos is not None:
            z = z + self.pos(torch.arange(t, device=input_ids.device))
        return z * self.learned_mask + self.typed[input_ids]

    def _run(self, input_ids: Tensor, targets: Tensor | None, stochastic: bool
             ) -> tuple[Tensor, list[LayerTrace]]:
        z = self.embed_tokens(input_ids)
        traces = []
        for layer in self.layers:
            probe = None
            if targets is not None:
                probe = UtilityProbe(self.readout.weight, self.readout.bias, targets,
                                     self.objective.utility, self.ignore_index,
                                     self.objective.attach)
            z, tr = layer(z, probe, stochastic=stochastic, input_ids=input_ids)
            traces.append(tr)
        return self.readout(z), traces

    # -------------------------------------------------------------- protocol
    def forward(self, input_ids: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Logits (B, T, V) with context-only routing; no targets exist on this path.

        ``key_padding_mask`` (B, T), True = padding, must be right padding (module docstring).
        """
        check_right_padding(key_padding_mask, input_ids)
        return self._run(input_ids, None, stochastic=False)[0]

    @torch.no_grad()
    def routing(self, input_ids: Tensor) -> list[LayerTrace]:
        """Context-only routing traces (the evaluation routing) for diagnostics."""
        return self._run(input_ids, None, stochastic=False)[1]

    def utility_routing(self, input_ids: Tensor, targets: Tensor
                        ) -> tuple[Tensor, list[LayerTrace]]:
        """Logits and traces with utilities (targets required): analysis, never evaluation."""
        self._check_targets(input_ids, targets)
        return self._run(input_ids, targets, stochastic=False)

    def _check_targets(self, input_ids: Tensor, targets: Tensor) -> None:
        if not isinstance(targets, Tensor) or targets.dtype != torch.long:
            raise TypeError(
                f"targets must be a LongTensor, got {getattr(targets, 'dtype', targets)}")
        if targets.shape != input_ids.shape:
            raise ValueError(f"targets shape {tuple(targets.shape)} must equal input_ids shape "
                             f"{tuple(input_ids.shape)}")

    def training_loss(self, input_ids: Tensor, targets: Tensor,
                      key_padding_mask: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
        """L_GT plus router distillation, a mean over the scored tokens; ``targets`` are
        next-token ids aligned with positions (``ignore_index`` on padding).

        ``metrics["lm_loss"]`` is the LM loss under the training routing;
        ``metrics["loss_context"]`` is the LM loss under context-only routing, the routing
        evaluation has: when some layer routes by the utilities (``train_routing="utility"``,
        which reads the targets and so is optimistic) or samples its route (a Gumbel or
        REINFORCE router in training mode, where evaluation takes the argmax), it is computed
        by a second, gradient-free pass with ``stochastic=False``; otherwise it is ``lm_loss``
        itself. ``routing_entropy`` is a mean
        over the layers, ``context_agreement`` a mean over the layers that have a routed group
        (nan when no layer has one or no token is scored)."""
        loss, terms = self.training_terms(input_ids, targets, key_padding_mask)
        return loss, {k: float(v) for k, v in terms.items()}

    def training_terms(self, input_ids: Tensor, targets: Tensor,
                       key_padding_mask: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`training_loss` with its metrics as detached 0-d tensors: nothing reads a
        value, so ``torch.compile`` traces it as one graph (the trainer calls this one)."""
        self._check_targets(input_ids, targets)
        check_right_padding(key_padding_mask, input_ids)
        obj = self.objective
        logits, traces = self._run(input_ids, targets, stochastic=self.training)
        valid = targets != self.ignore_index
        lm = scored_token_mean_ce(logits, targets, valid, self.ignore_index)
        penalty = omega = distill = reinforce = entropy_sum = logits.new_zeros(())
        agreements = []
        for layer, tr in zip(self.layers, traces):
            tau = layer.thresholds.to(logits.dtype)
            router = layer.router
            weights = tr.probs if obj.penalty == "expectation" else None
            penalty = penalty + utility_penalty(tr.utilities, tau, layer.beta, valid,
                                                disabled=layer.disabled, weights=weights)
            ent = router.entropy(tr.routing_logits, layer.disabled)
            omega = omega + routing_regularizer(obj.omega, entropy=ent, alpha=tr.probs,
                                                valid=valid, always_on=router.always_on)
            entropy_sum = entropy_sum + _masked_mean(ent.detach(), valid)
            if layer.train_routing == "utility":
                teacher = layer.beta * (tr.utilities.detach() - tau)
                if obj.distill_teacher == "full":  # ℓ̃ itself: the ablation (module doc)
                    teacher = teacher + tr.context_logits
                kl = router.kl(teacher, tr.context_logits, layer.disabled)
                distill = distill + _masked_mean(kl, valid)
            if tr.log_prob is not None:
                reinforce = reinforce + reinforce_surrogate(
                    tr.log_prob, tr.utilities, tr.alpha, tau, tr.probs, valid)
            agreements.append(routing_agreement(router, tr.utility_logits, tr.context_logits,
                                                valid, layer.disabled))
        loss = (lm + obj.utility_weight * penalty + obj.omega_weight * omega
                + obj.distill_weight * distill + obj.reinforce_weight * reinforce)
        # the routing evaluation has: not the utility routing (it reads the targets), nor a
        # route sampled in training (Gumbel, REINFORCE), which evaluation takes by argmax
        sampled = self.training and any(layer.router.mode in ("gumbel", "reinforce")
                                        for layer in self.layers)
        if sampled or any(layer.train_routing == "utility" for layer in self.layers):
            with torch.no_grad():
                context_logits = self._run(input_ids, None, stochastic=False)[0]
                loss_context = scored_token_mean_ce(context_logits, targets, valid,
                                                    self.ignore_index)
        else:
            loss_context = lm.detach()
        terms = {
            "loss": loss, "lm_loss": lm, "loss_context": loss_context, "utility_penalty": penalty,
            "omega": omega, "distill": distill, "routing_entropy": entropy_sum / len(traces),
            # over the layers where it is defined: a layer of always-on blocks has no choice
            "context_agreement": torch.stack(agreements).nanmean(),
        }
        return loss, {k: v.detach() for k, v in terms.items()}

    @torch.no_grad()
    def generate(
        self, input_ids: Tensor, max_new_tokens: int, *, do_sample: bool = False,
        temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
        num_beams: int = 1, length_penalty: float = 1.0,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None, generator: torch.Generator | None = None,
        **processors: Any,
    ) -> Tensor:
        """Append up to ``max_new_tokens`` tokens; routing uses context logits only (no targets).

        Greedy, sampled (temperature, top-k, top-p) or beam search, through the decoding loop of
        ``graded.transformer.generation``, with its Hugging Face logits processors
        (``processors``: ``repetition_penalty``, ``no_repeat_ngram_size``, ``sequence_bias``,
        ``bad_words_ids``, ``min_new_tokens``, ``forced_eos_token_id``, ``renormalize_logits``;
        :data:`~graded.transformer.generation.PROCESSOR_OPTIONS`). There is no KV cache: routing
        pools the causal context, so each step reruns the model on the whole sequence. With
        learned positions the prompt and the new tokens must fit in ``max_len`` (a position past
        the table has no embedding); without positions each step sees the last ``max_len``
        tokens. Prompts are unpadded.
        Rows that emitted ``eos_token_id`` (one id or a list of ids) are filled with
        ``pad_token_id`` (default: the first EOS id).
        """
        generation.check_prompt(input_ids, max_new_tokens, generation.position_limit(self))

        def step(ids: Tensor, kpm: Tensor, cache: None) -> Tensor:
            return self(ids[:, -self.max_len:])

        kpm = torch.zeros(input_ids.shape, dtype=torch.bool, device=input_ids.device)
        return generation.decode(
            step, input_ids, kpm, max_new_tokens, n_layers=len(self.layers), do_sample=do_sample,
            temperature=temperature, top_k=top_k, top_p=top_p, num_beams=num_beams,
            eos_token_id=eos_token_id, pad_token_id=pad_token_id, use_cache=False,
            generator=generator, length_penalty=length_penalty, vocab_size=self.vocab_size,
            **processors)


def _check_table(name: str, table: Tensor, shape: tuple[int, int]) -> None:
    """A finite real (V, d_g) table: a NaN in it would reach every state of its tokens."""
    if not isinstance(table, Tensor) or table.shape != shape:
        raise ValueError(f"{name} must be a {shape} Tensor, got "
                         f"{tuple(getattr(table, 'shape', ())) or type(table).__name__}")
    if table.is_complex() or not bool(torch.isfinite(table).all()):
        raise ValueError(f"{name} must be finite and real, got {table.dtype} with "
                         f"{int((~torch.isfinite(table)).sum())} non-finite entries")


def scored_token_mean_ce(logits: Tensor, targets: Tensor, valid: Tensor,
                         ignore_index: int) -> Tensor:
    """Next-token cross-entropy averaged over the scored tokens (``valid``), 0 when none is
    scored, like the router terms (``_masked_mean``): ``F.cross_entropy``'s mean is 0/0 = NaN
    there, and a NaN loss (× a scored count of 0 in a summed micro-batch) poisons every
    gradient."""
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index,
                            reduction="sum")
    return total / valid.sum().clamp(min=1).to(total.dtype)


def check_right_padding(key_padding_mask: Tensor | None, input_ids: Tensor) -> None:
    """A bool (B, T) mask whose padding (True) only follows each row's real tokens."""
    if key_padding_mask is None:
        return
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(f"key_padding_mask must be bool (True = padding), got "
                        f"{key_padding_mask.dtype}")
    if key_padding_mask.shape != input_ids.shape:
        raise ValueError(f"key_padding_mask has shape {tuple(key_padding_mask.shape)}; expected "
                         f"input_ids' shape {tuple(input_ids.shape)}")
    if torch.compiler.is_compiling() or inputs_checked():  # values: eager, unchecked calls
        return
    inner = key_padding_mask[:, :-1] & ~key_padding_mask[:, 1:]  # padding, then a real token
    if bool(inner.any()):
        row = int(inner.any(1).nonzero()[0])
        raise ValueError(f"key_padding_mask row {row} has padding before a real token; the "
                         "morphic model is causal and takes right padding only")


def routing_agreement(router: Router, utility_logits: Tensor | None, context_logits: Tensor,
                      valid: Tensor, disabled: set[int] | None = None) -> Tensor:
    """Fraction (a 0-d tensor) of (valid token, routed normalisation group) pairs where
    argmax ℓ̃ = argmax ℓ, the stay option included (``Router.choices``); always-on groups are not
    counted. For logistic gates, the tokens whose open/closed gates agree. ``disabled`` edges
    (``MorphicLayer.disabled``) are not options, as in ``Router.route``: the argmax is over the
    options left, a group left with fewer than two options (no choice) is not counted, and a
    disabled gate, shut under ℓ and ℓ̃ alike, is left out. nan without utility logits, groups
    with a choice or valid tokens."""
    groups = router.choice_groups(disabled)
    if utility_logits is None or not groups:
        return context_logits.new_full((), float("nan")).detach()
    if router.normalization == "logistic":
        gates = torch.cat(groups).to(context_logits.device)  # the gates left
        same = ((utility_logits.index_select(-1, gates) > 0)
                == (context_logits.index_select(-1, gates) > 0)).all(-1)  # (B, T)
    else:
        same = (router.choices(utility_logits, disabled)
                == router.choices(context_logits, disabled))
    w = valid.reshape(*valid.shape, *([1] * (same.dim() - valid.dim()))).expand_as(same)
    w = w.to(context_logits.dtype)
    return ((same.to(w.dtype) * w).sum() / w.sum()).detach()  # 0/0 = nan without valid tokens
