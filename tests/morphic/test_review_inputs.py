"""Edge cases of the morphic package's inputs: empty batches and sequences, thresholds given as a
tensor, and the bad values that used to be accepted silently or fail with an unrelated error
(each refusal names the value and what was expected)."""

import copy
import math
import re

import pytest
import torch

from graded.morphic import (
    Calculator,
    ConjugatedBlocks,
    EdgeSet,
    FFNBlock,
    FixedLinearBlock,
    Grade,
    GradedStateSpace,
    GradeTypedAttention,
    LinearBlock,
    MorphicLayer,
    MorphicTransformer,
    OneHotEncoder,
    RetrievalBlock,
    Router,
    build_morphic_model,
    exact_utilities,
    first_order_utilities,
    train_morphic,
)


def small_space() -> tuple[GradedStateSpace, EdgeSet]:
    space = GradedStateSpace({"a": 3, "b": 2})
    return space, EdgeSet.explicit(space, [("a", "b", "ab"), ("b", "b", "bb"), ("b", "a", "ba")])


def blocks_for(space: GradedStateSpace, edges: EdgeSet) -> list[LinearBlock]:
    return [LinearBlock(space.dim(e.source), space.dim(e.dest)) for e in edges]


# ------------------------------------------------------------------ empty inputs
@pytest.mark.parametrize("shape", [(1, 0), (0, 3)])
@pytest.mark.parametrize("mode", ["hard", "gumbel", "reinforce"])
def test_an_empty_batch_or_sequence_passes_a_sparse_layer_as_an_empty_state(shape, mode):
    """Before, the sparse mix was viewed as (B, T, -1), which a tensor of 0 elements cannot
    resolve ("cannot reshape tensor of 0 elements")."""
    space, edges = small_space()
    layer = MorphicLayer(space, edges, blocks_for(space, edges), router={"mode": mode}).eval()
    with torch.no_grad():
        out, trace = layer(torch.zeros(*shape, 5))
    assert trace.execution == "sparse" and out.shape == (*shape, 5)


def test_the_training_loss_of_an_empty_sequence_is_zero_with_utility_routing():
    """The loss is a mean over the scored tokens, 0 when there is none (model doc); the context
    pass of a utility-routed model (hard routing, sparse, without gradient) crashed on it."""
    model = build_morphic_model({
        "vocab_size": 7, "max_len": 8, "grades": [{"label": "a", "dim": 4}],
        "layers": [{"edges": [["a", "a", "aa"]], "router": {"mode": "hard"},
                    "train_routing": "utility"}]})
    empty = torch.zeros(2, 0, dtype=torch.long)
    loss, metrics = model.training_loss(empty, empty)
    assert float(loss.detach()) == 0.0 and metrics["lm_loss"] == metrics["loss_context"] == 0.0


# -------------------------------------------------------------------- thresholds
def test_thresholds_given_as_a_float64_tensor_are_copied_not_shared():
    """Before, two layers built from one float64 tensor held it as their buffer: setting one
    layer's thresholds changed the other's and the caller's tensor."""
    space, edges = small_space()
    tau = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    first = MorphicLayer(space, edges, blocks_for(space, edges), thresholds=tau)
    second = MorphicLayer(space, edges, blocks_for(space, edges), thresholds=tau)
    first.thresholds.fill_(0.5)
    assert second.thresholds.tolist() == tau.tolist() == [0.1, 0.2, 0.3]


def test_thresholds_given_as_a_tensor_with_a_gradient_make_a_plain_buffer():
    """Before, the buffer was the cast of the caller's tensor, carrying its graph: it required a
    gradient and ``copy.deepcopy`` of the layer (``train_morphic(keep_initial=True)``) failed."""
    space, edges = small_space()
    tau = torch.tensor([0.1, 0.2, 0.3], requires_grad=True)
    layer = MorphicLayer(space, edges, blocks_for(space, edges), thresholds=tau)
    assert not layer.thresholds.requires_grad
    assert copy.deepcopy(layer).thresholds.tolist() == pytest.approx([0.1, 0.2, 0.3])


