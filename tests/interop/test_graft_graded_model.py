"""``graft_grading`` of a model that is already graded: refused naming its grading, since the
grades it holds would be loaded as the new grading's (the same parameter names) and the result
would compute neither the neutral function ``graft_grading`` promises nor the model's own."""

import pytest
import torch

from graded import TransformerConfig, TransformerLM
from graded.grading import GradingMap
from graded.interop import graft_grading


def tiny_lm():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=13, d_model=16, n_heads=2, n_layers=2, max_len=16,
                            positional="learned")
    return TransformerLM(cfg).double().eval()


def test_grafting_onto_a_trained_lgt_is_refused_instead_of_reading_its_grades_as_egt():
    """Before, an LGT whose grades moved by 0.5 grafted as an EGT gave logits 1.3 away from
    the pretrained model's and 0.26 away from the LGT's; a second graft of the same grading
    with another option failed with a KeyError naming a grading parameter."""
    lm = tiny_lm()
    lgt = graft_grading(lm, "linear", learnable_grades=True)
    with torch.no_grad():
        for m in lgt.modules():
            if isinstance(m, GradingMap):
                m.grades.add_(0.5)
    ids = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(1))
    assert (lgt(ids) - lm(ids)).abs().max() > 0.1  # the grades do act
    for grading, options in (("exponential", {"learnable_grades": True}),
                             ("linear", {"learnable_grades": False}),
                             ("linear", {"learnable_grades": True})):
        with pytest.raises(ValueError, match=r"graft_grading: the model is already graded "
                           r"\(TransformerConfig.grading='linear'\); expected an ungraded"):
            graft_grading(lgt, grading, **options)
    # the ungraded model still grafts, neutral: the pretrained function to float64 rounding
    egt = graft_grading(lm, "exponential", learnable_grades=True)
    assert torch.allclose(egt(ids), lm(ids), atol=1e-12, rtol=0)
