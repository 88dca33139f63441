"""Morphic graded transformer: tools as typed morphisms with utility-aware routing (004).

See docs/morphic.md. Layering: this package imports torch, itself, and the decoding loop
of graded.transformer.generation.
"""

from graded.morphic.attention_block import GradeTypedAttention
from graded.morphic.banded import BandedBlocks, ConjugatedBlocks
from graded.morphic.blocks import FFNBlock, FixedLinearBlock, LinearBlock, RetrievalBlock
from graded.morphic.config import MorphicConfig, build_morphic_model
from graded.morphic.edges import Edge, EdgeSet, masked_pair_softmax
from graded.morphic.layer import LayerTrace, MorphicLayer, UtilityProbe
from graded.morphic.model import MorphicObjective, MorphicTransformer
from graded.morphic.norm import GradewiseNorm
from graded.morphic.objective import (
    lgt_objective,
    routing_regularizer,
    threshold_gradient,
    utility_augmented_logits,
    utility_penalty,
)
from graded.morphic.router import Router
from graded.morphic.state import Grade, GradedStateSpace
from graded.morphic.tools import (
    ArgmaxDecoder,
    Calculator,
    ExternalTool,
    OneHotEncoder,
    calculator_adder,
)
from graded.morphic.training import MorphicTrainResult, train_morphic
from graded.morphic.update import UPDATE_MODES, apply_update
from graded.morphic.utilities import exact_utilities, first_order_utilities

__all__ = [
    "UPDATE_MODES",
    "ArgmaxDecoder",
    "BandedBlocks",
    "Calculator",
    "ConjugatedBlocks",
    "Edge",
    "EdgeSet",
    "ExternalTool",
    "FFNBlock",
    "FixedLinearBlock",
    "Grade",
    "GradeTypedAttention",
    "GradedStateSpace",
    "GradewiseNorm",
    "LayerTrace",
    "LinearBlock",
    "MorphicConfig",
    "MorphicLayer",
    "MorphicObjective",
    "MorphicTrainResult",
    "MorphicTransformer",
    "OneHotEncoder",
    "RetrievalBlock",
    "Router",
    "UtilityProbe",
    "apply_update",
    "build_morphic_model",
    "calculator_adder",
    "exact_utilities",
    "first_order_utilities",
    "lgt_objective",
    "masked_pair_softmax",
    "routing_regularizer",
    "threshold_gradient",
    "train_morphic",
    "utility_augmented_logits",
    "utility_penalty",
]
