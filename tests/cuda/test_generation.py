"""Generation on the accelerator equals generation on the CPU, token for token: greedy and beam
search, with and without the KV cache (and each backend's own decoding state), left-padded
prompts and a stop token, for ungraded, LGT and EGT language models and a seq2seq model. Tokens
are compared in float64, so that no near-tie between two logits can resolve differently on the
two devices; the cached logits step by step in float64 and float32. Sampling with a generator
on the accelerator is reproducible there."""

from __future__ import annotations

import copy

import pytest
import torch
from device_checks import assert_close_across_devices

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM

V, PROMPT, NEW = 13, 5, 12
MODELS = {
    "ungraded, sinusoidal": {},
    "LGT, RoPE": dict(positional="rope", grading="linear", learnable_grades=True,
                      grade_init="warm_start", grade_init_value=0.3),
    "EGT, ALiBi, grouped keys": dict(positional="alibi", n_kv_heads=2, grading="exponential",
                                     learnable_grades=True, grade_init="warm_start",
                                     grade_init_value=0.3),
    "sliding_window state": dict(attn_backend="sliding_window",
                                 attn_backend_options={"window": 4}),
    "linear state": dict(attn_backend="linear", attn_backend_options={"chunk_size": 4}),
    "performer state": dict(attn_backend="performer",
                            attn_backend_options={"num_features": 16, "seed": 0}),
    "bigbird cached keys": dict(attn_backend="bigbird",
                                attn_backend_options={"block_size": 4, "num_random_blocks": 1}),
}
DECODING = {
    "greedy, cache": dict(use_cache=True),
    "greedy, no cache": dict(use_cache=False),
    "beam 3, cache": dict(num_beams=3, use_cache=True),
    "beam 3, no cache": dict(num_beams=3, use_cache=False),
}


def config(**overrides) -> TransformerConfig:
    base = dict(vocab_size=V, d_model=64, n_heads=4, n_layers=2, d_ff=64, max_len=32,
                init_std=0.6)  # a wide init: varied, peaked next-token distributions
    return TransformerConfig(**{**base, **overrides})


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of three prompts of lengths 5, 2, 4, and its padding mask."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, V, (3, PROMPT), generator=gen)
    kpm = torch.arange(PROMPT)[None, :] < torch.tensor([0, 3, 1])[:, None]
    return ids.masked_fill(kpm, 0), kpm


def on_both(model: torch.nn.Module, device: torch.device, dtype: torch.dtype = torch.float64):
    model = model.to(dtype).eval()
    return model, copy.deepcopy(model).to(device)


@pytest.mark.parametrize("decoding", list(DECODING))
@pytest.mark.parametrize("name", list(MODELS))
def test_lm_generates_the_same_tokens_on_the_accelerator_as_on_the_cpu(name, decoding, device):
    torch.manual_seed(0)
    cpu, acc = on_both(TransformerLM(config(**MODELS[name])), device)
    ids, kpm = prompts()
    free = cpu.generate(ids, NEW, key_padding_mask=kpm, **DECODING[decoding])
    eos = int(free[0, PROMPT + 3])  # a stop token that ends row 0 early
    for stop in ({}, dict(eos_token_id=eos, pad_token_id=0)):
        kw = dict(**stop, **DECODING[decoding])
        expected = cpu.generate(ids, NEW, key_padding_mask=kpm, **kw)
        got = acc.generate(ids.to(device), NEW, key_padding_mask=kpm.to(device), **kw)
        assert got.device.type == device.type
        assert torch.equal(got.cpu(), expected), f"{stop}\ncpu {expected.tolist()}\n" \
                                                  f"acc {got.tolist()}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(MODELS))
def test_cached_decoding_logits_on_the_accelerator_equal_the_cpu(name, dtype, device):
    """The prompt, then one token at a time through the cache: each step's logits equal the
    CPU's within device_checks' tolerance (in float32 on CUDA the prompt pass of the pattern
    backends runs FlexAttention, head width 16)."""
    torch.manual_seed(0)
    cpu, acc = on_both(TransformerLM(config(**MODELS[name])), device, dtype)
    ids = torch.randint(0, V, (2, PROMPT + NEW), generator=torch.Generator().manual_seed(2))
    logits = {}
    for key, model in (("cpu", cpu), ("acc", acc)):
        x, cache = ids.to(next(model.parameters()).device), model.new_cache()
        with torch.no_grad():
            steps = [model(x[:, :PROMPT], cache=cache)]
            steps += [model(x[:, i:i + 1], cache=cache) for i in range(PROMPT, x.shape[1])]
        logits[key] = torch.cat(steps, dim=1)
    assert_close_across_devices(logits["acc"], logits["cpu"], dtype, "cached logits")


@pytest.mark.parametrize("decoding", list(DECODING))
def test_seq2seq_generates_the_same_tokens_on_the_accelerator_as_on_the_cpu(decoding, device):
    torch.manual_seed(0)
    model = Seq2SeqTransformer(config(grading="exponential", learnable_grades=True,
                                      grade_init="warm_start", grade_init_value=0.3))
    cpu, acc = on_both(model, device)
    src = torch.randint(2, V, (3, 7), generator=torch.Generator().manual_seed(1))
    src_kpm = torch.arange(7)[None, :] >= torch.tensor([7, 4, 6])[:, None]  # right padding
    kw = dict(bos_token_id=1, **DECODING[decoding])
    expected = cpu.generate(src, NEW, src_key_padding_mask=src_kpm, **kw)
    got = acc.generate(src.to(device), NEW, src_key_padding_mask=src_kpm.to(device), **kw)
    assert torch.equal(got.cpu(), expected), f"\ncpu {expected.tolist()}\nacc {got.tolist()}"


def test_sampling_with_a_generator_on_the_accelerator_is_reproducible(device):
    """The streams of CPU and GPU generators differ, so sampled tokens are compared on the
    accelerator only: the same seed gives the same tokens, cached or not."""
    torch.manual_seed(0)
    _, acc = on_both(TransformerLM(config()), device)
    ids = prompts()[0].to(device)
    runs = []
    for use_cache in (True, False, True):
        gen = torch.Generator(device=device).manual_seed(7)
        runs.append(acc.generate(ids, NEW, do_sample=True, top_k=5, top_p=0.9, generator=gen,
                                 use_cache=use_cache))
    assert runs[0].device.type == device.type
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
