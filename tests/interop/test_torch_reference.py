"""The encoder and the encoder-decoder against ``torch.nn.Transformer`` with mapped weights:
logits equal in float64 to 1e-10, and greedy and beam decoding give the same tokens.

The reference is torch's module with the pieces it lacks written out here: an embedding table,
sinusoidal positions computed independently (Vaswani et al. §3.5), and a linear readout."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graded import Seq2SeqTransformer, TransformerConfig
from graded.transformer.models import TransformerEncoder

# torch's encoder takes its nested-tensor fast path in eval mode with padding (padded positions
# then come out as zeros; they are masked everywhere they are read)
pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor:UserWarning",
                                        "ignore:The PyTorch API of nested tensors:UserWarning")

V, D, H, FF = 19, 16, 2, 40
TOL = {"rtol": 0.0, "atol": 1e-10}  # max abs difference <= 1e-10


def sinusoids(length: int, d: int) -> torch.Tensor:
    pe = torch.zeros(length, d, dtype=torch.float64)
    for t in range(length):
        for i in range(0, d, 2):
            pe[t, i] = math.sin(t / 10000 ** (i / d))
            pe[t, i + 1] = math.cos(t / 10000 ** (i / d))
    return pe


def config(activation: str, norm_first: bool, **kw) -> TransformerConfig:
    return TransformerConfig(vocab_size=V, d_model=D, n_heads=H, n_layers=2, d_ff=FF,
                             max_len=32, activation=activation, norm_first=norm_first,
                             final_norm=True, dropout=0.0, **kw)


def layer_map(prefix: str, ref_prefix: str, cross: bool) -> dict[str, str]:
    """Our parameter names of one block -> torch's."""
    names = {"self_attn.attn": "self_attn", "res_attn.norm": "norm1",
             "ff.ffn.fc_in": "linear1", "ff.ffn.fc_out": "linear2"}
    if cross:
        names.update({"cross_attn.attn": "multihead_attn", "res_cross.norm": "norm2",
                      "res_ff.norm": "norm3"})
    else:
        names["res_ff.norm"] = "norm2"
    return {f"{prefix}.{ours}": f"{ref_prefix}.{theirs}" for ours, theirs in names.items()}


def copy_into(reference: nn.Module, ours: dict[str, torch.Tensor], mapping: dict[str, str]):
    """Load ``ours`` into ``reference`` through the name prefixes of ``mapping``; every
    reference parameter must be set exactly once."""
    target = {}
    for key, value in ours.items():
        for src, dst in mapping.items():
            if key.startswith(src + "."):
                target[dst + key[len(src):]] = value
    reference.load_state_dict(target, strict=True)


def stack_map(ours: str, theirs: str, n: int, cross: bool) -> dict[str, str]:
    mapping = {f"{ours}.stack.final_norm": f"{theirs}.norm"}
    for i in range(n):
        mapping.update(layer_map(f"{ours}.stack.blocks.{i}", f"{theirs}.layers.{i}", cross))
    return mapping


def reference_transformer(activation: str, norm_first: bool) -> nn.Transformer:
    return nn.Transformer(D, H, 2, 2, FF, dropout=0.0, activation=activation, batch_first=True,
                          norm_first=norm_first).double().eval()


CASES = [("relu", False), ("gelu", False), ("relu", True), ("gelu", True)]


@pytest.mark.parametrize(("activation", "norm_first"), CASES)
def test_encoder_equals_torch_transformer_encoder(activation, norm_first):
    torch.manual_seed(0)
    enc = TransformerEncoder(config(activation, norm_first, embed_scale=True)).double().eval()
    layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first)
    ref = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D), enable_nested_tensor=False)
    ref = ref.double().eval()
    copy_into(ref, enc.state_dict(), {k.removeprefix("enc."): v.removeprefix("ref.")
                                      for k, v in stack_map("enc", "ref", 2, False).items()})
    ids = torch.randint(0, V, (3, 9), generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, 6:] = pad[2, 4:] = True  # right padding: real tokens keep positions 0, 1, ...
    got, _ = enc(ids, pad)
    x = enc.embed.tokens.weight[ids] * math.sqrt(D) + sinusoids(9, D)
    want = ref(x, src_key_padding_mask=pad)
    real = ~pad
    torch.testing.assert_close(got[real], want[real], **TOL)


