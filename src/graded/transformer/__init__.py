"""Transformer models built on :mod:`graded.attention` (SPEC C4), and their graded forms."""

from graded.transformer.blocks import FeedForwardSublayer
from graded.transformer.cache import KVCache, LayerCache
from graded.transformer.config import TransformerConfig
from graded.transformer.generation import filter_logits, generate, generate_seq2seq
from graded.transformer.graded import GradingPlan
from graded.transformer.layers import FeedForward, make_norm
from graded.transformer.models import (
    InputEmbedding,
    Seq2SeqTransformer,
    TransformerClassifier,
    TransformerDecoder,
    TransformerEncoder,
    TransformerLM,
)

__all__ = [
    "FeedForward",
    "FeedForwardSublayer",
    "GradingPlan",
    "InputEmbedding",
    "KVCache",
    "LayerCache",
    "Seq2SeqTransformer",
    "TransformerClassifier",
    "TransformerConfig",
    "TransformerDecoder",
    "TransformerEncoder",
    "TransformerLM",
    "filter_logits",
    "generate",
    "generate_seq2seq",
    "make_norm",
]
