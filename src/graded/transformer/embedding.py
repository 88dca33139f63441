"""The input embedding of the transformer models: tokens or features to vectors, plus
positions (000 Def 5.19, 5.21, Eq. 48)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from graded.checks import check_token_ids, inputs_checked
from graded.positional import LearnedPositions, SinusoidalPositions, position_start
from graded.transformer.config import TransformerConfig
from graded.transformer.entry import sequence_shape
from graded.transformer.graded import (
    GradingPlan,
    graded_stage,
    normalize_rows,
    per_token,
    resolve_plan,
)
from graded.transformer.layers import make_norm

__all__ = ["InputEmbedding"]


class InputEmbedding(nn.Module):
    """Tokens (or features) to vectors, plus additive positions, then dropout.

    ``sinusoidal``/``sinusoidal1``/``learned`` positions are added here; ``rope`` and ``alibi``
    act inside attention; ``none`` adds nothing (the model is then permutation-equivariant,
    000 Lemma 4.17). Graded stages, from the plan when the config grades them:
    ``input_grading`` (000 Def 5.19) acts on the token embedding, or on the raw features before
    their projection, and ``position_grading`` (000 Def 5.21) on the position vectors.

    In order: token ids x' = M_{q_i} M E[t] (per-token and feature grading), x'' = x'/‖x'‖
    (``grade_normalize``), h = ReLU(W x'' + b) with ``input_map`` W
    (``grade_input_activation``); features x'' = M_in x normalised, h = W_in x'' + b_in, its
    ReLU, then M_{q_i} h (``projected_grading``). Then √d (``embed_scale``), z = h + Pe'(t)
    and z' = z/‖z‖ (000 Eq. 48, ``grade_position_normalize``), ``embed_norm``, dropout.

    The input grading is not folded into the embedding (``config.fold_grading`` leaves it on
    the activations): it costs one product per forward pass, not one per layer, and the
    embedding's output X (ungraded for token inputs) is what :mod:`graded.analysis` perturbs
    through a hook on ``tokens``, which a folded lookup would bypass.
    """

    def __init__(self, config: TransformerConfig, *, plan: GradingPlan | None = None) -> None:
        super().__init__()
        plan = resolve_plan(config, plan)
        self.config = config
        if config.vocab_size is not None:
            self.tokens: nn.Module = nn.Embedding(config.vocab_size, config.d_model)
        else:
            self.tokens = nn.Linear(config.input_dim, config.d_model, bias=config.bias)
        if config.positional in ("sinusoidal", "sinusoidal1"):
            start = position_start(config.positional)
            self.positions: nn.Module | None = SinusoidalPositions(
                config.d_model, config.max_len, start=start
            )
        elif config.positional == "learned":
            self.positions = LearnedPositions(config.d_model, config.max_len)
        elif config.positional in ("rope", "alibi", "none"):  # in the attention, or none
            self.positions = None
        else:  # a name added to POSITIONAL with no construction here would train without it
            raise NotImplementedError(
                f"positional encoding {config.positional!r} is listed in "
                f"graded.positional.POSITIONAL but the embedding builds only 'sinusoidal', "
                f"'sinusoidal1' and 'learned' (and leaves 'rope', 'alibi', 'none' to the "
                f"attention); add its construction to graded/transformer/embedding.py")
        self.input_grading = graded_stage(plan, GradingPlan.input_stage)
        self.projected_grading = graded_stage(plan, GradingPlan.projected_input_stage)
        self.position_grading: nn.Module | None = (
            plan.position_stage() if plan is not None else None
        )
        # 000 Def 5.19: h = ReLU(W x'' + b); token inputs get a map W of their own
        self.input_map: nn.Module | None = None
        self.input_activation = config.grade_input_activation is not None
        if self.input_activation and config.vocab_size is not None:
            self.input_map = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.position_normalize = config.grade_position_normalize
        # √d_model on token embeddings (Vaswani et al. §3.4); a norm of the sum (BERT)
        self.scale = math.sqrt(config.d_model) if config.embed_scale else 1.0
        self.norm = (make_norm(config.norm, config.d_model, config.norm_eps)
                     if config.embed_norm else nn.Identity())
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, inputs: Tensor, positions: Tensor,
                token_scales: Tensor | None = None) -> Tensor:
        """Embedded inputs (B, T, d); ``token_scales`` (B, T, d) are the per-token M_{q_i} when
        the model grades tokens. Inputs a model checked at its entry (inside
        :func:`graded.checks.checked_inputs`) are not checked again."""
        if torch.compiler.is_compiling() or not inputs_checked():  # shapes only: traceable
            sequence_shape(self.config, inputs)
        if self.config.vocab_size is not None:
            check_token_ids(inputs, self.config.vocab_size)
            x = self._stage(self.input_grading, self.tokens(inputs), token_scales)
            if self.input_map is not None:
                x = torch.relu(self.input_map(x))
        else:  # 000 Def 5.19: the grading acts on the raw features, before the projection
            weight = self.tokens.weight
            if not isinstance(self.input_grading, nn.Identity):
                # graded in the wider of the features' and the model's dtypes, as a grading in
                # the model's dtype promotes them (whatever the grading's own dtype)
                inputs = inputs.to(torch.promote_types(inputs.dtype, weight.dtype))
            graded = self.input_grading(inputs)
            if graded.dtype != weight.dtype and not torch.is_autocast_enabled(
                    inputs.device.type):  # the projection's error would not name the features
                raise TypeError(f"features are {inputs.dtype}, the model's weights "
                                f"{weight.dtype}; expected the same dtype (e.g. "
                                f"features.to({weight.dtype}))")
            x = self.tokens(graded)
            if self.input_activation:
                x = torch.relu(x)
            x = self._stage(self.projected_grading, x, token_scales)
        if self.scale != 1.0:
            x = x * self.scale
        if self.positions is not None:
            pe = self.positions(positions, dtype=x.dtype)
            if self.position_grading is not None:
                pe = self.position_grading(pe, positions)
            x = x + pe
        if self.position_normalize:  # 000 Eq. 48: z' = z / ‖z‖
            x = normalize_rows(x)
        return self.dropout(self.norm(x))

    @staticmethod
    def _stage(stage: nn.Module, x: Tensor, token_scales: Tensor | None) -> Tensor:
        return stage(x, token_scales) if per_token(stage) else stage(x)