class Reference(nn.Module):
    """Embedding + sinusoids + ``torch.nn.Transformer`` + tied readout with a bias."""

    def __init__(self, model: Seq2SeqTransformer, activation: str, norm_first: bool) -> None:
        super().__init__()
        self.model = model
        self.transformer = reference_transformer(activation, norm_first)
        mapping = {**stack_map("encoder", "encoder", 2, False),
                   **stack_map("decoder", "decoder", 2, True)}
        copy_into(self.transformer, model.state_dict(), mapping)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.encoder.embed.tokens.weight[ids] + sinusoids(ids.shape[1], D)

    def forward(self, src, tgt, src_pad):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=torch.float64)
        h = self.transformer(self.embed(src), self.embed(tgt), tgt_mask=causal,
                             src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad,
                             tgt_is_causal=True)
        return F.linear(h, self.model.head.proj.weight, self.model.head.proj.bias)


def seq2seq(activation: str, norm_first: bool) -> Seq2SeqTransformer:
    """A model whose decoding depends on the source: with the default init (std 0.02) the logit
    bias decides every argmax, and all rows decode to one repeated token."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(config(activation, norm_first, logit_bias=True)).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:  # fan-in scale; sharper attention; unit (tied) embeddings
                p.normal_(std=(3.0 if "in_proj" in name else 1.0) / math.sqrt(p.shape[1]))
        model.encoder.embed.tokens.weight.normal_()
        model.head.proj.bias.normal_(std=0.1)
    return model


def sources(seed: int = 2):
    src = torch.randint(2, V, (3, 8), generator=torch.Generator().manual_seed(seed))
    pad = torch.zeros(3, 8, dtype=torch.bool)
    pad[0, 5:] = pad[2, 7:] = True
    return src, pad


@pytest.mark.parametrize(("activation", "norm_first"), CASES)
def test_seq2seq_logits_equal_torch_transformer(activation, norm_first):
    model = seq2seq(activation, norm_first)
    ref = Reference(model, activation, norm_first)
    src, pad = sources()
    tgt = torch.randint(0, V, (3, 6), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(model(src, tgt, pad), ref(src, tgt, pad), **TOL)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize(("activation", "norm_first"), CASES)
def test_greedy_decoding_equals_argmax_over_torch_transformer(activation, norm_first,
                                                              use_cache):
    model = seq2seq(activation, norm_first)
    ref = Reference(model, activation, norm_first)
    decoded = set()
    for seed in (4, 5):
        src, pad = sources(seed)
        out = model.generate(src, 7, bos_token_id=1, src_key_padding_mask=pad,
                             use_cache=use_cache)
        ids = torch.ones(3, 1, dtype=torch.long)
        with torch.no_grad():
            for _ in range(7):
                nxt = ref(src, ids, pad)[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], dim=1)
        assert torch.equal(out, ids)
        decoded |= {tuple(row) for row in ids.tolist()}
    assert len(decoded) >= 4  # the outputs depend on the source: the check is not vacuous


def reference_beam(ref: Reference, src, pad, k: int, steps: int) -> torch.Tensor:
    """Beam search without EOS: each row keeps the k prefixes of highest summed log-prob."""
    rows = []
    for b in range(src.shape[0]):
        beams = [(0.0, [1])]
        for _ in range(steps):
            seqs = torch.tensor([seq for _, seq in beams])
            n = len(beams)
            with torch.no_grad():
                logp = F.log_softmax(ref(src[b:b + 1].expand(n, -1), seqs,
                                         pad[b:b + 1].expand(n, -1))[:, -1], dim=-1)
            cands = [(score + float(logp[i, v]), [*seq, v])
                     for i, (score, seq) in enumerate(beams) for v in range(V)]
            beams = sorted(cands, key=lambda c: -c[0])[:k]
        rows.append(beams[0][1])
    return torch.tensor(rows)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize(("activation", "norm_first"), CASES)
def test_beam_search_equals_reference_beam_over_torch_transformer(activation, norm_first,
                                                                  use_cache):
    model = seq2seq(activation, norm_first)
    ref = Reference(model, activation, norm_first)
    src, pad = sources(4)
    out = model.generate(src, 5, bos_token_id=1, src_key_padding_mask=pad, num_beams=3,
                         use_cache=use_cache)
    assert torch.equal(out, reference_beam(ref, src, pad, 3, 5))


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_grafted_seq2seq_starts_from_torch_transformer(grading):
    from graded.interop import graft_grading

    model = seq2seq("gelu", False)
    ref = Reference(model, "gelu", False)
    graded = graft_grading(model, grading, learnable_grades=True)
    assert type(graded) is Seq2SeqTransformer
    src, pad = sources()
    tgt = torch.randint(0, V, (3, 6), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(graded(src, tgt, pad), ref(src, tgt, pad), **TOL)
