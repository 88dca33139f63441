"""The per-call switches of the attention modules (``need_weights``, ``average_attn_weights``,
``is_causal`` of ``forward``; ``need_weights``, ``is_causal`` of ``attend``) take True or
False only, as the constructors' switches do: torch reads them truthily, so
``need_weights="no"`` would return the weights. A bool takes the path it always took (the same
outputs as torch's module), also under ``torch.compile`` without a graph break."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graded.attention.graded import GradedMultiheadAttention
from graded.attention.multihead import MultiheadAttention

BAD = ["no", 1, 0, None, torch.tensor(True)]
SWITCHES = ["need_weights", "average_attn_weights", "is_causal"]


def _modules():
    torch.manual_seed(0)
    return [MultiheadAttention(8, 2, batch_first=True),
            GradedMultiheadAttention(8, 2, grading="exponential", grades=[0.0, 1.0, 2.0, 3.0],
                                     batch_first=True)]


@pytest.mark.parametrize("switch", SWITCHES)
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_forward_refuses_a_switch_that_is_not_a_bool(switch, value):
    x = torch.randn(2, 3, 8)
    for m in _modules():
        with pytest.raises(TypeError, match=rf"^{switch} must be True or False, got "):
            m(x, x, x, **{switch: value})


@pytest.mark.parametrize("switch", ["need_weights", "is_causal"])
def test_attend_refuses_a_switch_that_is_not_a_bool(switch):
    m = _modules()[0]
    q, k, v = m.project(*(torch.randn(2, 3, 8),) * 3)
    with pytest.raises(TypeError, match=rf"^{switch} must be True or False, got 'yes' \(str\)$"):
        m.attend(q, k, v, **{switch: "yes"})


def test_bool_switches_agree_with_torch_and_numpy_bools_are_taken():
    torch.manual_seed(1)
    ours = MultiheadAttention(8, 2, batch_first=True).eval()
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 4, 8)
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
    for need, average, causal in [(True, True, False), (True, False, True), (False, True, True)]:
        kwargs = {"need_weights": need, "average_attn_weights": average, "is_causal": causal,
                  "attn_mask": mask if causal else None}
        out, w = ours(x, x, x, **kwargs)
        out_np, w_np = ours(x, x, x, **{**kwargs, "need_weights": np.bool_(need),
                                        "average_attn_weights": np.bool_(average),
                                        "is_causal": np.bool_(causal)})
        out_ref, w_ref = ref(x, x, x, **kwargs)
        torch.testing.assert_close(out, out_ref)
        torch.testing.assert_close(out_np, out_ref)
        assert (w is None) == (w_ref is None) == (w_np is None) == (not need)
        if need:
            torch.testing.assert_close(w, w_ref)
            torch.testing.assert_close(w_np, w_ref)


def test_the_checks_break_no_graph_under_torch_compile():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = GradedMultiheadAttention(8, 2, grading="exponential",
                                                 grades=[0.0, 1.0, 2.0, 3.0], batch_first=True)

        def forward(self, x):
            out, w = self.attn(x, x, x, need_weights=True, average_attn_weights=False,
                               is_causal=False)
            return out + w.sum()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(Tiny().eval())(torch.randn(2, 5, 8))
    assert explained.graph_break_count == 0, explained.break_reasons
