"""Our Seq2SeqTransformer against Hugging Face's Marian (``MarianMTModel``), in float64.

The Marian models are randomly initialised (no download) and mapped by
:mod:`graded.interop.marian`. Their weights are redrawn so that decoding depends on the source
(with Hugging Face's initialisation every row repeats one token): fan-in scaled projections,
sharper attention, norms and biases away from 1 and 0, a non-zero ``final_logits_bias``.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from graded.interop import from_marian, graft_grading, to_marian  # noqa: E402

V, PAD, EOS = 23, 22, 0


def _marian(seed: int = 1, **kw):
    base = {"vocab_size": V, "d_model": 16, "encoder_layers": 2, "decoder_layers": 2,
            "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 24,
            "decoder_ffn_dim": 24, "max_position_embeddings": 20, "pad_token_id": PAD,
            "decoder_start_token_id": PAD, "eos_token_id": EOS, "dropout": 0.0,
            "activation_function": "swish", "scale_embedding": True}
    cfg = transformers.MarianConfig(**{**base, **kw})
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # Marian's fixed sinusoids stay
                continue
            if "embed_tokens" in name or "shared" in name or "lm_head" in name:
                p.normal_(std=0.25)
            elif p.dim() == 2:  # fan-in scale; sharper attention
                sharp = 3.0 if name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
                p.normal_(std=sharp / math.sqrt(p.shape[1]))
            else:
                p.normal_(1.0 if "layer_norm.weight" in name else 0.0, 0.2)
        model.final_logits_bias.normal_(std=0.1)
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sources (3, 7) right-padded in two rows (attention mask 1 = token), and targets (3, 6)
    starting from the decoder start token."""
    src = torch.randint(0, PAD, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(src)
    mask[1, 4:] = 0
    mask[2, 6:] = 0
    tgt = torch.randint(0, V, (3, 6), generator=torch.Generator().manual_seed(2))
    tgt[:, 0] = PAD
    return src, mask, tgt


def _logits(hf, src, mask, tgt):
    return hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits


@pytest.mark.parametrize("options", [
    {}, {"activation_function": "gelu", "scale_embedding": False},
    {"activation_function": "relu"}, {"activation_function": "gelu_new"},
    {"tie_word_embeddings": False}, {"share_encoder_decoder_embeddings": False},
    {"decoder_layers": 3},
], ids=["swish", "gelu_unscaled", "relu", "gelu_new", "untied_head", "unshared", "deeper_decoder"])
def test_marian_logits_equal_hugging_face_in_float64(options):
    hf = _marian(**options)
    model = from_marian(hf)
    src, mask, tgt = _batch()
    theirs = _logits(hf, src, mask, tgt)
    assert torch.allclose(model(src, tgt, mask == 0), theirs, atol=1e-10, rtol=0)
    assert torch.allclose(_logits(to_marian(model), src, mask, tgt), theirs, atol=1e-10, rtol=0)


def test_marian_embeddings_are_tied_exactly_when_hugging_face_ties_all_three():
    assert from_marian(_marian()).config.tie_embeddings
    for options in ({"tie_word_embeddings": False}, {"share_encoder_decoder_embeddings": False}):
        assert not from_marian(_marian(**options)).config.tie_embeddings


@pytest.mark.parametrize("options", [{}, {"share_encoder_decoder_embeddings": False,
                                          "tie_word_embeddings": False}], ids=["tied", "untied"])
def test_marian_round_trip_gives_back_the_same_hugging_face_weights(options):
    hf = _marian(**options)
    again = to_marian(from_marian(hf), eos_token_id=EOS)
    assert set(again.state_dict()) == set(hf.state_dict())
    for key, value in hf.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    for name in ("pad_token_id", "decoder_start_token_id", "eos_token_id", "vocab_size"):
        assert getattr(again.config, name) == getattr(hf.config, name), name


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_equals_hugging_face(use_cache):
    """Source padding; an EOS id that one row emits early, so that finished rows are padded;
    the decoder starts from Marian's decoder_start_token_id (its pad token)."""
    hf = _marian()
    model = from_marian(hf)
    src, mask, _ = _batch()

    def theirs(**kw):
        return hf.generate(src, attention_mask=mask, max_new_tokens=9, do_sample=False,
                           num_beams=1, **kw)

    free = theirs(eos_token_id=None, forced_eos_token_id=None)
    assert len({tuple(row) for row in free[:, 1:].tolist()}) == 3  # the source matters
    eos = int(free[0, 2])  # row 0 finishes at its second token
    ours = model.generate(src, 9, bos_token_id=hf.config.decoder_start_token_id,
                          src_key_padding_mask=mask == 0, eos_token_id=eos, pad_token_id=PAD,
                          use_cache=use_cache)
    reference = theirs(eos_token_id=eos, forced_eos_token_id=None)
    assert torch.equal(ours, reference)
    assert (ours[0, 3:] == PAD).all() and not (ours[:, 1:] == eos).any(dim=1).all()
    # Marian's default generation config forces EOS as the last token of unfinished rows
    forced = theirs(eos_token_id=eos, forced_eos_token_id=eos)
    unfinished = ~(ours[:, 1:-1] == eos).any(dim=1)
    assert torch.equal(forced[:, :-1], ours[:, :-1])
    assert torch.equal(forced[:, -1], torch.where(unfinished, eos, ours[:, -1]))


def test_beam_search_equals_hugging_face():
    hf = _marian()
    model = from_marian(hf)
    src, mask, _ = _batch()
    free = hf.generate(src, attention_mask=mask, max_new_tokens=9, do_sample=False,
                       num_beams=1, eos_token_id=None, forced_eos_token_id=None)
    eos = int(free[0, 2])
    for early in (True, False, "never"):
        ours = model.generate(src, 7, bos_token_id=hf.config.decoder_start_token_id,
                              src_key_padding_mask=mask == 0, num_beams=3, early_stopping=early,
                              eos_token_id=eos, pad_token_id=PAD, length_penalty=1.0)
        theirs = hf.generate(src, attention_mask=mask, max_new_tokens=7, do_sample=False,
                             num_beams=3, early_stopping=early, eos_token_id=eos,
                             pad_token_id=PAD, length_penalty=1.0, forced_eos_token_id=None)
        assert torch.equal(ours, theirs), early


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_grafted_marian_starts_from_hugging_face(grading):
    hf = _marian()
    model = from_marian(hf)
    graded = graft_grading(model, grading, learnable_grades=True)
    src, mask, tgt = _batch()
    assert torch.allclose(graded(src, tgt, mask == 0), _logits(hf, src, mask, tgt), atol=1e-10,
                          rtol=0)
    frozen = sorted(n for n, p in graded.named_parameters() if not p.requires_grad)
    assert frozen == ["decoder.embed.positions.embedding.weight",
                      "encoder.embed.positions.embedding.weight", "head.proj.bias"]
    assert graded.encoder.embed.tokens.padding_idx == PAD
    with pytest.raises(ValueError, match=f"grading='{grading}': a graded model has no"):
        to_marian(graded)


def test_training_steps_on_the_converted_marian_follow_hugging_face():
    """The same SGD steps on both keep them equal: Marian's fixed position tables and logits
    bias stay fixed, and its pad row (in every decoder input) gets no gradient from lookups."""
    hf = _marian()
    model = from_marian(hf)
    hf.train()
    model.train()
    src, mask, tgt = _batch()
    labels = torch.roll(tgt, -1, dims=1)

    def loss(logits):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))

    optimisers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (hf, model)]
    for _ in range(3):
        for opt, logits in zip(optimisers, (_logits(hf, src, mask, tgt),
                                            model(src, tgt, mask == 0)), strict=True):
            opt.zero_grad()
            loss(logits).backward()
            opt.step()
    hf.eval()
    model.eval()
    assert torch.allclose(model(src, tgt, mask == 0), _logits(hf, src, mask, tgt), atol=1e-10,
                          rtol=0)


