"""Every backend × model feature either works (and equals attention written out pair by pair)
or is refused with a message naming the backend, the feature and the backends that can serve
it. The table in docs/efficient_attention.md is checked against the same declarations."""

import copy
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from backend_options import OPTIONS, T  # tests/ is on the path (conftest.py)
from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.attention import MultiheadAttention
from graded.attention.backends import (
    FEATURES,
    Capabilities,
    available_backends,
    backend_capabilities,
    backends_supporting,
    chunked_attention,
    get_backend,
)
from graded.attention.scores import make_score
from graded.transformer.models import TransformerEncoder

# feature of the docs table -> the capability it needs (None: every backend serves it)
COLUMNS = {
    "encoder": None,
    "causal LM": "causal",
    "generation with cache": "incremental",
    "seq2seq cross-attention": "cross_attention",
    "padding": "key_padding_mask",
    "ALiBi": "attn_bias",
    "custom score": "custom_score",
    "attention weights": "attention_weights",
}
KIND = {"linear": "linear", "performer": "performer", "lsh": "lsh", "linformer": "linformer"}


def _feature_map(kind: str, x: torch.Tensor, src: nn.Module | None) -> torch.Tensor:
    if kind == "linear":  # Katharopoulos et al. 2020: φ(x) = elu(x) + 1
        return F.elu(x) + 1
    d = x.shape[-1]
    x = x * d ** -0.25  # FAVOR+: exp(ωᵀx' − ‖x'‖²/2)/√m with x' = x·(1/√D)^{1/2}
    omega = src.omega.to(x.dtype)
    return torch.exp(x @ omega.T - 0.5 * (x * x).sum(-1, keepdim=True)) / omega.shape[0] ** 0.5


class Reference(nn.Module):
    """Attention written out query by query: the admissible keys of each query listed, then
    softmax(score + bias) over them (or the kernel / LSH rule the backend approximates with)."""

    capabilities = Capabilities(causal=True, cross_attention=True, key_padding_mask=True,
                                attn_bias=True, custom_score=True, attention_weights=True,
                                incremental=True)

    def __init__(self, kind: str, src: nn.Module | None) -> None:
        super().__init__()
        self.kind, self.src = kind, src

    def forward(self, q, k, v, **kw):
        return self.forward_with_weights(q, k, v, **kw)[0]

    def forward_with_weights(self, q, k, v, *, key_padding_mask=None, attn_mask=None,
                             is_causal=False, dropout_p=0.0, score=None):
        b_, h_, tq, d = q.shape
        tk = k.shape[2]
        out = q.new_zeros(b_, h_, tq, v.shape[-1])
        weights = q.new_zeros(b_, h_, tq, tk)
        full = score(q, k) if score is not None else q @ k.transpose(-2, -1) / d ** 0.5
        for b in range(b_):
            for h in range(h_):
                for i in range(tq):
                    keys = []
                    for j in range(tk):
                        if key_padding_mask is not None and key_padding_mask[b, j] \
                                and self.kind != "linformer":
                            continue
                        if is_causal and j > tk - tq + i:
                            continue
                        keys.append(j)
                    if self.kind == "lsh" and len(keys) > 1:  # no attention to oneself
                        keys = [j for j in keys if j != tk - tq + i] or keys
                    if not keys:
                        continue
                    kk, vv = k[b, h, keys], v[b, h, keys]
                    if self.kind == "linformer" and key_padding_mask is not None:
                        zero = key_padding_mask[b, keys][:, None]  # padded k, v zeroed
                        kk, vv = kk.masked_fill(zero, 0.0), vv.masked_fill(zero, 0.0)
                    if self.kind in ("linear", "performer"):
                        w = (_feature_map(self.kind, kk, self.src)
                             @ _feature_map(self.kind, q[b, h, i], self.src))
                        w = w / w.sum()
                    else:
                        if self.kind == "lsh":
                            s = kk / kk.norm(dim=-1, keepdim=True) @ q[b, h, i] / d ** 0.5
                        elif self.kind == "linformer":
                            s = kk @ q[b, h, i] / d ** 0.5
                        else:
                            s = full[b, h, i, keys]
                        if attn_mask is not None:
                            s = s + attn_mask.expand(b_, h_, tq, tk)[b, h, i, keys]
                        w = torch.softmax(s, dim=0)
                    out[b, h, i] = w @ vv
                    weights[b, h, i, keys] = w
        return out, weights


