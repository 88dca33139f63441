"""Constructor switches take True or False only: ``bool("false")`` and ``bool("no")`` are True,
and 0 or 1 may be a count given to the wrong argument, so each of these is a ``TypeError``
that names the argument (the gradings, graded and plain attention, the graph attention layers,
task splits); a NumPy bool is taken as the bool it is. Also the character tokenizer's
``from_texts`` refuses a single string and non-string entries, as the other tokenizers do."""

import numpy as np
import pytest
import torch

from graded.attention.graded import GradedMultiheadAttention
from graded.attention.multihead import MultiheadAttention
from graded.encodings.tokenizers import BPETokenizer, CharTokenizer, StochasticMergeTokenizer
from graded.evaluation import make_split
from graded.grading import ExponentialGrading, LinearGrading
from graded.nn.graph import GATLayer, GATv2Layer, GradedGraphAttention
from graded.tasks import get_task
from graded.tasks.base import Vocab, check_numbers

# truthy or falsy non-bools: each was read as its truth value before
NOT_BOOLS = ["no", "false", "yes", 0, 1, None, 1.0]


def _refused(name):
    return pytest.raises(TypeError, match=rf"^{name} must be True or False, got ")


# ---- gradings --------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [LinearGrading, ExponentialGrading])
@pytest.mark.parametrize("value", NOT_BOOLS)
def test_grading_learnable_refuses_non_bools(cls, value):
    with _refused("learnable"):
        cls(4, learnable=value)


@pytest.mark.parametrize("cls", [LinearGrading, ExponentialGrading])
def test_grading_learnable_bools_give_a_parameter_or_a_buffer(cls):
    for value, learnable in ((True, True), (False, False), (np.bool_(True), True),
                             (np.bool_(False), False)):
        g = cls(4, learnable=value)
        assert g.learnable is learnable
        assert isinstance(g.grades, torch.nn.Parameter) is learnable
        assert ("grades" in dict(g.named_buffers())) is not learnable


def test_linear_grading_learnable_no_is_not_a_parameter_any_more():
    # the review's case: learnable='no' made the grades a Parameter (bool('no') is True)
    with _refused("learnable"):
        LinearGrading(4, learnable="no")
    with _refused("learnable"):
        ExponentialGrading(4, learnable="yes")


# ---- attention -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["learnable_grades", "fold_grading", "qk_rotated"])
@pytest.mark.parametrize("value", NOT_BOOLS)
def test_graded_attention_switches_refuse_non_bools(name, value):
    with _refused(name):
        GradedMultiheadAttention(8, 2, **{name: value})


def test_graded_attention_learnable_grades_false_string_no_longer_trains_the_grades():
    with _refused("learnable_grades"):
        GradedMultiheadAttention(8, 2, learnable_grades="false")
    m = GradedMultiheadAttention(8, 2, learnable_grades=np.bool_(False), fold_grading=False,
                                 qk_rotated=np.bool_(True))
    assert not m.grading.grades.requires_grad
    assert m.fold_grading is False and m.qk_rotated is True and m.folded_parts == ()


@pytest.mark.parametrize("name", ["bias", "add_bias_kv", "add_zero_attn", "batch_first"])
@pytest.mark.parametrize("value", NOT_BOOLS)
def test_multihead_attention_switches_refuse_non_bools(name, value):
    with _refused(name):
        MultiheadAttention(8, 2, **{name: value})
    with _refused(name):  # through the graded module's **mha_kwargs too
        GradedMultiheadAttention(8, 2, **{name: value})


@pytest.mark.parametrize("value", [v for v in NOT_BOOLS if v is not None])
def test_multihead_attention_out_bias_is_a_bool_or_none(value):
    with _refused("out_bias"):
        MultiheadAttention(8, 2, out_bias=value)
    assert MultiheadAttention(8, 2, bias=False, out_bias=None).out_proj.bias is None
    assert MultiheadAttention(8, 2, bias=False, out_bias=True).out_proj.bias is not None


def test_multihead_attention_numpy_bools_are_taken():
    m = MultiheadAttention(8, 2, bias=np.bool_(False), batch_first=np.bool_(True))
    assert m.in_proj_bias is None and m.out_proj.bias is None and m.batch_first is True
    x = torch.randn(3, 5, 8)  # (batch, length, E): batch first
    assert m(x, x, x)[0].shape == (3, 5, 8)


# ---- graph attention -------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [GATLayer, GATv2Layer])
@pytest.mark.parametrize("name", ["concat", "add_self_loops", "bias"])
@pytest.mark.parametrize("value", NOT_BOOLS)
def test_graph_attention_switches_refuse_non_bools(cls, name, value):
    with _refused(name):
        cls(4, 3, 2, **{name: value})


@pytest.mark.parametrize("name", ["share_weights", "projection_bias"])
@pytest.mark.parametrize("value", NOT_BOOLS)
def test_gatv2_switches_refuse_non_bools(name, value):
    with _refused(name):
        GATv2Layer(4, 3, 2, **{name: value})


@pytest.mark.parametrize("value", NOT_BOOLS)
def test_graded_graph_attention_learn_scale_refuses_non_bools(value):
    with _refused("learn_scale"):
        GradedGraphAttention(4, 3, learn_scale=value)
    with _refused("concat"):  # a layer option passed through
        GradedGraphAttention(4, 3, 2, concat=value)


