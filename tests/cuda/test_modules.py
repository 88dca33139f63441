"""Every public module of graded.nn, graded.attention, graded.grading, graded.losses,
graded.positional, graded.transformer and graded.morphic computes on the accelerator what it
computes on the CPU: the same weights (one module, copied), the same inputs, forward outputs and
the gradients of the backward pass equal within ``device_checks.TOLERANCES`` in float64 and in
float32. The attention backends have their own file (test_backends.py)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from device_checks import compare_on
from torch import nn

from graded import Seq2SeqTransformer, TransformerClassifier, TransformerConfig, TransformerLM
from graded.attention import (
    AdditiveScore,
    BilinearScore,
    DotScore,
    GradedMultiheadAttention,
    MultiheadAttention,
    ScaledDotScore,
    Score,
)
from graded.attention.backends import AttentionBackend
from graded.attention.graded import VARIANTS
from graded.grading import ExponentialGrading, GradingMap, LinearGrading
from graded.losses import (
    ExponentiallyGradedLoss,
    GradedCrossEntropyLoss,
    GradedMSELoss,
    GradedNormLoss,
    HomogeneousLoss,
    LinearlyGradedLoss,
    MaxGradedLoss,
)
from graded.morphic import (
    BandedBlocks,
    ConjugatedBlocks,
    EdgeSet,
    ExternalTool,
    FFNBlock,
    FixedLinearBlock,
    Grade,
    GradedStateSpace,
    GradeTypedAttention,
    GradewiseNorm,
    LinearBlock,
    MorphicLayer,
    MorphicTransformer,
    RetrievalBlock,
    Router,
    build_morphic_model,
)
from graded.nn import (
    GATLayer,
    GATv2Layer,
    GradedExp,
    GradedGraphAttention,
    GradedLinear,
    GradedMLP,
    GradedReLU,
    InputGradedLinear,
    MultiplicativeGradedLinear,
    OutputGradedLinear,
)
from graded.positional import ALiBi, LearnedPositions, RotaryEmbedding, SinusoidalPositions
from graded.transformer import (
    FeedForward,
    FeedForwardSublayer,
    InputEmbedding,
    TransformerDecoder,
    TransformerEncoder,
)

B, T, D, H, V = 2, 6, 16, 4, 11  # batch, length, model width, heads, vocabulary


@dataclass
class Case:
    """``build()`` makes the module (under a fixed seed); ``inputs(gen)`` its CPU inputs
    (floating ones in float64, cast to the dtype under test); ``call(module, *inputs)`` runs it.
    ``covers``: every public class the call exercises."""

    covers: tuple[type, ...]
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], tuple]
    call: Callable[..., Any] = field(default=lambda m, *xs: m(*xs))


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def ids(gen: torch.Generator, *shape: int, high: int = V) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=gen)


def graph(gen: torch.Generator, n: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Node features (n, 5) and a symmetric 0/1 adjacency (n, n)."""
    upper = torch.triu((torch.rand(n, n, generator=gen) < 0.4).double(), 1)
    return randn(gen, n, 5), upper + upper.T


def padding(gen: torch.Generator, b: int = B, t: int = T) -> torch.Tensor:
    """Right padding of a random length >= 2 per row (True = padding)."""
    lengths = torch.randint(2, t + 1, (b,), generator=gen)
    return torch.arange(t)[None, :] >= lengths[:, None]


def grades(n: int, low: float = 0.5, high: float = 2.0) -> torch.Tensor:
    return torch.linspace(low, high, n)


CASES: dict[str, Case] = {}

# --- graded.nn -------------------------------------------------------------------------------
CASES["GATLayer"] = Case((GATLayer,), lambda: GATLayer(5, 4, heads=2), graph,
                         lambda m, x, a: m(x, a, need_weights=True))
CASES["GATv2Layer mean of heads"] = Case(
    (GATv2Layer,), lambda: GATv2Layer(5, 4, heads=2, concat=False), graph,
    lambda m, x, a: m(x, a, need_weights=True))
for _kind, _grading, _apply in (("degree", "exponential", "logits"),
                                ("closeness", "linear", "features"),
                                ("eigenvector", "exponential", "features"),
                                ("pagerank", "linear", "logits")):
    CASES[f"GradedGraphAttention {_kind} {_grading} {_apply}"] = Case(
        (GradedGraphAttention,),
        lambda k=_kind, g=_grading, a=_apply: GradedGraphAttention(
            5, 4, heads=2, centrality=k, grading=g, apply_to=a, learn_scale=True),
        graph, lambda m, x, a: m(x, a, need_weights=True))
