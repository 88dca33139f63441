"""The global part of PatternBoost: a small transformer LM trained on the best objects (003 §3.3).

The public PatternBoost code uses makemore (003 §2, notes §1.8): a pre-norm decoder-only
transformer with learned positions and a GELU MLP, trained with AdamW (lr 5e-4, weight decay
0.01, betas (0.9, 0.99)) and sampled at temperature 1 with no top-k. `graded.TransformerLM` with
those options plays that part here. Departures: makemore's single <START>/<STOP> token 0 is
split into separate BOS and EOS tokens after the problem's own tokens, and padding (for
problems whose sequences vary in length) gets a third token whose targets are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from graded.train.stream import train_on_stream

from .config import _DERIVED_MODEL_FIELDS

__all__ = ["SpecialTokens", "build_model", "model_settings", "sample_sequences",
           "train_on_sequences", "transformer_config"]


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids the engine adds after a problem's `vocab_size` tokens."""

    problem_vocab: int

    @property
    def bos(self) -> int:
        return self.problem_vocab

    @property
    def eos(self) -> int:
        return self.problem_vocab + 1

    @property
    def pad(self) -> int:
        return self.problem_vocab + 2

    @property
    def vocab_size(self) -> int:
        return self.problem_vocab + 3


def build_model(
    problem_vocab: int, max_length: int, model_options: dict[str, Any], seed: int
) -> nn.Module:
    """A `TransformerLM` over the problem's tokens plus BOS/EOS/PAD, initialised from `seed`.

    `model_options` are `TransformerConfig` fields (d_model, n_heads, n_layers, ...); the
    makemore-like defaults (learned positions, GELU, pre-norm LayerNorm) apply where unset.
    """
    from graded.transformer.models import TransformerLM

    torch.manual_seed(seed)
    return TransformerLM(transformer_config(problem_vocab, max_length, model_options))


def transformer_config(problem_vocab: int, max_length: int, model_options: dict[str, Any]):
    """The `TransformerConfig` of `build_model` (ValueError naming a field that does not fit,
    e.g. a width that `n_heads` does not divide; the config checks it before a run starts)."""
    from graded.transformer.config import TransformerConfig

    special = SpecialTokens(problem_vocab)
    return TransformerConfig.from_dict({
        "positional": "learned",
        "activation": "gelu",
        "norm": "layer",
        "norm_first": True,
        "dropout": 0.0,
        **model_options,
        "vocab_size": special.vocab_size,
        "max_len": max_length + 2,
        "pad_id": special.pad,
    })


def model_settings(problem_vocab: int, max_length: int,
                   model_options: dict[str, Any]) -> dict[str, Any]:
    """Every `TransformerConfig` field of the model `build_model` makes from `model_options`,
    less those the problem sets: defaults filled in, values as the config holds them, and a
    field set to the value its None stands for (`d_ff` = 4·d_model, `attn_dropout` =
    `dropout`, a bias = `bias`, ...) set to None. Two option dicts that build the same model
    give equal settings however they spell it, and a changed field is not repeated in the
    fields that follow it (:data:`graded.transformer.config.FOLLOWS`); a resumed run compares
    these."""
    from graded.transformer.config import FOLLOWS

    config = transformer_config(problem_vocab, max_length, model_options)
    settings = config.to_dict()
    for field in _DERIVED_MODEL_FIELDS:
        del settings[field]
    for field in FOLLOWS:
        if settings[field] == config.follows(field):
            settings[field] = None
    return settings


def _batch(sequences: Sequence[Sequence[int]], special: SpecialTokens) -> tuple[Tensor, Tensor]:
    """Inputs [BOS, x..., EOS, PAD...] and next-token targets with padding ignored (-100)."""
    width = max(len(s) for s in sequences) + 2
    ids = torch.full((len(sequences), width), special.pad, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, 0] = special.bos
        ids[row, 1 : 1 + len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        ids[row, 1 + len(seq)] = special.eos
    inputs, targets = ids[:, :-1], ids[:, 1:].clone()
    targets[targets == special.pad] = -100
    return inputs, targets


def train_on_sequences(
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    special: SpecialTokens,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    generator: torch.Generator,
) -> float:
    """Next-token training on random batches of `sequences` (003 §2.6); returns the mean loss
    of the last 10% of steps. A fresh AdamW each call (makemore's betas (0.9, 0.99), gradient
    clipping at 1), so a round depends only on the weights it starts from."""
    if not sequences:
        raise ValueError("cannot train on an empty set of sequences")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    inputs, targets = _batch(sequences, special)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.99)
    )
    tail = max(1, steps // 10)
    losses: list[float] = []

    def next_batch() -> Tensor:
        return torch.randint(len(sequences), (batch_size,), generator=generator)

    def loss(rows: Tensor) -> tuple[Tensor, dict[str, float]]:
        logits = model(inputs[rows])  # (B, T, V)
        return nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets[rows].reshape(-1), ignore_index=-100
        ), {}

    def record(step: int, value: Tensor, metrics: dict[str, float]) -> bool:
        losses.append(value.item())
        return False

    train_on_stream(model, next_batch, loss, steps=steps, optimizer=optimizer, clip_norm=1.0,
                    after_step=record)
    return sum(losses[-tail:]) / tail


@torch.no_grad()
def sample_sequences(
    model: nn.Module,
    count: int,
    max_length: int,
    special: SpecialTokens,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    batch_size: int = 500,
    generator: torch.Generator,
) -> list[list[int] | str]:
    """Sample `count` sequences from BOS; each is its tokens before EOS, or the reason it has
    none (no EOS within `max_length` + 1 tokens, or a BOS/PAD token inside)."""
    model.eval()
    out: list[list[int] | str] = []
    for start in range(0, count, batch_size):
        b = min(batch_size, count - start)
        prompt = torch.full((b, 1), special.bos, dtype=torch.long)
        ids = model.generate(
            prompt,
            max_length + 1,
            do_sample=True,
            temperature=temperature,
            top_k=top_k,
            eos_token_id=special.eos,
            pad_token_id=special.pad,
            generator=generator,
        )
        for row in ids[:, 1:].tolist():
            if special.eos not in row:
                out.append(f"no end token within {max_length + 1} tokens")
                continue
            body = row[: row.index(special.eos)]
            if any(t >= special.problem_vocab for t in body):
                out.append("special token inside the sequence")
            else:
                out.append(body)
    return out
