"""Input checks read values once per forward pass, and none inside ``checked_inputs``.

Reading a tensor's values (``tolist``, ``item``, ``bool``, ``int``) is a host–device
synchronisation on a GPU. The models check token ids and positions once at their entry and
their layers trust them; a caller that checked its data (the trainer) reads nothing at all.
Reads are counted here with a ``TorchFunctionMode`` that sees every tensor method call.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from graded import TransformerConfig, TransformerLM
from graded.attention.backends import available_backends, backend_capabilities
from graded.attention.functional import attention
from graded.checks import check_token_ids, checked_inputs, inputs_checked, value_range
from graded.positional import LearnedPositions, RotaryEmbedding, check_positions
from graded.transformer import Seq2SeqTransformer, TransformerClassifier

READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
         torch.Tensor.__float__, torch.Tensor.__index__}


class CountReads(TorchFunctionMode):
    """Counts calls that copy a tensor's values to Python, and the ATen ops called."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self.reads += 1
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def lm(positional: str = "learned", layers: int = 2, **extra) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(TransformerConfig(vocab_size=32, d_model=16, n_heads=2,
                                           n_layers=layers, max_len=8, positional=positional,
                                           **extra))


IDS = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))


def reads_of(fn) -> int:
    with CountReads() as c:
        fn()
    return c.reads


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi", "none"])
@pytest.mark.parametrize("grading", [None, "linear"])
def test_a_forward_pass_reads_the_ids_once_and_nothing_else(positional, grading):
    extra = {} if grading is None else dict(grading=grading, learnable_grades=True)
    for layers in (1, 4):  # rotary embeddings in every layer read nothing
        model = lm(positional, layers, **extra)
        assert reads_of(lambda model=model: model(IDS).sum().backward()) == 1
        with checked_inputs():
            assert reads_of(lambda model=model: model(IDS).sum().backward()) == 0


def test_given_positions_are_read_once_for_all_layers():
    model = lm("rope", 4)
    positions = torch.arange(8).expand(2, 8)
    assert reads_of(lambda: model(IDS, positions=positions)) == 2  # ids, positions


def test_checked_inputs_is_scoped_and_nests():
    assert not inputs_checked()
    with checked_inputs(False):  # inactive: for data that could not be checked
        assert not inputs_checked()
    with checked_inputs():
        assert inputs_checked()
        with checked_inputs():
            assert inputs_checked()
        assert inputs_checked()
    assert not inputs_checked()
    with pytest.raises(RuntimeError), checked_inputs():
        raise RuntimeError("leaves the block")
    assert not inputs_checked()


def test_bad_inputs_are_still_named_outside_the_block():
    model = lm("rope")
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 32\); got range \[0, 40\]"):
        model(torch.tensor([[0, 40]]))
    with pytest.raises(ValueError, match=r"got range \[-1, 3\]"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match=r"TransformerDecoder: positions must be non-negative, "
                                         r"got min -2"):
        model(IDS, positions=torch.arange(-2, 6).expand(2, 8))
    with pytest.raises(TypeError, match=r"positions must be an integer tensor"):
        model(IDS, positions=torch.zeros(2, 8))
    # inside the block the caller answers for the values: RoPE rotates by negative angles
    with checked_inputs():
        assert torch.isfinite(model(IDS, positions=torch.arange(-2, 6).expand(2, 8))).all()