# ------------------------------------------------------------------- utilities
@pytest.mark.parametrize("utilities", [exact_utilities, first_order_utilities])
def test_utilities_refuse_a_candidate_of_the_wrong_shape(utilities):
    """A candidate narrower than d_h used to broadcast against z^{(h)}, and one of another batch
    shape with as many rows was read row by row: both gave utilities without an error."""
    space, edges = small_space()
    z, weight, targets = torch.randn(2, 4, 5), torch.randn(6, 5), torch.randint(0, 6, (2, 4))
    good = [torch.randn(2, 4, space.dim(e.dest)) for e in edges]
    for bad in (torch.randn(2, 4, 1), torch.randn(4, 2, 2)):
        shape = re.escape(str(tuple(bad.shape)))
        with pytest.raises(ValueError, match=r"candidate of edge 'ab' \(b <- a\) has shape "
                                             rf"{shape}; expected \(2, 4, 2\)"):
            utilities(z, [bad, *good[1:]], edges, space, weight, None, targets)


@pytest.mark.parametrize("utilities", [exact_utilities, first_order_utilities])
def test_utilities_refuse_targets_that_are_not_class_ids(utilities):
    space, edges = small_space()
    z = torch.randn(2, 4, 5)
    cands = [torch.randn(2, 4, space.dim(e.dest)) for e in edges]
    with pytest.raises(TypeError, match=r"targets must be a LongTensor of class ids, got "
                                        r"torch.float32"):
        utilities(z, cands, edges, space, torch.randn(6, 5), None, torch.zeros(2, 4))


# ---------------------------------------------------------------------- router
@pytest.mark.parametrize("normalization", ["global", "dest", "logistic"])
@pytest.mark.parametrize("width", [2, 4])
def test_the_router_refuses_logits_without_one_column_per_edge(normalization, width):
    """Before, a global softmax read 2 logits and the stay option as the 3 edges' weights, and
    logistic gates returned as many weights as columns."""
    space, edges = small_space()
    router = Router(space, edges, normalization=normalization)
    logits = torch.randn(2, 4, width)
    pattern = (r"logits must have one column per edge, shape \(…, 3\) for the edges "
               rf"\['ab', 'bb', 'ba'\]; got shape \(2, 4, {width}\)")
    for call in (router.route, router.probabilities, router.entropy, router.choices):
        with pytest.raises(ValueError, match=pattern):
            call(logits)
    with pytest.raises(ValueError, match="student_" + pattern):
        router.kl(torch.randn(2, 4, 3), logits)


def test_a_router_rank_and_a_grade_dimension_or_index_are_never_bools():
    """``True`` passed every ``isinstance(v, int)`` check: a rank or a dimension of 1."""
    space, edges = small_space()
    with pytest.raises(ValueError, match=r"rank must be a positive int, got True"):
        Router(space, edges, rank=True)
    with pytest.raises(ValueError, match=r"grade 'a': dim must be a positive int, got True"):
        Grade("a", True)
    with pytest.raises(TypeError, match=r"grade 'a': index must be an int or None, got False"):
        Grade("a", 2, False)


def test_a_banded_edge_set_refuses_a_repeated_shift():
    """Before, the error named the duplicated edge 'g1<-g0', not the shift list."""
    space = GradedStateSpace([Grade("g0", 2, 0), Grade("g1", 2, 1)])
    with pytest.raises(ValueError, match=r"shifts must be distinct, got \[1, 0, 1\]"):
        EdgeSet.banded(space, [1, 0, 1])


# ---------------------------------------------------------------------- blocks
def test_a_float64_fixed_block_is_exact_in_a_float64_model():
    """Before, the matrix was rounded to float32 when the block was built (error ~1e-8 after
    ``.double()``)."""
    matrix = torch.tensor([[1 / 3, 0.1], [0.2, 1 + 1e-9]], dtype=torch.float64)
    x = torch.randn(4, 2, dtype=torch.float64)
    block = FixedLinearBlock(matrix).double()
    want = torch.tensor([[sum(matrix[i, j].item() * x[n, j].item() for j in range(2))
                          for i in range(2)] for n in range(4)], dtype=torch.float64)
    torch.testing.assert_close(block(x), want, rtol=1e-15, atol=1e-15)


