"""Generation's options in the types a researcher passes them: NumPy scalars from a sweep, an
EOS id as a tensor (as Hugging Face's ``generate`` takes it), a prompt still a list; each
either decodes as the plain Python value does or is refused naming the value and the type
expected, and an option beam search would misread (``early_stopping=1``) is refused."""

import numpy as np
import pytest
import torch

from graded import TransformerConfig, TransformerLM

VOCAB = 11
PROMPT = torch.tensor([[1, 2, 3], [4, 5, 6]])


def tiny_lm(seed=0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, max_len=16,
                            positional="learned")
    model = TransformerLM(cfg).double().eval()
    with torch.no_grad():  # sharper scores, so that beams and processors change tokens
        model.head.proj.weight.mul_(6.0)
    return model


@pytest.mark.parametrize("scalar", [np.float32, np.float16])
def test_numpy_float_options_decode_as_the_python_floats_they_hold(scalar):
    """``np.float32(0.7)`` (a sweep over ``np.linspace(..., dtype=np.float32)``) used to be
    refused as "temperature must be a finite number > 0, got np.float32(0.7)"; each option now
    gives the tokens of ``float`` of the same value, sampled under one seed and by beams."""
    lm = tiny_lm()
    sampled = {"temperature": 0.7, "top_p": 0.8, "repetition_penalty": 1.3}
    ours = lm.generate(PROMPT, 6, do_sample=True, generator=torch.Generator().manual_seed(0),
                       **{k: scalar(v) for k, v in sampled.items()})
    plain = lm.generate(PROMPT, 6, do_sample=True, generator=torch.Generator().manual_seed(0),
                        **{k: float(scalar(v)) for k, v in sampled.items()})
    assert torch.equal(ours, plain)
    beams = lm.generate(PROMPT, 6, num_beams=3, length_penalty=scalar(0.5),
                        sequence_bias={(2,): scalar(-1.5)})
    plain = lm.generate(PROMPT, 6, num_beams=3, length_penalty=float(scalar(0.5)),
                        sequence_bias={(2,): float(scalar(-1.5))})
    assert torch.equal(beams, plain)


def test_an_eos_id_given_as_a_tensor_or_array_ends_rows_as_the_list_does():
    """Hugging Face's ``generate`` takes ``eos_token_id=torch.tensor([a, b])``; ours refused
    it as "must be a token id in [0, 11) ..., got tensor([..])", ids that are in range."""
    lm = tiny_lm()
    free = lm.generate(PROMPT, 6)
    ends = [int(free[0, 4]), int(free[1, 5])]  # tokens greedy decoding emits
    expected = lm.generate(PROMPT, 6, eos_token_id=ends, pad_token_id=0)
    assert expected.shape[1] < free.shape[1] or (expected == 0).any()
    for given in (torch.tensor(ends), np.array(ends), torch.tensor(ends[0]), np.int64(ends[0])):
        single = not getattr(given, "ndim", 0)
        want = lm.generate(PROMPT, 6, eos_token_id=ends[0], pad_token_id=0) if single else expected
        assert torch.equal(lm.generate(PROMPT, 6, eos_token_id=given, pad_token_id=0), want)
    for bad in (torch.tensor([3.0]), torch.tensor([True]), torch.tensor([[3]]),
                torch.tensor([VOCAB])):
        with pytest.raises(ValueError, match=r"eos_token_id must be a token id in \[0, 11\)"):
            lm.generate(PROMPT, 6, eos_token_id=bad)


def test_a_prompt_that_is_not_a_tensor_is_refused_naming_its_type():
    """A list of ids (a tokenizer's output) used to fail with "'list' object has no attribute
    'dim'"."""
    with pytest.raises(TypeError, match=r"input_ids must be an integer torch.Tensor of shape "
                       r"\(batch, length\), got a list"):
        tiny_lm().generate([[1, 2, 3]], 4)


@pytest.mark.parametrize("bad", [1, 0, 1.0, np.True_, "True"])
def test_early_stopping_that_is_not_true_false_or_never_is_refused(bad):
    """``early_stopping=1`` passed ``1 in (True, False, 'never')`` and then decoded as False
    (beam search tests ``is True``): the tokens of a search that should have stopped were
    longer ([1, 2, 2, 2, 2, 2, 2, 2] for True's [1, 2, 2, 6] with the model below)."""
    lm = tiny_lm()
    kwargs = dict(num_beams=2, eos_token_id=6, pad_token_id=0)
    assert not torch.equal(lm.generate(PROMPT[:1, :2], 6, early_stopping=True, **kwargs),
                           lm.generate(PROMPT[:1, :2], 6, early_stopping=False, **kwargs))
    with pytest.raises(ValueError, match=rf"early_stopping must be one of \(True, False, "
                       rf"'never'\), got {bad!r}"):
        lm.generate(PROMPT, 4, early_stopping=bad, **kwargs)


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_generator_that_is_not_a_torch_generator_is_refused_before_decoding(do_sample):
    """``generator=0`` (a seed given for the generator) was ignored by greedy decoding and
    failed inside ``torch.multinomial`` when sampling; it is refused either way, as every
    option is checked used or not."""
    with pytest.raises(TypeError, match=r"generator must be a torch.Generator or None, got "
                       r"int 0"):
        tiny_lm().generate(PROMPT, 4, do_sample=do_sample, generator=0)