def test_default_positions_are_checked_from_the_shapes():
    model = lm("learned").eval()
    model(torch.zeros(1, 8, dtype=torch.long))  # max_len positions: fine
    with pytest.raises(ValueError, match=r"TransformerDecoder: position 8 is beyond max_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    cache = model.new_cache()
    model(torch.zeros(1, 6, dtype=torch.long), cache=cache)
    model(torch.zeros(1, 2, dtype=torch.long), cache=cache)  # positions 6, 7
    with pytest.raises(ValueError, match=r"position 8 is beyond max_len=8"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    # with padding the positions count real tokens only: read, not inferred from the shape
    with pytest.raises(ValueError, match=r"position 9 is beyond max_len=8"):
        model(torch.zeros(1, 10, dtype=torch.long), torch.zeros(1, 10, dtype=torch.bool))
    left_padded = torch.arange(10).unsqueeze(0) < 2  # 2 pads, 8 tokens at positions 0..7
    assert model(torch.zeros(1, 10, dtype=torch.long), left_padded).shape == (1, 10, 32)


def test_other_models_check_their_inputs_once():
    cfg = TransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=2, max_len=8,
                            positional="rope")
    torch.manual_seed(0)
    clf = TransformerClassifier(cfg, 3)
    assert reads_of(lambda: clf(IDS)) == 1
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 32\)"):
        clf(IDS + 32)
    s2s = Seq2SeqTransformer(cfg)
    assert reads_of(lambda: s2s(IDS, IDS)) == 2  # source and target ids
    with checked_inputs():
        assert reads_of(lambda: s2s(IDS, IDS)) == 0


def test_the_encodings_check_their_positions_when_called_alone():
    with pytest.raises(ValueError, match=r"RotaryEmbedding: positions must be non-negative"):
        RotaryEmbedding(4)(torch.zeros(1, 1, 3, 4), torch.tensor([0, -1, 2]))
    with pytest.raises(ValueError, match=r"LearnedPositions: position 4 is beyond max_len=4"):
        LearnedPositions(4, 4)(torch.arange(5))
    with checked_inputs():
        check_positions(torch.tensor([-5]), 2, "who")  # trusted: not read
        with pytest.raises(TypeError, match="integer tensor"):
            check_positions(torch.tensor([0.5]), 2, "who")  # dtypes are still checked
    assert reads_of(lambda: check_positions(torch.arange(6), 8, "who")) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-2**40, 2**40), min_size=0, max_size=30),
       st.sampled_from([torch.int64, torch.int32]))
def test_value_range_is_min_and_max(values, dtype):
    if dtype == torch.int32:
        values = [max(min(v, 2**31 - 1), -2**31) for v in values]
    t = torch.tensor(values, dtype=dtype)
    assert value_range(t) == ((min(values), max(values)) if values else None)
    assert reads_of(lambda: value_range(t)) == (1 if values else 0)


def test_check_token_ids_names_the_range():
    check_token_ids(torch.tensor([0, 9]), 10)
    check_token_ids(torch.zeros(0, dtype=torch.long), 10)
    with pytest.raises(ValueError, match=r"must lie in \[0, 10\); got range \[3, 10\]"):
        check_token_ids(torch.tensor([[3, 10]]), 10)
    with checked_inputs():
        check_token_ids(torch.tensor([[3, 10]]), 10)


def test_causal_attention_on_the_fused_path_builds_no_mask():
    q, k, v = (torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    with CountReads() as c:
        out, _ = attention(q, k, v, is_causal=True)
    assert "arange" not in c.calls and c.calls.count("scaled_dot_product_attention") == 1
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    torch.testing.assert_close(out, ref)
    # a shorter query block (a cache) still gets the bottom-right causal mask
    out, _ = attention(q[:, :, 3:], k, v, is_causal=True)
    torch.testing.assert_close(out, ref[:, :, 3:])


def test_inside_the_block_padding_and_token_grades_are_not_read_either():
    cfg = TransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=2, max_len=8,
                            grading="exponential", token_grading=True)
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    pad = torch.zeros(2, 8, dtype=torch.bool)
    grades = torch.rand(2, 8)
    outside = reads_of(lambda: model(IDS, pad, token_grades=grades))
    assert outside >= 3  # ids, the padding (to drop an empty mask), the token grades
    with checked_inputs():
        assert reads_of(lambda: model(IDS, pad, token_grades=grades)) == 0
        # the mask is kept as given: the same logits as without it
        torch.testing.assert_close(model(IDS, pad, token_grades=grades),
                                   model(IDS, token_grades=grades))
    with pytest.raises(ValueError, match=r"token_grades must be finite and >= 0"):
        model(IDS, token_grades=-grades)