def test_a_fixed_block_refuses_a_non_finite_or_empty_matrix():
    with pytest.raises(ValueError, match=r"matrix must be finite, got values in \[nan, nan\]"):
        FixedLinearBlock(torch.tensor([[1.0, math.nan], [0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"matrix must be a 2-D Tensor, got torch.Size\(\[0, 3\]\);"
                                         r" expected a \(d_out, d_in\) matrix"):
        FixedLinearBlock(torch.zeros(0, 3))


@pytest.mark.parametrize("bad", [0, True])
def test_retrieval_and_linear_blocks_refuse_a_dimension_that_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match=rf"d_in must be a positive int, got {bad!r}"):
        RetrievalBlock(torch.randn(4, 3), bad)
    with pytest.raises(ValueError, match=rf"d_in must be a positive int, got {bad!r}"):
        LinearBlock(bad, 3)
    with pytest.raises(ValueError, match=rf"hidden must be a positive int, got {bad!r}"):
        FFNBlock(2, 2, bad)


def test_a_retrieval_block_refuses_keys_that_are_not_a_finite_tensor():
    with pytest.raises(ValueError, match=r"keys must be \(k, d_q\), got list"):
        RetrievalBlock([[1.0, 0.0]], 2)
    with pytest.raises(ValueError, match=r"keys must be finite, got values in \[1.0, inf\]"):
        RetrievalBlock(torch.tensor([[1.0, math.inf]]), 2)


def test_a_retrieval_block_with_float64_keys_reads_float32_states():
    """r = softmax(K W_q x / σ²) (004 §5.3.2); before, float64 keys and a float32 query failed
    with "expected m1 and m2 to have the same dtype"."""
    keys = torch.randn(4, 3, dtype=torch.float64)
    block = RetrievalBlock(keys, 3, temperature=0.5)
    x = torch.randn(2, 5, 3)
    scores = torch.einsum("kq,btq->btk", keys, x.double() @ block.query.weight.double().T)
    torch.testing.assert_close(block(x).double(), torch.softmax(scores / 0.5, -1), atol=1e-5,
                               rtol=1e-5)


def test_grade_typed_attention_refuses_source_and_destination_of_different_tokens():
    block = GradeTypedAttention(3, 2, num_heads=2, head_dim=4)
    with pytest.raises(ValueError, match=r"expected x_src \(B, T, 3\) and x_dst \(B, T, 2\), "
                                         r"got \(1, 4, 3\) and \(1, 3, 2\)"):
        block(torch.randn(1, 4, 3), torch.randn(1, 3, 2))
    with pytest.raises(ValueError, match=r"got \(1, 4, 3\) and NoneType"):
        block(torch.randn(1, 4, 3), None)


@pytest.mark.parametrize(("base", "grade", "power"), [(10.0, "g2", "1e\\+40"),
                                                      (0.01, "g1", "1.0000000000000003e-40")])
def test_conjugated_blocks_refuse_a_base_whose_powers_leave_float32(base, grade, power):
    """D_g = λ^{index(g)}: before, λ = 10 at index 40 failed with "value cannot be converted to
    type float without overflow" and λ = 0.01 at index 20 gave D_g = 0 and NaN outputs."""
    space = GradedStateSpace([Grade(f"g{i}", 2, 20 * i) for i in range(3)])
    with pytest.raises(ValueError, match=rf"base λ = {base} gives D_{grade} = λ\^\d+ = {power}; "
                                         r"expected a scale in float32's normal range"):
        ConjugatedBlocks(space, [20], base=base)


def test_conjugated_blocks_refuse_an_infinite_scale():
    space = GradedStateSpace([Grade(f"g{i}", 2, i) for i in range(2)])
    scales = {"g0": torch.tensor([math.inf, 1.0]), "g1": torch.ones(2)}
    with pytest.raises(ValueError, match=r"scales\['g0'\] must be positive of shape \(2,\), got "
                                         r"\[inf, 1.0\]; expected finite values"):
        ConjugatedBlocks(space, [1], scales=scales)


# ----------------------------------------------------------------------- tools
@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_a_one_hot_encoder_refuses_a_scale_that_breaks_the_argmax_round_trip(scale):
    """Dec ∘ Enc = Id needs scale > 0 (argmax of −e_x is not x); NaN and ∞ made NaN states."""
    with pytest.raises(ValueError, match=r"scale must be"):
        OneHotEncoder(5, scale)


def test_a_one_hot_encoder_refuses_a_bool_size():
    with pytest.raises(ValueError, match=r"n must be a positive int, got True"):
        OneHotEncoder(True)


def test_the_calculator_refuses_boolean_literals():
    """``True + 1`` used to evaluate to 2."""
    with pytest.raises(ValueError, match=r"unsupported expression element Constant\(value=True\)"
                                         r"; expected int literals"):
        Calculator()("True + 1")
    assert Calculator()("(7 + 3) % 11") == 10


# ------------------------------------------------------------- model, training
def test_the_model_refuses_a_bool_vocabulary_a_float_ignore_index_and_bad_typed_tables():
    space = GradedStateSpace({"a": 3})
    layer = MorphicLayer(space, EdgeSet.explicit(space, [("a", "a", "aa")]), [LinearBlock(3, 3)])
    with pytest.raises(ValueError, match=r"vocab_size must be a positive int, got True"):
        MorphicTransformer(space, [layer], True)
    with pytest.raises(TypeError, match=r"ignore_index must be an int, got 2.5"):
        MorphicTransformer(space, [layer], 5, ignore_index=2.5)
    with pytest.raises(ValueError, match=r"typed embedding for 'a' must be a \(5, 3\) Tensor, "
                                         r"got list"):
        MorphicTransformer(space, [layer], 5, typed_embeddings={"a": [[0.0] * 3] * 5})
    with pytest.raises(ValueError, match=r"readout_init for 'a' must be finite and real, got "
                                         r"torch.float32 with 15 non-finite entries"):
        MorphicTransformer(space, [layer], 5, readout_init={"a": torch.full((5, 3), math.nan)})


def test_the_model_refuses_operator_tokens_outside_its_vocabulary():
    """An operator id ≥ vocab_size never occurs: the router would route as before any operator
    on every token. The config refused it; the model built by hand did not."""
    space = GradedStateSpace({"a": 3})
    layer = MorphicLayer(space, EdgeSet.explicit(space, [("a", "a", "aa")]), [LinearBlock(3, 3)],
                         router={"input_type": "operator", "operator_tokens": [3, 9]})
    with pytest.raises(ValueError, match=r"layer 0's router reads operator_tokens \[3, 9\]; "
                                         r"expected token ids below vocab_size = 5"):
        MorphicTransformer(space, [layer], 5)


def tiny_model() -> MorphicTransformer:
    return build_morphic_model({"vocab_size": 5, "max_len": 4, "grades": [{"label": "a", "dim": 2}],
                                "layers": [{"edges": [["a", "a", "aa"]]}]})


def batches(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, 5, (2, 3), generator=generator)
    return x, x.roll(-1, 1)


@pytest.mark.parametrize(("options", "error"), [
    ({"log_every": 0}, r"log_every must be >= 1, got 0"),
    ({"clip": math.nan}, r"clip must be a finite number, got nan \(expected > 0\)"),
    ({"clip": 0.0}, r"clip must be > 0, got 0.0"),
])
def test_train_morphic_refuses_a_bad_logging_interval_or_clipping_bound(options, error):
    """Before, log_every=0 raised ZeroDivisionError after the first step, clip=NaN turned every
    parameter into NaN and clip=0 zeroed every gradient."""
    with pytest.raises(ValueError, match=error):
        train_morphic(tiny_model(), batches, steps=2, **options)


@pytest.mark.parametrize("steps", [2.5, "3", True])
def test_train_morphic_refuses_a_step_count_that_is_not_an_int(steps):
    """Before, steps=2.5 failed inside range() with a TypeError that named no option."""
    with pytest.raises(TypeError, match=f"steps must be an int, got {steps!r}"):
        train_morphic(tiny_model(), batches, steps=steps)


def test_train_morphic_without_clipping_takes_adamw_steps():
    """clip=None is no clipping: one AdamW step moves each weight by lr at most (plus decay)."""
    model = tiny_model()
    before = model.readout.weight.detach().clone()
    train_morphic(model, batches, steps=1, lr=0.01, weight_decay=0.0, clip=None)
    moved = (model.readout.weight.detach() - before).abs()
    assert float(moved.max()) <= 0.01 + 1e-6 and float(moved.max()) > 0
