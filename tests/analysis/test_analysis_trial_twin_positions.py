"""The ungraded twin of a model that normalises its graded positions (000 Eq. 48,
``grade_position_normalize``) is the ungraded model with the same weights: z/‖z‖ goes with
the graded positions."""

from __future__ import annotations

import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import model_lipschitz, ungraded_twin


def test_twin_of_a_model_with_normalised_graded_positions_equals_the_ungraded_model():
    torch.manual_seed(0)
    graded = TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                       grade_init_value=0.3, grade_position_alpha=0.1,
                                       grade_position_normalize=True)).eval()
    plain = TransformerLM(tiny_config()).eval()
    missing, unexpected = plain.load_state_dict(graded.state_dict(), strict=False)
    assert not missing and all("grad" in k for k in unexpected)
    tokens = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(ungraded_twin(graded)(tokens), plain(tokens), atol=1e-6)
    # the Lipschitz comparison's "ungraded" side is that plain model
    twin_side = model_lipschitz(graded, tokens, n_random=2, steps=0)["ungraded/estimate"]
    plain_side = model_lipschitz(plain, tokens, compare_ungraded=False, n_random=2,
                                 steps=0)["graded/estimate"]
    assert abs(twin_side - plain_side) < 1e-5 * plain_side