def test_a_local_marian_folder_loads_with_every_weight(tmp_path):
    """Marian does not save its position tables (it rebuilds them); every other weight must be
    in the folder."""
    from safetensors.torch import load_file, save_file

    hf = _marian()
    hf.save_pretrained(tmp_path / "marian")
    model = from_marian(tmp_path / "marian").double()
    src, mask, tgt = _batch()
    assert torch.allclose(model(src, tgt, mask == 0), _logits(hf, src, mask, tgt), atol=1e-10,
                          rtol=0)
    weights = tmp_path / "marian" / "model.safetensors"
    state = load_file(weights)
    del state["model.decoder.layers.1.encoder_attn.k_proj.weight"]
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks weights .*decoder\.layers\.1\.encoder_attn"):
        from_marian(tmp_path / "marian")


def test_a_folder_of_another_architecture_is_refused_as_marian(tmp_path):
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="model_type='gpt2'; expected model_type='marian'"):
        from_marian(tmp_path / "gpt2")
    with pytest.raises(TypeError, match=r"expected a transformers\.MarianMTModel"):
        from_marian(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(("options", "message"), [
    ({"normalize_before": True}, "normalize_before=True is not mapped; expected False"),
    ({"add_final_layer_norm": True}, "add_final_layer_norm=True is not mapped; expected False"),
    ({"activation_function": "quick_gelu"},
     "activation_function='quick_gelu' is not mapped; expected one of"),
    ({"decoder_attention_heads": 2},
     "decoder_attention_heads=2 is not mapped; expected encoder_attention_heads=4"),
    ({"decoder_ffn_dim": 20}, "decoder_ffn_dim=20 is not mapped; expected encoder_ffn_dim=24"),
    ({"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 25},
     "decoder_vocab_size=25 is not mapped; expected vocab_size=23"),
], ids=["normalize_before", "final_layer_norm", "quick_gelu", "heads", "ffn", "decoder_vocab"])
def test_unmapped_marian_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        from_marian(_marian(**options))


@pytest.mark.parametrize(("field", "value"), [
    ("norm_first", True), ("positional", "sinusoidal"), ("embed_norm", True),
    ("final_norm", True), ("norm", "rms"), ("n_kv_heads", 2),
])
def test_marian_export_refuses_what_marian_cannot_express(field, value):
    from graded import Seq2SeqTransformer

    model = Seq2SeqTransformer(from_marian(_marian()).config.replace(**{field: value}))
    with pytest.raises(ValueError, match=f"{field}={value!r} \\(expected "):
        to_marian(model)


@pytest.mark.parametrize(("options", "message"), [
    ({"cross_attn_backend": "performer"}, r"cross_attn_backend='performer' is not exact"),
    ({"cross_attn_backend": "linear"}, r"cross_attn_backend='linear' is not exact"),
    ({"cross_attn_backend_options": {"scale": 1.0}},
     r"cross_attn_backend_options scale=1.0 scales the scores otherwise than Marian"),
], ids=["performer", "linear", "scale"])
def test_marian_export_refuses_cross_attention_that_marian_does_not_compute(options, message):
    """Marian's cross-attention is exact softmax(Q Kᵀ/√head_dim) V; another backend or scale
    gives other logits from the same weights, and was exported as Marian's."""
    from graded import Seq2SeqTransformer

    converted = from_marian(_marian())
    model = Seq2SeqTransformer(converted.config.replace(**options)).double().eval()
    model.load_state_dict(converted.state_dict(), strict=False)  # a performer's features too
    src, mask, tgt = _batch()
    assert not torch.allclose(model(src, tgt, mask == 0), converted(src, tgt, mask == 0),
                              atol=1e-3)
    with pytest.raises(ValueError, match=message):
        to_marian(model)


def test_marian_export_refuses_changed_positions_and_a_missing_pad_token():
    model = from_marian(_marian())
    with torch.no_grad():
        model.decoder.embed.positions.embedding.weight[3, 0] += 1.0
    with pytest.raises(ValueError, match="decoder's position table is not Marian's sinusoidal"):
        to_marian(model)
    unpadded = type(model)(model.config.replace(pad_id=None))
    with pytest.raises(ValueError, match=r"pad_token_id=None .*expected a token id in"):
        to_marian(unpadded)


def _marian_that_likes_padding(seed: int = 1):
    """A Marian model whose greedy and beam outputs reach the pad token (its logit raised), with
    the generation config of a Marian checkpoint: the pad token banned, EOS forced at the
    length limit."""
    hf = _marian(seed)
    with torch.no_grad():
        hf.final_logits_bias[0, PAD] += 2.0
    hf.generation_config.bad_words_ids = [[PAD]]
    assert hf.generation_config.forced_eos_token_id == EOS  # MarianConfig's default
    return hf


@pytest.mark.parametrize(("num_beams", "early_stopping"),
                         [(1, False), (3, True), (3, False), (3, "never")])
@pytest.mark.parametrize("early_eos", [False, True], ids=["eos_at_limit", "eos_early"])
def test_marian_generation_options_give_hugging_faces_tokens(num_beams, early_stopping,
                                                             early_eos):
    """``from_marian`` records Hugging Face's generation config (start, EOS and pad ids,
    ``bad_words_ids=[[pad]]``, ``forced_eos_token_id``); passed to ``generate`` they give
    ``MarianMTModel.generate``'s tokens, greedy and beam; without the two options the tokens
    differ (the pad token is generated, no EOS is forced)."""
    from graded.interop.marian import marian_generation_options

    hf = _marian_that_likes_padding()
    src, mask, _ = _batch()
    if early_eos:  # an EOS that row 0 emits at its second step: rows finish early
        free = hf.generate(src, attention_mask=mask, max_new_tokens=8, num_beams=1,
                           forced_eos_token_id=None)
        hf.generation_config.eos_token_id = hf.generation_config.forced_eos_token_id = int(
            free[0, 2])
    model = from_marian(hf)
    assert model.generation_options == marian_generation_options(hf.generation_config)
    assert model.generation_options["bad_words_ids"] == [[PAD]]
    options = {**model.generation_options, "num_beams": num_beams,
               "early_stopping": early_stopping}
    theirs = hf.generate(src, attention_mask=mask, max_new_tokens=8, num_beams=num_beams,
                         early_stopping=early_stopping)
    for use_cache in (True, False):
        ours = model.generate(src, 8, src_key_padding_mask=mask == 0, use_cache=use_cache,
                              **options)
        assert torch.equal(ours, theirs), use_cache
    unconstrained = {k: v for k, v in options.items()
                     if k not in ("bad_words_ids", "forced_eos_token_id")}
    before = model.generate(src, 8, src_key_padding_mask=mask == 0, **unconstrained)
    assert not torch.equal(before, theirs)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_marian_multi_token_bad_words_give_hugging_faces_tokens(num_beams):
    """Entries of several tokens with the checkpoint's options: one starting with the decoder
    start token (its history's first token, so it bans a first target token) and two of
    tokens the unconstrained search generates; ``MarianMTModel.generate`` with the same
    ``bad_words_ids`` gives our tokens, and every row differs from the unconstrained one."""
    hf = _marian_that_likes_padding()
    model = from_marian(hf)
    src, mask, _ = _batch()
    options = {**model.generation_options, "num_beams": num_beams}
    free = model.generate(src, 8, src_key_padding_mask=mask == 0, **options)
    words = [[PAD], [PAD, int(free[0, 1])], [int(free[1, 1]), int(free[1, 2])],
             [int(free[2, 1]), int(free[2, 2]), int(free[2, 3])]]
    theirs = hf.generate(src, attention_mask=mask, max_new_tokens=8, num_beams=num_beams,
                         bad_words_ids=words)
    assert (theirs != free).any(dim=1).all()
    for use_cache in (True, False):
        ours = model.generate(src, 8, src_key_padding_mask=mask == 0, use_cache=use_cache,
                              **{**options, "bad_words_ids": words})
        assert torch.equal(ours, theirs), use_cache


def test_marian_generation_options_refuse_what_generate_cannot_do():
    from graded.interop.marian import marian_generation_options

    config = transformers.GenerationConfig(decoder_start_token_id=PAD, do_sample=True)
    with pytest.raises(ValueError, match="do_sample=True; expected greedy or beam"):
        marian_generation_options(config)
    with pytest.raises(ValueError, match="no decoder_start_token_id"):
        marian_generation_options(transformers.GenerationConfig(eos_token_id=EOS))
    model = from_marian(_marian())
    src, _, _ = _batch()
    with pytest.raises(ValueError, match=r"bad_words_ids entry \[\]: empty; expected one or"):
        model.generate(src, 4, bos_token_id=PAD, bad_words_ids=[[3, 4], []])
    with pytest.raises(ValueError, match=r"bad_words_ids entry \[3, 23\]: expected a token id "
                       r"in \[0, 23\), got 23"):
        model.generate(src, 4, bos_token_id=PAD, bad_words_ids=[[3, V]])
    with pytest.raises(ValueError, match=r"bad_words_ids entry \[23\]: expected a token id in "
                       r"\[0, 23\)"):
        model.generate(src, 4, bos_token_id=PAD, bad_words_ids=[[V]])
    with pytest.raises(ValueError, match=r"forced_eos_token_id must be a token id in \[0, 23\) "
                       "or a non-empty list of them, got -1"):
        model.generate(src, 4, bos_token_id=PAD, forced_eos_token_id=-1)


@pytest.mark.parametrize("num_beams", [1, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("setting", [
    {"repetition_penalty": 3.0}, {"no_repeat_ngram_size": 1}, {"sequence_bias": {(3,): 4.0}},
    {"min_length": 3}, {"min_length": 4}, {"min_new_tokens": 3},
], ids=["repetition_penalty", "no_repeat_ngram", "sequence_bias", "min_length_3",
        "min_length_4", "min_new_tokens"])
def test_logits_processors_of_the_generation_config_give_hugging_faces_tokens(setting,
                                                                              num_beams):
    """Hugging Face's ``generate`` applies the processors its generation config sets; the
    options recorded for ours carry them (``min_length`` counts the decoder start token), so
    the tokens agree, and differ from those decoded without the processor (which the options
    gave before)."""
    from graded.interop.marian import marian_generation_options

    hf = _marian_that_likes_padding()
    src, mask, _ = _batch()
    free = hf.generate(src, attention_mask=mask, max_new_tokens=8, num_beams=1,
                       forced_eos_token_id=None)
    eos = int(free[0, 2])  # greedy decoding ends row 0 at its second new token
    hf.generation_config.eos_token_id = hf.generation_config.forced_eos_token_id = eos
    hf.generation_config.num_beams = num_beams
    plain = from_marian(hf).generation_options
    for name, value in setting.items():
        setattr(hf.generation_config, name, value)
    model = from_marian(hf)
    assert model.generation_options == marian_generation_options(hf)
    theirs = hf.generate(src, attention_mask=mask, max_new_tokens=8)
    ours = model.generate(src, 8, src_key_padding_mask=mask == 0, **model.generation_options)
    assert torch.equal(ours, theirs)
    without = model.generate(src, 8, src_key_padding_mask=mask == 0, **plain)
    if num_beams == 1 or ("min_length" not in setting and "min_new_tokens" not in setting):
        assert not torch.equal(without, theirs)  # (these beams end no row before the minimum)


@pytest.mark.parametrize(("name", "value"), [
    ("suppress_tokens", [3, 4]), ("begin_suppress_tokens", [3]), ("forced_bos_token_id", 3),
    ("exponential_decay_length_penalty", (2, 1.5)), ("encoder_no_repeat_ngram_size", 2),
    ("num_return_sequences", 2),
])
def test_generation_config_options_generate_cannot_apply_are_refused_by_name(name, value):
    """Each makes Hugging Face's ``generate`` give other tokens (or rows) than ours, and was
    dropped from the options without a word."""
    from graded.interop.marian import marian_generation_options

    config = transformers.GenerationConfig(decoder_start_token_id=PAD, eos_token_id=EOS,
                                           num_beams=3, **{name: value})
    with pytest.raises(ValueError, match=rf"generation config has {name}={re.escape(repr(value))}"
                                         r", which Seq2SeqTransformer.generate cannot apply"):
        marian_generation_options(config)
    neutral = transformers.GenerationConfig(decoder_start_token_id=PAD, num_beams=3,
                                            repetition_penalty=1.0, no_repeat_ngram_size=0,
                                            num_return_sequences=1, min_length=0)
    assert marian_generation_options(neutral) == {
        "bos_token_id": PAD, "num_beams": 3, "length_penalty": 1.0, "early_stopping": False}


def test_a_grafted_marian_keeps_its_generation_options_and_hugging_faces_tokens():
    """graft_grading carries ``generation_options`` over: at neutral grades the LGT generates
    ``MarianMTModel.generate``'s tokens with them."""
    hf = _marian_that_likes_padding()
    src, mask, _ = _batch()
    graded = graft_grading(from_marian(hf), "linear", learnable_grades=True)
    assert graded.generation_options == from_marian(hf).generation_options
    theirs = hf.generate(src, attention_mask=mask, max_new_tokens=8, num_beams=3)
    ours = graded.generate(src, 8, src_key_padding_mask=mask == 0,
                           **{**graded.generation_options, "num_beams": 3})
    assert torch.equal(ours, theirs)


def test_a_generation_config_with_a_list_of_eos_ids_decodes_as_hugging_face():
    """Hugging Face's generation configs may list several EOS ids (and forced EOS ids); the
    options read from one decode as its ``generate`` does. A list of start ids is refused."""
    from graded.interop.marian import marian_generation_options

    hf = _marian()
    model = from_marian(hf)
    src, _, _ = _batch()
    free = model.generate(src, 6, **{**model.generation_options, "eos_token_id": None,
                                     "forced_eos_token_id": None})
    eos = [int(free[0, 2]), EOS]
    hf.generation_config.eos_token_id = eos
    hf.generation_config.forced_eos_token_id = eos
    options = marian_generation_options(hf)
    assert options["eos_token_id"] == eos and options["forced_eos_token_id"] == eos
    theirs = hf.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=6)
    assert torch.equal(model.generate(src, 6, **options), theirs)
    assert theirs[0, 2] == eos[0] and (theirs[0, 3:] == PAD).all()  # the listed id ended it
    with pytest.raises(ValueError, match=r"decoder_start_token_id=\[0, 1\]: expected one token"):
        marian_generation_options(transformers.GenerationConfig(decoder_start_token_id=[0, 1]))


@pytest.mark.slow  # six models' beam searches (2 to 3 s on 2 cores): `pytest -m slow`
def test_renormalize_logits_of_the_generation_config_is_carried_and_gives_its_tokens():
    """A generation config with ``renormalize_logits=True`` (the log-softmax after the
    processors, which changes beam search's choices once the pad token is banned) was read
    without it: the options now carry it, and the beams give ``MarianMTModel.generate``'s
    tokens over several models."""
    from graded.interop.marian import marian_generation_options

    src, mask, _ = _batch()
    differ = 0
    for seed in range(6):
        hf = _marian_that_likes_padding(seed)
        hf.generation_config.num_beams = 4
        plain = from_marian(hf).generate(src, 8, src_key_padding_mask=mask == 0,
                                         **marian_generation_options(hf))
        hf.generation_config.renormalize_logits = True
        options = marian_generation_options(hf)
        assert options["renormalize_logits"] is True
        ours = from_marian(hf).generate(src, 8, src_key_padding_mask=mask == 0, **options)
        theirs = hf.generate(src, attention_mask=mask, max_new_tokens=8)
        assert torch.equal(ours, theirs), seed
        differ += not torch.equal(ours, plain)
    assert differ  # the option changes the tokens of at least one of these models
