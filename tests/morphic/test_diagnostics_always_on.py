"""The routing support of ``diagnostics.routing_sparsity`` counts the edges the router chooses:
an always-on block (``Router.always_on``, α ≡ 1) is no choice, and the routing entropy already
leaves it out. Counted, it added 1 to every token's #{α > ε} and put its whole mass of 1 into
the smallest set holding 90% of the mass. And a calibration of no probability, or of values that
are not probabilities, is refused rather than reported."""

import pytest
import torch

from graded.morphic import (
    EdgeSet,
    FFNBlock,
    GradedStateSpace,
    LinearBlock,
    MorphicLayer,
    MorphicTransformer,
)
from graded.morphic.diagnostics import collect, routing_sparsity, write_report


def test_routing_sparsity_leaves_out_always_on_columns_as_hand_counted():
    # column 1 is an always-on block (1 at every token); the routed edges are columns 0 and 2
    probs = torch.tensor([[0.6, 1.0, 0.3], [0.1, 1.0, 0.05], [0.0, 1.0, 0.0]])
    entropy = torch.tensor([0.5, 0.25, 0.0])
    out = routing_sparsity(probs, entropy, eps=0.2, always_on=[1])
    # #{p > 0.2} over columns 0, 2: 2, 0, 0; 90% of the routed mass: {0.6, 0.3} = 2 edges,
    # 0.1 of 0.15 < 0.9 so both = 2, no mass = 0
    assert out["support_eps"] == pytest.approx((2 + 0 + 0) / 3)
    assert out["support_90"] == pytest.approx((2 + 2 + 0) / 3)
    assert out["always_on"] == 1 and out["entropy"] == pytest.approx(0.25)


def test_routing_sparsity_refuses_always_on_positions_past_the_edges():
    with pytest.raises(ValueError, match=r"edge positions in \[0, 3\)"):
        routing_sparsity(torch.ones(2, 3), torch.zeros(2), always_on=[3])


def _model():
    torch.manual_seed(0)
    sp = GradedStateSpace({"g0": 4, "g1": 4})
    es = EdgeSet.explicit(sp, [("g0", "g1", "a"), ("g1", "g1", "b"), ("g1", "g0", "keep")])
    layer = MorphicLayer(sp, es, [LinearBlock(4, 4), FFNBlock(4, 4, 8), LinearBlock(4, 4)],
                         router={"rank": 4, "stay": False})
    return MorphicTransformer(sp, [layer], vocab_size=7, max_len=8)


def test_the_report_counts_the_support_of_the_routed_edges(tmp_path):
    model = _model()
    assert model.layers[0].router.always_on == [2]  # "keep": the only edge into g0
    ids = torch.randint(0, 7, (2, 6), generator=torch.Generator().manual_seed(1))
    batches = [(ids, torch.roll(ids, -1, 1))]
    probs = collect(model, batches)[0]["context_probs"]
    routed = probs[:, :2]  # the two edges into g1
    report = write_report(model, batches, tmp_path)
    routing = report["layers"][0]["routing"]
    assert routing["support_eps"] == pytest.approx(float((routed > 0.05).float().sum(-1).mean()))
    assert routing["support_eps"] <= 2 and routing["always_on"] == 1


def test_calibration_refuses_no_probability_and_values_that_are_not_probabilities():
    """The ECE of no token was reported as 0.0 (a perfect calibration); a probability of 1.5
    or NaN was binned as if it were one."""
    from graded.morphic.diagnostics import calibration

    with pytest.raises(ValueError, match="at least one routing probability, got none"):
        calibration(torch.tensor([]), torch.tensor([]))
    for bad in (1.5, -0.25, float("nan")):
        with pytest.raises(ValueError, match=r"probabilities in \[0, 1\], got .* at entry 1"):
            calibration(torch.tensor([0.5, bad]), torch.tensor([True, False]))
    with pytest.raises(ValueError, match=r"0/1 .* got 2.0"):
        calibration(torch.tensor([0.5, 0.25]), torch.tensor([1.0, 2.0]))
    # by hand: two equal-count bins {0.1, 0.2} and {0.7, 0.9} with outcomes {0, 1} and {1, 1}
    out = calibration(torch.tensor([0.9, 0.1, 0.7, 0.2]), torch.tensor([1, 0, 1, 1]), bins=2)
    assert out["ece"] == pytest.approx(0.5 * abs(0.15 - 0.5) + 0.5 * abs(0.8 - 1.0))