CASES["GradedExp"] = Case((GradedExp,), lambda: GradedExp(grades(5), learnable=True),
                          lambda g: (randn(g, 3, 5),))
for _mode in ("abs", "threshold", "odd"):
    CASES[f"GradedReLU {_mode}"] = Case(
        (GradedReLU,), lambda mode=_mode: GradedReLU(grades(5), mode, learnable=True),
        lambda g: (randn(g, 3, 5),))
CASES["GradedLinear"] = Case(
    (GradedLinear,), lambda: GradedLinear(5, 4, grades(5), learnable_grades=True),
    lambda g: (randn(g, 3, 5),))
CASES["InputGradedLinear"] = Case(
    (InputGradedLinear,), lambda: InputGradedLinear(5, 4, grades(5), learnable_grades=True),
    lambda g: (randn(g, 3, 5),))
CASES["OutputGradedLinear"] = Case(
    (OutputGradedLinear,), lambda: OutputGradedLinear(5, 4, grades(4), learnable_grades=True),
    lambda g: (randn(g, 3, 5),))
CASES["MultiplicativeGradedLinear"] = Case(
    (MultiplicativeGradedLinear,),
    lambda: MultiplicativeGradedLinear(5, 4, grades(5), learnable_grades=True),
    lambda g: (randn(g, 3, 5),))
for _layer in ("additive", "input"):
    CASES[f"GradedMLP {_layer}"] = Case(
        (GradedMLP,), lambda layer=_layer: GradedMLP(5, [8, 6], 3, grades(5), layer=layer,
                                                     learnable_grades=True),
        lambda g: (randn(g, 3, 5),))