def with_reference(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose every attention runs :class:`Reference`."""
    ref = copy.deepcopy(model)
    for m in ref.modules():
        if isinstance(m, MultiheadAttention):
            m.backend = Reference(KIND.get(m.backend_name, "softmax"), m.backend)
    return ref


def config(name: str, **kw) -> TransformerConfig:
    base = dict(vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_len=3 * T,
                attn_backend=name, attn_backend_options=OPTIONS[name])
    return TransformerConfig(**{**base, **kw})


def build(cls, cfg):
    torch.manual_seed(0)
    model = cls(cfg).double().eval()
    for m in model.modules():  # linformer: E = F = I makes the projection exact
        if getattr(m, "name", "") == "linformer":
            with torch.no_grad():
                m.E.copy_(torch.eye(T))
                m.F.copy_(torch.eye(T))
    return model


def ids(n: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 11, (2, n), generator=torch.Generator().manual_seed(seed))


def refused(feature: str, name: str):
    """The refusal names the backend, the feature and every backend that can serve it."""
    able = ", ".join(backends_supporting(feature))
    return pytest.raises(ValueError, match=re.escape(name) + ".*" + re.escape(able))


def check_column(name: str, column: str) -> None:
    """Works and equals :class:`Reference`, or is refused with the message."""
    feature = COLUMNS[column]
    works = feature is None or getattr(backend_capabilities(name), feature)
    if column in ("encoder", "padding"):
        enc = build(TransformerEncoder, config(name))
        pad = torch.zeros(2, T, dtype=torch.bool)
        pad[1, -3:] = column == "padding"
        got, _ = enc(ids(), pad if column == "padding" else None)
        want, _ = with_reference(enc)(ids(), pad if column == "padding" else None)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
        return
    if column == "causal LM" and not works:
        with refused("causal", name):
            TransformerLM(config(name))
        return
    if column == "causal LM":
        lm = build(TransformerLM, config(name))
        torch.testing.assert_close(lm(ids()), with_reference(lm)(ids()), rtol=1e-9, atol=1e-9)
        return
    if column == "generation with cache":
        if not backend_capabilities(name).causal:
            with refused("causal", name):
                TransformerLM(config(name))
            return
        lm = build(TransformerLM, config(name))
        prompt = ids(4)
        if not works:
            with refused("incremental", name):
                lm.generate(prompt, 4, use_cache=True)
            torch.testing.assert_close(lm.generate(prompt, 4, use_cache=False),
                                       with_reference(lm).generate(prompt, 4, use_cache=False))
            return
        torch.testing.assert_close(lm.generate(prompt, 4, use_cache=True),
                                   with_reference(lm).generate(prompt, 4, use_cache=False))
        return
    if column == "seq2seq cross-attention":
        cfg = config("full", cross_attn_backend=name, cross_attn_backend_options=OPTIONS[name])
        if not works:
            with refused("cross_attention", name):
                Seq2SeqTransformer(cfg)
            return
        s2s = build(Seq2SeqTransformer, cfg)
        src, tgt = ids(T, 2), ids(5, 3)
        torch.testing.assert_close(s2s(src, tgt), with_reference(s2s)(src, tgt), rtol=1e-9,
                                   atol=1e-9)
        return
    if column in ("ALiBi", "custom score"):
        kw = {"positional": "alibi"} if column == "ALiBi" else {"attn_score": "bilinear"}
        if not works:
            with refused(feature, name):
                config(name, **kw)
            return
        lm = build(TransformerLM, config(name, **kw))
        torch.testing.assert_close(lm(ids()), with_reference(lm)(ids()), rtol=1e-9, atol=1e-9)
        return
    assert column == "attention weights"
    enc = build(TransformerEncoder, config(name))
    if not works:
        with refused("attention_weights", name):
            enc(ids(), need_weights=True)
        return
    out, weights = enc(ids(), need_weights=True)
    want, want_weights = with_reference(enc)(ids(), need_weights=True)
    torch.testing.assert_close(out, enc(ids())[0], rtol=1e-12, atol=1e-12)  # same attention
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(torch.stack(weights), torch.stack(want_weights), rtol=1e-9,
                               atol=1e-9)


@pytest.mark.parametrize("column", list(COLUMNS))
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_feature_works_and_equals_the_written_out_attention_or_is_refused(name, column):
    check_column(name, column)


def test_options_cover_every_registered_backend():
    assert sorted(OPTIONS) == available_backends()


def test_each_backend_class_declares_its_own_capabilities():
    for name in available_backends():
        cls = type(get_backend(name, **OPTIONS[name]))
        assert isinstance(cls.__dict__.get("capabilities"), Capabilities), name


def _docs_table() -> dict[str, dict[str, str]]:
    text = (Path(__file__).parents[2] / "docs" / "efficient_attention.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    header = next(line for line in text.splitlines() if line.startswith("| backend |"))
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) == len(columns) + 1:
            table[cells[0].strip("`")] = dict(zip(columns, cells[1:], strict=True))
    return table


def test_docs_table_states_what_each_backend_declares_and_names_the_test():
    table = _docs_table()
    assert sorted(table) == available_backends()
    for name, row in table.items():
        assert list(row) == list(COLUMNS)
        for column, cell in row.items():
            feature = COLUMNS[column]
            works = feature is None or getattr(backend_capabilities(name), feature)
            if column == "generation with cache":
                works = works and backend_capabilities(name).causal
            if works:
                assert cell.startswith("works") and f"`{name}-{column}`" in cell, (name, column)
            else:
                assert cell.startswith("refused"), (name, column, cell)


def test_feature_names_are_the_capability_fields():
    assert set(FEATURES) == set(Capabilities.__dataclass_fields__)
    assert {f for f in COLUMNS.values() if f} <= set(FEATURES)


def _dense(q, k, v, s, pad, causal):
    keep = ~pad[:, None, None, :]
    if causal:
        keep = keep & torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(
            k.shape[2] - q.shape[2])
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("score_name", ["dot", "bilinear", "additive"])
def test_chunked_with_a_score_and_a_float_bias_equals_dense_and_trains_the_score(
        score_name, causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 4, dtype=torch.float64, requires_grad=True)
               for n in (5, 7, 7))
    score = make_score(score_name, 2, 4).double()
    bias = torch.randn(1, 2, 5, 7, dtype=torch.float64)  # e.g. ALiBi's −m·|i − j|
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, :2] = True
    got = chunked_attention(q, k, v, key_padding_mask=pad, attn_mask=bias, is_causal=causal,
                            query_chunk=2, key_chunk=3, score=score)
    want = _dense(q, k, v, score(q, k) + bias, pad, causal)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got.square().sum().backward()  # through the checkpointed chunks
    grad_q = torch.autograd.grad(want.square().sum(), q)[0]
    torch.testing.assert_close(q.grad, grad_q, rtol=1e-10, atol=1e-12)
    for p in score.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_lsh_key_projection_gets_gradient():
    torch.manual_seed(0)
    mha = MultiheadAttention(8, 2, batch_first=True, backend="lsh",
                             backend_options={"chunk_size": 4, "seed": 0})
    x = torch.randn(2, 8, 8)
    out, _ = mha(x, x, x, need_weights=False)
    out.square().sum().backward()
    key_rows = mha.in_proj_weight.grad[8:16]
    assert key_rows.abs().sum() > 0


def test_shared_qk_module_has_no_key_projection_and_equals_the_written_out_reformer_layer():
    """Reformer's shared-QK: one (2E, E) projection for queries and values, keys the
    (normalised) queries; every parameter is used."""
    torch.manual_seed(0)
    options = {"chunk_size": 4, "seed": 0, "shared_qk": True}
    mha = MultiheadAttention(8, 2, batch_first=True, backend="lsh", backend_options=options,
                             dtype=torch.float64)
    assert mha.in_proj_weight.shape == (16, 8) and mha.in_proj_bias.shape == (16,)
    x = torch.randn(2, 8, 8, dtype=torch.float64)
    out, weights = mha(x, x, x, need_weights=False)
    assert weights is None
    w_q, w_v = mha.in_proj_weight.split([8, 8])
    b_q, b_v = mha.in_proj_bias.split([8, 8])
    q = F.linear(x, w_q, b_q).unflatten(-1, (2, 4)).transpose(1, 2)
    v = F.linear(x, w_v, b_v).unflatten(-1, (2, 4)).transpose(1, 2)
    plain = get_backend("lsh", chunk_size=4, seed=0)  # keys given explicitly: the queries
    want = mha.out_proj(plain(q, q, v).transpose(1, 2).flatten(-2))
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    out.square().sum().backward()
    for name, p in mha.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    with pytest.raises(ValueError, match="the same tensor"):
        mha(x, x.clone(), x.clone(), need_weights=False)
    with pytest.raises(ValueError, match=r"shared_qk=True needs .*num_kv_heads=1"):
        MultiheadAttention(8, 2, backend="lsh", backend_options=options, num_kv_heads=1)


def test_a_shared_qk_lm_trains_and_generates_by_recomputation():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=2, max_len=32,
                            attn_backend="lsh",
                            attn_backend_options={"chunk_size": 4, "seed": 0, "shared_qk": True})
    lm = TransformerLM(cfg)
    ids = torch.randint(0, 11, (2, 12))
    F.cross_entropy(lm(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    assert all(p.grad is not None for p in lm.parameters())
    out = lm.generate(ids[:, :4], 3)
    assert torch.equal(out, lm.generate(ids[:, :4], 3, use_cache=False))
    with pytest.raises(ValueError, match="'lsh' cannot serve incremental decoding"):
        lm(ids[:, :4], cache=lm.new_cache())


def test_lsh_shared_qk_uses_normalised_queries_as_keys():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64) for _ in range(3))
    shared = get_backend("lsh", shared_qk=True, **OPTIONS["lsh"])
    plain = get_backend("lsh", **OPTIONS["lsh"])
    torch.testing.assert_close(shared(q, k, v), plain(q, q, v), rtol=1e-12, atol=1e-12)


def test_need_weights_on_a_backend_without_weights_raises_instead_of_falling_back():
    mha = MultiheadAttention(8, 2, batch_first=True, backend="sliding_window",
                             backend_options={"window": 2})
    x = torch.randn(1, 6, 8)
    with refused("attention_weights", "sliding_window"):
        mha(x, x, x)
    assert mha(x, x, x, need_weights=False)[1] is None


def test_seq2seq_with_a_pattern_self_backend_uses_full_cross_attention():
    cfg = config("sliding_window")
    assert cfg.cross_attn_backend == "full"
    s2s = build(Seq2SeqTransformer, cfg)
    src, tgt = ids(T, 2), ids(T, 3)
    torch.testing.assert_close(s2s(src, tgt), with_reference(s2s)(src, tgt), rtol=1e-9,
                               atol=1e-9)


def test_seq2seq_generation_with_cache_is_refused_on_a_cacheless_self_backend():
    s2s = build(Seq2SeqTransformer, config("lsh"))
    with refused("incremental", "lsh"):
        s2s.generate(ids(T, 2), 3, bos_token_id=1, use_cache=True)
    ref = with_reference(s2s)
    assert torch.equal(s2s.generate(ids(T, 2), 3, bos_token_id=1, use_cache=False),
                       ref.generate(ids(T, 2), 3, bos_token_id=1, use_cache=False))
