"""Transformer models: equivariance, causality, shapes, config validation, learning."""

import math
import time

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerClassifier, TransformerConfig, TransformerLM
from graded.train import sequence_cross_entropy

POSITIONAL = ["sinusoidal", "sinusoidal1", "learned", "rope", "alibi", "none"]


def small(**kw):
    base = dict(vocab_size=23, d_model=32, n_heads=4, n_layers=2, max_len=64)
    return TransformerConfig(**{**base, **kw})


def test_encoder_without_positions_is_permutation_equivariant_000_lemma_4_17():
    torch.manual_seed(0)
    cfg = small(positional="none")
    model = TransformerClassifier(cfg, 3).eval()
    x = torch.randint(0, 23, (2, 7))
    h, _ = model.encoder(x)
    perm = torch.randperm(7)
    h_perm, _ = model.encoder(x[:, perm])
    torch.testing.assert_close(h_perm, h[:, perm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", POSITIONAL)
@pytest.mark.parametrize("norm_first", [True, False])
def test_future_tokens_do_not_change_past_outputs(positional, norm_first):
    torch.manual_seed(0)
    lm = TransformerLM(small(positional=positional, norm_first=norm_first)).eval()
    x = torch.randint(0, 23, (2, 10))
    y = x.clone()
    y[:, 6:] = torch.randint(0, 23, (2, 4))
    torch.testing.assert_close(lm(x)[:, :6], lm(y)[:, :6], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_every_block_option_runs_and_backpropagates(activation, norm):
    lm = TransformerLM(small(activation=activation, norm=norm, dropout=0.1))
    x = torch.randint(0, 23, (2, 8))
    loss = sequence_cross_entropy(lm(x)[:, :-1], x[:, 1:])
    loss.backward()
    assert all(p.grad is not None for p in lm.parameters())


def test_padding_positions_do_not_influence_real_tokens():
    torch.manual_seed(0)
    cfg = small(positional="learned")
    model = TransformerClassifier(cfg, 2).eval()
    x = torch.randint(0, 23, (1, 5))
    padded = torch.cat([x, torch.randint(0, 23, (1, 3))], dim=1)
    kpm = torch.tensor([[False] * 5 + [True] * 3])
    torch.testing.assert_close(model(padded, kpm), model(x), atol=1e-5, rtol=1e-5)


def test_seq2seq_and_classifier_shapes():
    s2s = Seq2SeqTransformer(small(n_decoder_layers=1))
    src, tgt = torch.randint(0, 23, (2, 9)), torch.randint(0, 23, (2, 4))
    assert s2s(src, tgt).shape == (2, 4, 23)
    reg = TransformerClassifier(small(vocab_size=None, input_dim=5), 1, pooling="last")
    assert reg(torch.randn(3, 6, 5)).shape == (3, 1)


def test_seq2seq_decoder_is_causal_and_reads_the_source():
    torch.manual_seed(0)
    s2s = Seq2SeqTransformer(small()).eval()
    src = torch.randint(0, 23, (1, 6))
    tgt = torch.randint(0, 23, (1, 5))
    base = s2s(src, tgt)
    tgt2 = tgt.clone()
    tgt2[0, 4] = (tgt[0, 4] + 1) % 23
    torch.testing.assert_close(s2s(src, tgt2)[:, :4], base[:, :4])
    src2 = (src + 1) % 23
    assert not torch.allclose(s2s(src2, tgt), base)


def test_attention_weights_are_returned_per_layer():
    lm = TransformerLM(small())
    logits, weights = lm(torch.randint(0, 23, (2, 5)), need_weights=True)
    assert logits.shape == (2, 5, 23)
    assert len(weights) == 2 and weights[0].shape == (2, 4, 5, 5)
    assert torch.all(torch.triu(weights[0], diagonal=1) == 0)


def test_config_round_trips_through_json_and_rejects_unknown_keys():
    cfg = small(positional="rope", activation="swiglu")
    assert TransformerConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match=r"unknown TransformerConfig key\(s\) \['n_head'\]"):
        TransformerConfig.from_dict({**cfg.to_dict(), "n_head": 4})


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        (dict(d_model=30, n_heads=4), r"d_model=30 is invalid: expected a multiple of n_heads=4"),
        (dict(positional="absolute"), r"positional='absolute' is invalid: expected one of"),
        (dict(dropout=1.5), r"dropout=1.5 is invalid"),
        (dict(n_layers=0), r"n_layers=0 is invalid: expected a positive integer"),
        (dict(activation="tanh"), r"activation='tanh'"),
        (dict(pad_id=99), r"pad_id=99 is invalid"),
        # infinite or NaN numbers used to pass, reaching weights, frequencies or grades
        (dict(rope_base=math.inf), r"rope_base=inf is invalid: expected a finite number > 1"),
        (dict(init_std=math.nan), r"init_std=nan is invalid: expected a finite standard"),
        (dict(init_std=-0.1), r"init_std=-0.1 is invalid: expected a finite standard"),
        (dict(norm_eps=math.inf), r"norm_eps=inf is invalid: expected a finite positive"),
        (dict(grading="exponential", grading_base=math.inf), r"grading_base=inf is invalid"),
        (dict(grading="linear", grade_init_value=math.nan),
         r"grade_init_value=nan is invalid: expected a finite number"),
        (dict(grading="exponential", grade_position_alpha=math.inf),
         r"grade_position_alpha=inf is invalid: expected a finite number >= 0"),
    ],
)
def test_bad_config_values_name_the_field(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        small(**changes)


def test_bad_model_inputs_name_the_value():
    lm = TransformerLM(small())
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 23\); got range"):
        lm(torch.tensor([[1, 30]]))
    with pytest.raises(TypeError, match="integer tensor"):
        lm(torch.randn(1, 4))
    with pytest.raises(ValueError, match=r"position 64 is beyond max_len=64"):
        lm(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(1, 3\)"):
        lm(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.bool))


