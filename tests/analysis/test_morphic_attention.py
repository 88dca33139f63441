"""The attention diagnostics on a morphic model, whose attention is the grade-typed block of
004 §2.1.1 (``GradeTypedAttention``, on the fused kernel: no weights returned). They used to
return ``{}`` for it, silently; a model with no attention at all now gets an error naming it."""

import math

import pytest
import torch
from torch import nn

from graded.analysis import (
    attention_maps,
    attention_rank,
    capture_attention,
    diagnose,
    head_diversity,
)
from graded.morphic import (
    BandedBlocks,
    EdgeSet,
    FFNBlock,
    Grade,
    GradedStateSpace,
    GradeTypedAttention,
    MorphicLayer,
    MorphicTransformer,
)


def morphic_model(mode="soft", identity_values=False):
    torch.manual_seed(0)
    sp = GradedStateSpace([Grade("g0", 4, 0), Grade("g1", 4, 1), Grade("g2", 4, 2)])
    bb = BandedBlocks(sp, [0, 1])
    first = MorphicLayer(sp, bb.edge_set, bb, router={"rank": 4, "mode": mode})
    es = EdgeSet.explicit(sp, [("g0", "g2", "att"), ("g1", "g1", "ffn")])
    attention = GradeTypedAttention(4, 4, num_heads=2, head_dim=3, value_source="source",
                                    identity_values=identity_values)
    second = MorphicLayer(sp, es, [attention, FFNBlock(4, 4, 8)],
                          router={"rank": 4, "mode": mode})
    return MorphicTransformer(sp, [first, second], vocab_size=9, max_len=16).eval()


def ids(seed=0, shape=(3, 7)):
    return torch.randint(0, 9, shape, generator=torch.Generator().manual_seed(seed))


def _block_inputs_and_output(model, x):
    """The (x_src, x_dst) and output of the model's grade-typed attention, by a hook of the
    test's own."""
    seen = {}
    block = model.layers[1].blocks[0]
    handle = block.register_forward_hook(
        lambda _m, args, out: seen.update(src=args[0], dst=args[1], out=out))
    with torch.no_grad():
        model(x)
    handle.remove()
    return block, seen


def _naive_weights(q, k):
    """softmax_s(⟨q_t, k_s⟩/√d) over s ≤ t, one query row at a time, (B, H, T, T)."""
    b, h, t, d = q.shape
    out = torch.zeros(b, h, t, t, dtype=torch.float64)
    for i in range(b):
        for a in range(h):
            for r in range(t):
                scores = [float(q[i, a, r] @ k[i, a, s]) / math.sqrt(d) for s in range(r + 1)]
                top = max(scores)
                e = [math.exp(x - top) for x in scores]
                for s in range(r + 1):
                    out[i, a, r, s] = e[s] / sum(e)
    return out


def test_attention_maps_of_a_morphic_model_are_the_causal_softmax_of_its_block_by_hand():
    model = morphic_model()
    x = ids()
    block, seen = _block_inputs_and_output(model, x)
    b, t, _ = seen["src"].shape
    q = block.q(seen["src"]).view(b, t, 2, 3).transpose(1, 2).detach().double()
    k = block.k(seen["dst"]).view(b, t, 2, 3).transpose(1, 2).detach().double()
    maps = attention_maps(model, x)
    assert list(maps) == ["layers.1.blocks.0"]
    torch.testing.assert_close(maps["layers.1.blocks.0"].double(), _naive_weights(q, k),
                               atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("identity_values", [False, True])
def test_recorded_heads_give_back_the_output_of_the_fused_kernel(identity_values):
    """Σ_s A_ts v_s per head, through the block's output projection (or the head mean of
    ``identity_values``), is what the block returned."""
    model = morphic_model(identity_values=identity_values)
    x = ids(1)
    block, seen = _block_inputs_and_output(model, x)
    with torch.no_grad(), capture_attention(model) as calls:
        model(x)
    (call,) = calls
    assert call.module is block and call.is_causal
    heads = call.heads  # (B, H, T, dv)
    out = (heads.mean(dim=1) if identity_values
           else block.out(heads.transpose(1, 2).flatten(-2)))
    torch.testing.assert_close(out, seen["out"], atol=1e-6, rtol=1e-5)


def test_head_diversity_and_rank_of_a_padded_morphic_batch_read_the_real_queries_only():
    """A right-padded sequence gets the numbers it gets alone: the model's key_padding_mask
    marks the block's padded queries."""
    model = morphic_model()
    alone = ids(2, (1, 5))
    padded = torch.cat([alone, torch.zeros(1, 2, dtype=torch.long)], dim=1)
    mask = torch.tensor([[False] * 5 + [True] * 2])
    key = "layers.1.blocks.0"
    want, got = head_diversity(model, alone)[key], head_diversity(model, padded,
                                                                   key_padding_mask=mask)[key]
    torch.testing.assert_close(got["js_matrix"], want["js_matrix"], atol=1e-9, rtol=1e-6)
    assert got["effective_rank"] == pytest.approx(want["effective_rank"], rel=1e-6)
    rank_alone = attention_rank(model, alone)[key].to_dict()
    rank_padded = attention_rank(model, padded, key_padding_mask=mask)[key].to_dict()
    assert rank_padded == pytest.approx(rank_alone, rel=1e-6)


def test_diagnose_reads_a_morphic_model_and_notes_the_lipschitz_estimate_it_cannot_make():
    report = diagnose(morphic_model(), ids())
    assert report.metrics["entropy/mean"] > 0
    assert "rank/attention/graded/effective_rank" in report.metrics
    assert "heads/mean_js" in report.metrics
    assert not any(key.startswith("lipschitz/") for key in report.metrics)
    assert "MorphicTransformer" in report.notes["lipschitz"]


class NoAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(9, 4), nn.Linear(4, 9)

    def forward(self, x):
        return self.out(self.embed(x))


@pytest.mark.parametrize("diagnostic", [attention_maps, attention_rank, head_diversity, diagnose])
def test_a_model_without_attention_is_refused_naming_its_class(diagnostic):
    with pytest.raises(ValueError, match=r"needs a model with attention layers: NoAttention "
                                         r"made no attention call on these inputs \(it has "
                                         r"no attention layer\).*GradeTypedAttention"):
        diagnostic(NoAttention(), ids())


def test_a_morphic_attention_block_that_no_token_is_routed_to_is_named():
    """Hard routing runs a block only for the tokens routed to it: with the attention edge
    disabled it never runs, and the error says so instead of returning {}."""
    model = morphic_model(mode="hard")
    model.layers[1].disabled = {0}
    with pytest.raises(ValueError, match=r"layers\.1\.blocks\.0'\] did not run"):
        attention_maps(model, ids())


def test_diagnose_notes_why_a_morphic_model_has_no_rollout():
    report = diagnose(morphic_model(), ids())
    assert "rollout/entropy" not in report.metrics
    assert "MorphicTransformer has 0 graded.transformer stacks" in report.notes["rollout/entropy"]
