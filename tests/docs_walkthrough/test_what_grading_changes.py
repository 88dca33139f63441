"""docs/what_grading_changes.md: the `multi_head` variant (one grade tuple per head, 000 Def
5.22) is a reparametrisation too, as the document's table says of graded scores per head.

tests/transformer/test_reparametrisation.py folds the variants whose heads share one tuple;
here each head of each layer gets its own fixed grades, and the ungraded twin is built by hand
from the grades alone (m_h = λ^{q_h} or q_h + 1): the rows of head h of W_Q and b_Q scaled by
m_h. Only attention is graded, so the twin differs from the model in those rows alone.
"""

import pytest
import torch

from graded import TransformerConfig
from graded.transformer.models import TransformerLM

D_MODEL, HEADS, BASE = 8, 2, 1.7


def by_hand(grades: torch.Tensor, grading: str) -> torch.Tensor:
    return BASE ** grades if grading == "exponential" else grades + 1.0


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_multi_head_graded_lm_equals_an_ungraded_lm_with_each_heads_query_rows_rescaled(grading):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=13, d_model=D_MODEL, n_heads=HEADS, n_layers=2,
                            max_len=12, dropout=0.0, grading=grading, grading_base=BASE,
                            grade_attention_variant="multi_head", grade_input=False,
                            grade_positions=False, grade_ffn=False, grade_output=False)
    model = TransformerLM(cfg).double().eval()
    head_grades = {}
    for name, buf in model.named_buffers():
        if name.endswith("attn.grading.grades"):
            assert buf.shape == (HEADS, D_MODEL // HEADS), (name, buf.shape)
            buf.copy_(torch.rand(buf.shape, dtype=buf.dtype) * 2)  # a distinct tuple per head
            head_grades[name.removesuffix(".grading.grades")] = buf.clone()
    assert len(head_grades) == cfg.n_layers

    twin = TransformerLM(cfg.model_copy(update={"grading": None})).double().eval()
    state = {k: v.detach().clone() for k, v in model.named_parameters(remove_duplicate=False)}
    for layer, grades in head_grades.items():
        m = by_hand(grades, grading).reshape(-1)  # head h's rows h·d_h … (h+1)·d_h − 1
        for suffix, scale in (("in_proj_weight", m[:, None]), ("in_proj_bias", m)):
            w = state[f"{layer}.{suffix}"]
            state[f"{layer}.{suffix}"] = torch.cat([w[:D_MODEL] * scale, w[D_MODEL:]])
    missing, unexpected = twin.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)

    ids = torch.randint(0, 13, (3, 10))
    torch.testing.assert_close(model(ids), twin(ids), rtol=0, atol=1e-10)
    # the per-head grading acts: the same weights unscaled give other logits
    plain = TransformerLM(cfg.model_copy(update={"grading": None})).double().eval()
    plain.load_state_dict(dict(model.named_parameters()), strict=False)
    assert (model(ids) - plain(ids)).abs().max() > 1e-3