def test_bad_source_padding_of_a_decode_step_names_the_value():
    """Seq2SeqTransformer.decode checks the source padding against the memory, as the
    encoder checks its own (it reached the attention kernel, whose errors name neither)."""
    model = Seq2SeqTransformer(small()).eval()
    memory = model.encode(torch.randint(0, 23, (2, 5)))
    tgt = torch.randint(0, 23, (2, 3))
    with pytest.raises(TypeError, match=r"memory_key_padding_mask .* must be bool .*int64"):
        model.decode(tgt, memory, src_key_padding_mask=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"memory_key_padding_mask .* has shape \(2, 4\); "
                                         r"expected \(batch, length\) = \(2, 5\)"):
        model.decode(tgt, memory, src_key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, 3:] = True
    torch.testing.assert_close(model.decode(tgt, memory, src_key_padding_mask=pad)[0],
                               model.decode(tgt[:1], memory[:1, :3])[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["explicit", "chunked"])
def test_left_padded_lm_on_another_exact_backend_has_the_fused_kernels_gradients(backend):
    """Left padding leaves the padded queries of a causal LM no key: on the explicit backend
    their softmax gave NaN gradients to every parameter (the loss ignores those positions)."""
    torch.manual_seed(0)
    cfg = small(d_model=16, n_heads=2, n_layers=1)
    ref = TransformerLM(cfg).double()
    model = TransformerLM(cfg.replace(attn_backend=backend)).double()
    model.load_state_dict(ref.state_dict())
    x = torch.randint(0, 23, (2, 5))
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, :2] = True
    grads = []
    for m in (ref, model):
        m(x, pad)[~pad].square().sum().backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-10, atol=1e-12)


def test_small_lm_learns_modular_addition_within_seconds():
    """Sequences "a b = c" with c = (a + b) mod 7; the loss is on the answer token only."""
    torch.manual_seed(0)
    p, eq = 7, 7
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    a, b = a.flatten(), b.flatten()
    seqs = torch.stack([a, b, torch.full_like(a, eq), (a + b) % p], dim=1)
    lm = TransformerLM(small(vocab_size=p + 1, d_model=64, max_len=8, positional="learned"))
    opt = torch.optim.AdamW(lm.parameters(), lr=3e-3, weight_decay=0.0)
    start = time.perf_counter()
    for _ in range(300):
        logits = lm(seqs[:, :-1])
        loss = sequence_cross_entropy(logits[:, -1], seqs[:, -1])
        opt.zero_grad()
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - start
    lm.eval()
    accuracy = (lm(seqs[:, :-1])[:, -1].argmax(-1) == seqs[:, -1]).float().mean().item()
    assert accuracy >= 0.98, f"accuracy {accuracy:.3f} after 300 steps ({elapsed:.1f}s)"


@pytest.mark.parametrize("pooling", ["first", "last", "mean"])
def test_pooling_reads_the_real_tokens_of_left_and_right_padded_rows(pooling):
    """A padded row is classified as its unpadded tokens alone, wherever the padding is:
    ``first`` is the first real token (it used to read slot 0, a padding token's output,
    in a left-padded row), ``last`` the last real one."""
    torch.manual_seed(0)
    model = TransformerClassifier(small(positional="learned", init_std=0.3), 3,
                                  pooling=pooling).eval()
    x = torch.randint(1, 23, (1, 4))
    alone = model(x)
    pad = torch.zeros(1, 2, dtype=torch.long)
    real, padding = torch.zeros(1, 4, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool)
    left = model(torch.cat([pad, x], 1), torch.cat([padding, real], 1))
    right = model(torch.cat([x, pad], 1), torch.cat([real, padding], 1))
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=1e-5)