def test_gat_concat_false_averages_the_heads():
    # concat='false' concatenated the heads (output 2·3 = 6 wide); False averages them (3)
    with _refused("concat"):
        GATLayer(4, 3, 2, concat="false")
    x, adj = torch.randn(5, 4), torch.ones(5, 5)
    assert GATLayer(4, 3, 2, concat=np.bool_(False))(x, adj).shape == (5, 3)
    assert GATLayer(4, 3, 2, concat=True)(x, adj).shape == (5, 6)
    layer = GATv2Layer(4, 3, 2, share_weights=np.bool_(True), projection_bias=False)
    assert layer.lin_r is layer.lin_l and layer.lin_l.bias is None
    assert GradedGraphAttention(4, 3, learn_scale=np.bool_(True)).grade_scale.requires_grad


# ---- task splits -----------------------------------------------------------------------------
@pytest.mark.parametrize("value", NOT_BOOLS)
def test_task_split_unseen_refuses_non_bools(value):
    task = get_task("dyck", max_length=6)
    with _refused("unseen"):
        task.split("random", 30, 30, unseen=value)
    with _refused("unseen"):
        make_split(task, "random", 30, 30, unseen=value)


@pytest.mark.parametrize("kind", ["random", "relabelled"])
@pytest.mark.parametrize("value", NOT_BOOLS)
def test_modular_split_unseen_refuses_non_bools(kind, value):
    task = get_task("modular", p=7)
    with _refused("unseen"):
        task.split(kind, 20, unseen=value)


def test_split_unseen_numpy_bool_is_the_bool():
    task = get_task("dyck", max_length=6)
    a = task.split("random", 30, 30, unseen=np.bool_(False))
    b = task.split("random", 30, 30, unseen=False)
    assert all(torch.equal(x.inputs, y.inputs) for x, y in zip(a, b, strict=True))
    modular = get_task("modular", p=7)
    a = modular.split("relabelled", 20, unseen=np.bool_(True))
    b = modular.split("relabelled", 20, unseen=True)
    assert torch.equal(a[1].inputs, b[1].inputs)


def test_vocab_decode_skip_pad_and_check_numbers_integer_refuse_non_bools():
    vocab = Vocab(["<pad>", "a", "b"])
    assert vocab.decode([0, 1, 2], skip_pad=np.bool_(False)) == ["<pad>", "a", "b"]
    with _refused("skip_pad"):
        vocab.decode([0, 1, 2], skip_pad="false")  # kept the padding's opposite before
    assert check_numbers("w", [1, 2], integer=True) == (1, 2)
    with _refused("integer"):
        check_numbers("w", [1.5], integer=0)


# ---- tokenizers ------------------------------------------------------------------------------
def test_char_tokenizer_from_texts_refuses_a_single_string_as_the_others_do():
    for build in (CharTokenizer.from_texts, StochasticMergeTokenizer.from_texts,
                  BPETokenizer.train):
        with pytest.raises(TypeError, match=r"texts must be an iterable of strings, got the "
                                            r"string 'abc'; wrap it in a list"):
            build("abc")


def test_char_tokenizer_from_texts_names_a_non_string_entry():
    with pytest.raises(TypeError, match=r"^texts\[0\] must be a str, got int 1$"):
        CharTokenizer.from_texts([1, 2])
    with pytest.raises(TypeError, match=r"^texts\[1\] must be a str, got bytes b'x'$"):
        CharTokenizer.from_texts(["ab", b"x"])
    tok = CharTokenizer.from_texts(iter(["ba", "c"]))  # any iterable of strings
    assert tok.decode(tok.encode("abc")) == "abc" and tok.vocab_size == 3 + 3


# ---- sizes and choices given a bool ----------------------------------------------------------
def test_graded_graph_attention_version_true_is_not_gat_v1():
    # True == 1, so version=True built a GATLayer (version 1) without a word
    with pytest.raises(ValueError, match=r"version must be 1 \(GAT\) or 2 \(GATv2\), got True"):
        GradedGraphAttention(4, 3, version=True)
    assert isinstance(GradedGraphAttention(4, 3, version=1).layer, GATLayer)


@pytest.mark.parametrize("name", ["in_features", "out_features", "heads"])
def test_graph_attention_sizes_refuse_bools(name):
    sizes = {"in_features": 4, "out_features": 3, "heads": 2, name: True}
    with pytest.raises(ValueError, match=rf"{name} must be a positive integer, got True"):
        GATv2Layer(**sizes)


def test_multihead_attention_head_counts_refuse_bools():
    # num_heads=True and num_kv_heads=True were taken as one head
    with pytest.raises(ValueError, match=r"num_heads must be a positive int, got True"):
        MultiheadAttention(8, True)
    with pytest.raises(ValueError, match=r"num_kv_heads must be a positive divisor of "
                                         r"num_heads=2, got True"):
        MultiheadAttention(8, 2, num_kv_heads=True)
    with pytest.raises(ValueError, match=r"embed_dim must be a positive int, got True"):
        MultiheadAttention(True, 1)


@pytest.mark.parametrize("dropout", [True, "0.1", float("nan")])
def test_multihead_attention_dropout_is_a_number(dropout):
    """A string raised a bare TypeError from the range comparison; True and NaN stay refused,
    now by the one check of a number (graded.checks.check_float), which names the option."""
    with pytest.raises((TypeError, ValueError), match="dropout"):
        MultiheadAttention(8, 2, dropout=dropout)


def test_graded_graph_attention_base_is_a_number():
    """A guard: base=True (λ = 1, no grading) is refused by name, a number is taken."""
    with pytest.raises((TypeError, ValueError), match="base"):
        GradedGraphAttention(4, 4, base=True)
    assert GradedGraphAttention(4, 4, base=3).base == 3.0