# --- graded.grading --------------------------------------------------------------------------
for _f in ("shift", "abs_shift", "softplus", "identity"):
    CASES[f"LinearGrading {_f}"] = Case(
        (LinearGrading,), lambda f=_f: LinearGrading(D // H, grades(D // H), f=f, learnable=True),
        lambda g: (randn(g, B, H, T, D // H),))
CASES["ExponentialGrading per head"] = Case(
    (ExponentialGrading,),
    lambda: ExponentialGrading(D // H, torch.rand(H, D // H), learnable=True, num_heads=H),
    lambda g: (randn(g, B, H, T, D // H),))

# --- graded.losses ---------------------------------------------------------------------------
for _cls in (GradedMSELoss, GradedNormLoss, HomogeneousLoss, MaxGradedLoss, LinearlyGradedLoss,
             ExponentiallyGradedLoss):
    CASES[_cls.__name__] = Case((_cls,), lambda c=_cls: c(grades(5)),
                                lambda g: (randn(g, 4, 5), randn(g, 4, 5)))
CASES["GradedCrossEntropyLoss"] = Case(
    (GradedCrossEntropyLoss,), lambda: GradedCrossEntropyLoss(grades(5)),
    lambda g: (randn(g, 4, 5), ids(g, 4, high=5)))
CASES["GradedMSELoss with a learnable grading"] = Case(
    (GradedMSELoss,), lambda: GradedMSELoss(ExponentialGrading(5, grades(5), learnable=True)),
    lambda g: (randn(g, 4, 5), randn(g, 4, 5)))

# --- graded.positional -----------------------------------------------------------------------
CASES["ALiBi"] = Case((ALiBi,), lambda: ALiBi(H),
                      lambda g: (torch.arange(T), torch.arange(T)))
CASES["LearnedPositions"] = Case((LearnedPositions,), lambda: LearnedPositions(D, 16),
                                 lambda g: (ids(g, B, T, high=16),))
CASES["SinusoidalPositions"] = Case(
    (SinusoidalPositions,), lambda: SinusoidalPositions(D, 16), lambda g: (ids(g, B, T, high=16),))
CASES["RotaryEmbedding"] = Case(
    (RotaryEmbedding,), lambda: RotaryEmbedding(D // H),
    lambda g: (randn(g, B, H, T, D // H), torch.arange(T)))

# --- graded.attention ------------------------------------------------------------------------
for _score in (ScaledDotScore, DotScore):
    CASES[_score.__name__] = Case((_score, Score), _score,
                                  lambda g: (randn(g, B, H, T, D // H), randn(g, B, H, T, D // H)))
CASES["AdditiveScore"] = Case(
    (AdditiveScore,), lambda: AdditiveScore(D // H, 8),
    lambda g: (randn(g, B, H, T, D // H), randn(g, B, H, T, D // H)))
CASES["BilinearScore"] = Case(
    (BilinearScore,), lambda: BilinearScore(H, D // H, scaled=True),
    lambda g: (randn(g, B, H, T, D // H), randn(g, B, H, T, D // H)))


def _self_attention(m: nn.Module, x: torch.Tensor, kpm: torch.Tensor, **kw: Any) -> Any:
    return m(x, x, x, key_padding_mask=kpm, need_weights=True, average_attn_weights=False, **kw)


def _x_and_padding(g: torch.Generator) -> tuple:
    return randn(g, B, T, D), padding(g)


for _score in ("scaled_dot", "dot", "bilinear", "additive"):
    CASES[f"MultiheadAttention score {_score}"] = Case(
        (MultiheadAttention,),
        lambda s=_score: MultiheadAttention(D, H, batch_first=True, score=s, backend="explicit"),
        _x_and_padding, _self_attention)
CASES["MultiheadAttention causal, grouped keys"] = Case(
    (MultiheadAttention,), lambda: MultiheadAttention(D, H, batch_first=True, num_kv_heads=2),
    _x_and_padding, lambda m, x, kpm: m(x, x, x, key_padding_mask=kpm, need_weights=False,
                                        is_causal=True, attn_mask=torch.ones(
                                            T, T, dtype=torch.bool, device=x.device).tril()))
CASES["MultiheadAttention bias_kv, zero_attn, kdim, vdim, sequence-first"] = Case(
    (MultiheadAttention,),
    lambda: MultiheadAttention(D, H, add_bias_kv=True, add_zero_attn=True, kdim=6, vdim=10),
    lambda g: (randn(g, T, B, D), randn(g, T + 1, B, 6), randn(g, T + 1, B, 10)),
    lambda m, q, k, v: m(q, k, v, need_weights=True))
for _grading in ("linear", "exponential"):
    for _variant in VARIANTS:
        for _fold in (True, False):
            CASES[f"GradedMultiheadAttention {_grading} {_variant} fold={_fold}"] = Case(
                (GradedMultiheadAttention,),
                lambda gr=_grading, v=_variant, fold=_fold: GradedMultiheadAttention(
                    D, H, grading=gr, variant=v, learnable_grades=True, fold_grading=fold,
                    grades=torch.rand(H, D // H) if v == "multi_head" else torch.rand(D // H),
                    batch_first=True),
                _x_and_padding, _self_attention)

# --- graded.transformer ----------------------------------------------------------------------


def config(**overrides: Any) -> TransformerConfig:
    base = dict(vocab_size=V, d_model=D, n_heads=H, n_layers=2, d_ff=24, max_len=16,
                init_std=0.2)
    return TransformerConfig(**{**base, **overrides})


def _lm_inputs(g: torch.Generator) -> tuple:
    return ids(g, B, T), padding(g)


LM_CONFIGS = {
    "sinusoidal, GELU, LayerNorm, pre-norm": {},
    "learned, SwiGLU, RMSNorm": dict(positional="learned", activation="swiglu", norm="rms"),
    "RoPE, grouped keys, untied": dict(positional="rope", n_kv_heads=2, tie_embeddings=False),
    "ALiBi, post-norm, ReLU": dict(positional="alibi", norm_first=False, activation="relu"),
    "no positions, additive score": dict(positional="none", attn_score="additive",
                                         attn_backend="explicit"),
    "LGT learnable per head, queries_keys": dict(
        grading="linear", learnable_grades=True, grades_per_head=True,
        grade_attention_variant="queries_keys", grade_init="warm_start", grade_init_value=0.3),
    "EGT learnable, values, unfolded": dict(
        grading="exponential", learnable_grades=True, grade_attention_variant="values",
        fold_grading=False, grade_init="warm_start", grade_init_value=0.3),
    "EGT multi_head, normalised, positions graded": dict(
        grading="exponential", grades_per_head=True, grade_attention_variant="multi_head",
        grade_init="warm_start", grade_init_value=0.5, grade_normalize=True,
        grade_position_alpha=0.5, positional="learned"),
}
for _name, _overrides in LM_CONFIGS.items():
    CASES[f"TransformerLM {_name}"] = Case(
        (TransformerLM, TransformerDecoder, InputEmbedding, FeedForwardSublayer, FeedForward),
        lambda o=_overrides: TransformerLM(config(**o)), _lm_inputs)
CASES["TransformerLM padded, attention weights"] = Case(
    (TransformerLM,), lambda: TransformerLM(config(attn_backend="explicit")), _lm_inputs,
    lambda m, x, kpm: m(x, kpm, need_weights=True))
CASES["TransformerLM token-graded"] = Case(
    (TransformerLM,), lambda: TransformerLM(config(grading="exponential", token_grading=True)),
    lambda g: (ids(g, B, T), torch.randint(0, 4, (B, T), generator=g).double()),
    lambda m, x, s: m(x, token_grades=s))
CASES["Seq2SeqTransformer EGT, padded"] = Case(
    (Seq2SeqTransformer, TransformerEncoder, TransformerDecoder),
    lambda: Seq2SeqTransformer(config(grading="exponential", learnable_grades=True,
                                      grade_init="warm_start", grade_init_value=0.3,
                                      n_decoder_layers=1)),
    lambda g: (ids(g, B, T), ids(g, B, T - 2), padding(g), padding(g, t=T - 2)),
    lambda m, src, tgt, skpm, tkpm: m(src, tgt, skpm, tkpm))
for _pool in ("mean", "first", "last"):
    CASES[f"TransformerClassifier {_pool} pooling, padded"] = Case(
        (TransformerClassifier, TransformerEncoder),
        lambda p=_pool: TransformerClassifier(config(), 3, pooling=p), _lm_inputs)
CASES["TransformerClassifier on features, input grades, LGT"] = Case(
    (TransformerClassifier,),
    lambda: TransformerClassifier(config(vocab_size=None, input_dim=4, grading="linear",
                                         learnable_grades=True, input_grades=[0, 0, 1, 2]), 2),
    lambda g: (randn(g, B, T, 4), padding(g)))
CASES["TransformerEncoder alone"] = Case(
    (TransformerEncoder,), lambda: TransformerEncoder(config(positional="learned")), _lm_inputs)
CASES["TransformerDecoder with cross-attention"] = Case(
    (TransformerDecoder,), lambda: TransformerDecoder(config(), cross_attention=True),
    lambda g: (ids(g, B, T), randn(g, B, T + 2, D), padding(g, t=T + 2)),
    lambda m, x, mem, mkpm: m(x, memory=mem, memory_key_padding_mask=mkpm))
CASES["InputEmbedding learned"] = Case(
    (InputEmbedding,), lambda: InputEmbedding(config(positional="learned")),
    lambda g: (ids(g, B, T), torch.arange(T).expand(B, T)))
CASES["FeedForwardSublayer"] = Case(
    (FeedForwardSublayer,), lambda: FeedForwardSublayer(config(activation="gelu_tanh")),
    lambda g: (randn(g, B, T, D),))
for _act in ("relu", "gelu", "gelu_tanh", "silu", "swiglu"):
    CASES[f"FeedForward {_act}"] = Case((FeedForward,), lambda a=_act: FeedForward(D, 24, a),
                                        lambda g: (randn(g, B, T, D),))

# --- graded.morphic --------------------------------------------------------------------------


def space() -> GradedStateSpace:
    return GradedStateSpace([Grade("g0", 4, 0), Grade("g1", 4, 1), Grade("g2", 4, 2)])


def _z(g: torch.Generator) -> tuple:
    return (randn(g, B, T, 12),)


def _layer(m: nn.Module, z: torch.Tensor) -> Any:
    return m(z)  # (z_new, LayerTrace): every tensor of the trace is compared too


def banded_layer(conjugated: bool = False, **router: Any) -> MorphicLayer:
    sp = space()
    blocks = ConjugatedBlocks(sp, [0, 1], base=2.0) if conjugated else BandedBlocks(sp, [0, 1])
    return MorphicLayer(sp, blocks.edge_set, blocks, router={"rank": 4, **router},
                        pre_norm="layer")


def typed_layer(mode: str = "soft") -> MorphicLayer:
    sp = space()
    edges = EdgeSet.explicit(sp, [("g0", "g2", "att"), ("g1", "g1", "ffn"), ("g2", "g0", "lin")])
    blocks = [GradeTypedAttention(4, 4, num_heads=2, head_dim=2, value_source="source"),
              FFNBlock(4, 4, 8), LinearBlock(4, 4, bias=True)]
    return MorphicLayer(sp, edges, blocks, router={"rank": 4, "mode": mode})


CASES["MorphicLayer banded"] = Case((MorphicLayer, BandedBlocks, Router, GradewiseNorm),
                                    banded_layer, _z, _layer)
CASES["MorphicLayer conjugated, global normalisation"] = Case(
    (MorphicLayer, ConjugatedBlocks), lambda: banded_layer(True, normalization="global"), _z,
    _layer)
CASES["MorphicLayer typed blocks"] = Case(
    (MorphicLayer, GradeTypedAttention, FFNBlock, LinearBlock), typed_layer, _z, _layer)
CASES["MorphicLayer hard routing, evaluation"] = Case(
    (MorphicLayer,), lambda: typed_layer("hard").eval(), _z, _layer)
CASES["GradewiseNorm rms"] = Case((GradewiseNorm,), lambda: GradewiseNorm(space(), "rms"), _z)
CASES["LinearBlock"] = Case((LinearBlock,), lambda: LinearBlock(4, 6, bias=True),
                            lambda g: (randn(g, B, T, 4),))
CASES["FFNBlock"] = Case((FFNBlock,), lambda: FFNBlock(4, 6, 8, activation="silu"),
                         lambda g: (randn(g, B, T, 4),))
CASES["FixedLinearBlock"] = Case((FixedLinearBlock,), lambda: FixedLinearBlock(torch.randn(6, 4)),
                                 lambda g: (randn(g, B, T, 4),))
CASES["RetrievalBlock"] = Case((RetrievalBlock,), lambda: RetrievalBlock(torch.randn(5, 3), 4),
                               lambda g: (randn(g, B, T, 4),))
CASES["GradeTypedAttention"] = Case(
    (GradeTypedAttention,), lambda: GradeTypedAttention(4, 6, num_heads=2, head_dim=3),
    lambda g: (randn(g, B, T, 4), randn(g, B, T, 6)))
MORPHIC = {"vocab_size": V, "max_len": 16,
           "grades": [{"label": "g0", "dim": 4, "index": 0}, {"label": "g1", "dim": 4, "index": 1}],
           "layers": [{"banded": [0, 1], "block": "ffn", "block_options": {"hidden": 8},
                       "router": {"rank": 4}},
                      {"edges": [["g0", "g1", "a"], ["g1", "g1", "b"]], "block": "attention",
                       "block_options": {"num_heads": 2, "head_dim": 2}}]}
CASES["MorphicTransformer forward"] = Case(
    (MorphicTransformer,), lambda: build_morphic_model(MORPHIC), _lm_inputs)
CASES["MorphicTransformer training terms, utilities"] = Case(
    (MorphicTransformer,), lambda: build_morphic_model(MORPHIC),
    lambda g: (ids(g, B, T), ids(g, B, T)), lambda m, x, y: m.training_terms(x, y))
CASES["MorphicTransformer with an external tool"] = Case(
    (MorphicTransformer, ExternalTool),
    lambda: build_morphic_model({"preset": "variable_addition",
                                 "preset_options": {"p": 5, "shifts": [1, 2], "tool": "external",
                                                    "sem_dim": 8, "rank": 4}}),
    lambda g: (ids(g, B, 3, high=5),), lambda m, x: m(x))

#: Public modules with no case of their own, and where they are compared instead.
ELSEWHERE = {
    AttentionBackend: "every registered backend: tests/cuda/test_backends.py",
    GradingMap: "abstract base of LinearGrading and ExponentialGrading",
}
PACKAGES = ("graded.nn", "graded.attention", "graded.attention.backends", "graded.grading",
            "graded.losses", "graded.positional", "graded.transformer", "graded.morphic")


def public_modules() -> set[type]:
    found = set()
    for name in PACKAGES:
        package = importlib.import_module(name)
        for attr in package.__all__:
            obj = getattr(package, attr)
            if isinstance(obj, type) and issubclass(obj, nn.Module):
                found.add(obj)
    return found


def test_the_cases_cover_every_public_module():
    covered = {cls for case in CASES.values() for cls in case.covers}
    missing = {cls.__name__ for cls in public_modules()
               if cls not in covered and not any(issubclass(cls, base) for base in ELSEWHERE)}
    assert not missing, f"add a case to CASES for {sorted(missing)}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(CASES))
def test_module_on_the_accelerator_equals_the_cpu(name, dtype, device):
    case = CASES[name]
    torch.manual_seed(0)
    module = case.build()
    compare_on(device, module, case.inputs(torch.Generator().manual_seed(1)), case.call, dtype)