def _backend_options(name: str) -> dict:
    if name == "block_sparse":
        layout = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)  # T = 8: two blocks of 4
        return {"attn_backend_options": {"layout": layout, "block_size": 4}}
    return {}


BACKENDS = available_backends()
CAUSAL_BACKENDS = [b for b in BACKENDS if backend_capabilities(b).causal]


@pytest.mark.parametrize("grading", [None, "linear", "exponential"])
@pytest.mark.parametrize("backend", CAUSAL_BACKENDS)
def test_a_checked_training_pass_of_every_causal_backend_reads_no_value(backend, grading):
    """Inside ``checked_inputs`` a training pass (forward and backward) of an LM reads no value
    into Python and sizes nothing by values, whatever its attention backend and grading: on a
    GPU it never waits (CPU stand-in for tests/cuda/test_synchronisation.py, seen at dispatch
    by tests/host_reads.py). Every backend that serves a decoder; the encoder test below takes
    them all."""
    from host_reads import HostReads

    options = _backend_options(backend)
    extra = {} if grading is None else dict(grading=grading, learnable_grades=True)
    model = lm("rope", 2, attn_backend=backend, **options, **extra)
    model(IDS).sum().backward()  # lazily built state first
    with checked_inputs(), HostReads() as reads:
        model(IDS).sum().backward()
    if grading == "exponential":  # the overflow check reads the exponent: on the CPU only
        reads.sites = [s for s in reads.sites if "_scales" not in s]
    assert reads.sites == []


@pytest.mark.parametrize("grading", [None, "linear"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checked_training_pass_of_a_padded_encoder_reads_no_value(backend, grading):
    """The same for a classifier (an encoder) on a padded batch, every backend: inside
    ``checked_inputs`` the padding mask is taken as given, not read."""
    from host_reads import HostReads

    options = {"block_sparse": {"layout": torch.tensor([[1, 0], [1, 1]], dtype=torch.bool),
                                "block_size": 4},
               "linformer": {"max_len": 8, "rank": 4}}.get(backend, {})
    extra = {} if grading is None else dict(grading=grading, learnable_grades=True)
    torch.manual_seed(0)
    model = TransformerClassifier(TransformerConfig(
        vocab_size=32, d_model=16, n_heads=2, n_layers=2, max_len=8, attn_backend=backend,
        attn_backend_options=options, **extra), 3)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0, 6:] = True
    model(IDS, mask).sum().backward()
    with checked_inputs(), HostReads() as reads:
        model(IDS, mask).sum().backward()
    assert reads.sites == []


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.float32])
def test_token_ids_of_another_dtype_are_refused_naming_the_dtypes_taken(dtype):
    # "must be an integer tensor, got torch.int16" contradicted itself for integer dtypes
    model = TransformerLM(TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1))
    with pytest.raises(TypeError, match=rf"token ids must be an integer tensor of dtype "
                                        rf"torch.int64 or torch.int32 .*got {dtype}"):
        model(torch.zeros(1, 3, dtype=dtype))
    ids = torch.tensor([[1, 2, 3]])  # the dtypes named are taken, with the same logits
    torch.testing.assert_close(model(ids.int()), model(ids), rtol=0, atol=0)


def test_bool_token_grades_are_refused_not_read_as_zero_and_one():
    """A bool tensor (a padding or depth mask passed by mistake) was read as the grades 0 and
    1, as bool grades are refused everywhere else (``as_grade_tensor``)."""
    cfg = TransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_len=8,
                            grading="exponential", token_grading=True)
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    mask = torch.rand(2, 8) > 0.5
    with pytest.raises(TypeError, match=r"token_grades must hold real grades .* got dtype "
                                        r"torch.bool"):
        model(IDS, token_grades=mask)
    torch.testing.assert_close(model(IDS, token_grades=mask.long()),
                               model(IDS, token_grades=mask.float()))
