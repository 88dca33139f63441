"""A kernel backend (linear, performer) never forms the attention weights, so it cannot apply
attention dropout: a module or model built with both is refused when it is built, not at its
first training step (an LM with dropout 0.1 and attn_backend="performer" built, evaluated and
wrote its run folder before failing)."""

import pytest
import torch

from graded.attention import MultiheadAttention
from graded.attention.backends import get_backend
from graded.transformer import TransformerConfig, TransformerLM

MESSAGE = (r"{} backend never materialises attention weights, so attention dropout "
           r"\(dropout_p=0.1\) cannot be applied")


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_a_kernel_backend_with_attention_dropout_is_refused_when_built(name):
    with pytest.raises(ValueError, match=MESSAGE.format(name)):
        MultiheadAttention(8, 2, dropout=0.1, backend=name)
    with pytest.raises(ValueError, match=MESSAGE.format(name)):
        MultiheadAttention(8, 2, dropout=0.1, backend=get_backend(name))
    with pytest.raises(ValueError, match=MESSAGE.format(name)):
        TransformerLM(TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1,
                                        max_len=8, dropout=0.1, attn_backend=name))


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_a_kernel_backend_builds_without_dropout_or_when_told_to_ignore_it(name):
    torch.manual_seed(0)
    seed = {"seed": 0} if name == "performer" else {}  # the same random features in both
    ignoring = MultiheadAttention(8, 2, dropout=0.1, batch_first=True, backend=name,
                                  backend_options={"ignore_dropout": True, **seed})
    plain = MultiheadAttention(8, 2, batch_first=True, backend=name, backend_options=seed)
    plain.load_state_dict(ignoring.state_dict())
    x = torch.randn(2, 5, 8)
    ignoring.train()
    plain.train()
    out_ignoring, _ = ignoring(x, x, x, need_weights=False)
    out_plain, _ = plain(x, x, x, need_weights=False)
    torch.testing.assert_close(out_ignoring, out_plain, rtol=0, atol=0)
    config = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, max_len=8,
                               dropout=0.1, attn_dropout=0.0, attn_backend=name)
    assert TransformerLM(config)(torch.randint(0, 11, (2, 6))).shape == (2, 6, 11)
