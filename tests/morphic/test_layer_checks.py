"""A layer refuses blocks, routers and hyperparameters that would otherwise give a silently wrong
result, naming the bad value and what was expected."""

import math

import pytest
import torch

from graded.morphic import (
    EdgeSet,
    GradedStateSpace,
    MorphicLayer,
    MorphicTransformer,
    Router,
    masked_pair_softmax,
)
from graded.morphic.banded import ConjugatedBlocks
from graded.morphic.blocks import LinearBlock
from graded.morphic.tools import ArgmaxDecoder, ExternalTool, OneHotEncoder


def positive_refusal(name: str, bad: object) -> str:
    """The refusal of ``bad`` for a number > 0 by graded.checks.check_float, as a pattern:
    it names the option, the value and the range."""
    if isinstance(bad, str | bool):
        return rf"{name} must be a number > 0, got {bad!r} \({type(bad).__name__}\)"
    if not math.isfinite(bad):
        return rf"{name} must be a finite number, got {bad} \(expected > 0\)"
    return rf"{name} must be > 0, got {bad}"


def space_and_edges():
    sp = GradedStateSpace({"a": 4, "b": 3})
    return sp, EdgeSet.explicit(sp, [("a", "b", "e1"), ("b", "b", "e2")])


def test_a_block_whose_output_would_broadcast_is_refused_naming_edge_and_dims():
    """Without the check a (B, T, 1) output broadcast over d_b = 3 in the update and in
    δ = φ − z^{(b)}, and the layer returned a full-width state."""
    sp, es = space_and_edges()
    with pytest.raises(ValueError, match=r"edge 'e1' \(b <- a\): block LinearBlock maps 4 -> 1; "
                                         r"expected d_a = 4 -> d_b = 3"):
        MorphicLayer(sp, es, [LinearBlock(4, 1), LinearBlock(3, 3)])
    with pytest.raises(ValueError, match=r"maps 3 -> 3; expected d_a = 4"):
        MorphicLayer(sp, es, [LinearBlock(3, 3), LinearBlock(3, 3)])


@pytest.mark.parametrize("execution", ["dense", "sparse"])
def test_an_undeclared_block_with_the_wrong_output_width_is_refused_when_it_runs(execution):
    """A tool declares no dims; an encoder of width 1 into a grade of width 3 is caught on the
    first call, in dense and in sparse execution (where it runs on the routed rows only)."""
    sp, es = space_and_edges()
    tool = ExternalTool(lambda x: 0, decode=ArgmaxDecoder(), encode=OneHotEncoder(1))
    layer = MorphicLayer(sp, es, [tool, LinearBlock(3, 3)], execution=execution,
                         router={"mode": "hard", "stay": False})
    layer.disabled = {1}  # e1 is the only option left: every token is routed to the tool
    z = torch.randn(2, 5, sp.total_dim)
    with torch.no_grad(), pytest.raises(ValueError, match=r"edge 'e1' \(b <- a\): block "
                                        r"ExternalTool returned shape .*1\); expected .*3\)"):
        layer(z)


def test_a_router_built_for_other_edges_is_refused():
    """With the same number of edges the router's own groups were used silently: below, e2
    (b ← b) was normalised as a destination of its own, so the mass routed into b exceeded 1."""
    sp, es = space_and_edges()
    other = EdgeSet.explicit(sp, [("a", "b", "e1"), ("b", "a", "e2")])
    torch.manual_seed(0)
    router = Router(sp, other, init_std=0.5)
    z = torch.randn(2, 5, sp.total_dim)
    alpha = router.route(router.context_logits(z)).weights
    into_b = alpha[..., 0] + alpha[..., 1]  # by the layer's edges both enter b
    assert bool((into_b > 1).any())  # what the layer would have mixed: not a distribution
    with pytest.raises(ValueError, match=r"router was built for edges \[\('a', 'b', 'e1'\), "
                                         r"\('b', 'a', 'e2'\)\].*expected the layer's edges"):
        MorphicLayer(sp, es, [LinearBlock(4, 3), LinearBlock(3, 3)], router=router)
    MorphicLayer(sp, es, [LinearBlock(4, 3), LinearBlock(3, 3)], router=Router(sp, es))


def test_gumbel_routing_at_a_negative_temperature_would_pick_the_least_likely_option():
    """Why gumbel_temperature ≤ 0 is refused: softmax((x + g)/T) with T < 0 has its argmax at
    the smallest perturbed logit (checked by hand here), and T = 0 divides by zero."""
    x = torch.tensor([3.0, -3.0, 0.0])  # two edges and the stay option
    g = -torch.empty(200, 3).exponential_(generator=torch.Generator().manual_seed(0)).log()
    picks = torch.softmax((x + g) / -1.0, dim=-1).argmax(-1)
    assert float((picks == 1).float().mean()) > 0.5  # the edge of probability ≈ 0.002
    sp, es = space_and_edges()
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match=positive_refusal("gumbel_temperature", bad)):
            Router(sp, es, mode="gumbel", gumbel_temperature=bad)
        with pytest.raises(ValueError, match=positive_refusal("temperature", bad)):
            Router(sp, es, temperature=bad)


@pytest.mark.parametrize("name", ["beta", "eta"])
@pytest.mark.parametrize("bad", [0.0, -0.5, math.nan, math.inf, -math.inf, "2", True])
def test_layer_step_and_utility_scale_must_be_finite_and_positive(name, bad):
    sp, es = space_and_edges()
    with pytest.raises(ValueError, match=positive_refusal(name, bad)):
        MorphicLayer(sp, es, [LinearBlock(4, 3), LinearBlock(3, 3)], **{name: bad})


def test_temperatures_and_steps_may_be_0d_tensors_and_are_kept_as_floats():
    sp, es = space_and_edges()
    router = Router(sp, es, temperature=torch.tensor(0.5))
    assert router.temperature == 0.5 and type(router.temperature) is float
    layer = MorphicLayer(sp, es, [LinearBlock(4, 3), LinearBlock(3, 3)],
                         beta=torch.tensor(2.0, dtype=torch.float64))
    assert layer.beta == 2.0
    with pytest.raises(ValueError, match=r"temperature must be > 0, got -1\.0"):
        Router(sp, es, temperature=torch.tensor(-1.0))
    with pytest.raises(ValueError, match=r"temperature must be a number > 0, got tensor"):
        Router(sp, es, temperature=torch.tensor([0.5, 0.5]))


def test_conjugated_blocks_refuse_a_nan_base():
    sp = GradedStateSpace([("g0", 2, 0), ("g1", 2, 1)])
    with pytest.raises(ValueError, match=positive_refusal("base λ", math.nan)):
        ConjugatedBlocks(sp, [1], base=math.nan)


def test_a_layer_over_grades_of_other_dims_is_refused_by_the_model_and_its_edges_by_the_layer():
    """Same labels and total width, swapped dims: the layer's slices (a = columns 0..2) are not
    the model's (a = columns 0..3), so the layer read the embedding's grades at the wrong
    columns without any error."""
    sp, swapped = GradedStateSpace({"a": 4, "b": 3}), GradedStateSpace({"a": 3, "b": 4})
    assert sp.total_dim == swapped.total_dim and sp.slices["a"] != swapped.slices["a"]
    layer = MorphicLayer(swapped, EdgeSet.explicit(swapped, [("a", "b")]), [LinearBlock(3, 4)])
    with pytest.raises(ValueError, match=r"layer 0 uses the grades \[Grade\(label='a', dim=3, "
                                         r".*expected the model's, \[Grade\(label='a', dim=4"):
        MorphicTransformer(sp, [layer], 5)
    with pytest.raises(ValueError, match=r"edges were built over the grades \[Grade\(label='a', "
                                         r"dim=3.*expected the layer's, \[Grade\(label='a', dim=4"):
        MorphicLayer(sp, EdgeSet.explicit(swapped, [("a", "b")]), [LinearBlock(4, 3)])


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf])
def test_masked_pair_softmax_refuses_a_temperature_that_would_unmask_or_flatten(bad):
    """At T < 0 the masked logits −∞/T become +∞: the mass would sit outside 𝓔."""
    mask = torch.tensor([[True, False], [True, True]])
    with pytest.raises(ValueError, match=f"temperature must be a finite number > 0, got {bad!r}"):
        masked_pair_softmax(torch.zeros(2, 2), mask, bad)
    probs = masked_pair_softmax(torch.zeros(2, 2), mask, 0.5)
    assert torch.equal(probs, torch.tensor([[1 / 3, 0.0], [1 / 3, 1 / 3]]))


@pytest.mark.parametrize(("field", "bad", "expected"), [
    ("utility", "exactt", r"one of \('exact', 'first_order'\)"),
    ("attach", "none", r"one of \('phi', 'all'\)"),
    ("utility_weight", math.nan, "a finite number >= 0"),
    ("distill_weight", math.inf, "a finite number >= 0"),
    ("omega_weight", -1.0, "a finite number >= 0"),
])
def test_an_objective_the_first_training_step_would_reject_or_poison_is_refused_in_the_config(
        field, bad, expected):
    """A misspelt utility kind used to pass the config and fail at the first step; a NaN weight
    made every loss NaN."""
    from graded.morphic import build_morphic_model

    config = {"vocab_size": 5, "grades": [{"label": "a", "dim": 2}],
              "layers": [{"edges": [["a", "a", "x"]]}], "objective": {field: bad}}
    with pytest.raises(ValueError, match=rf"objective=.*{field} must be {expected}, got "
                                         rf"{bad!r}"):
        build_morphic_model(config)


def test_a_grade_label_with_a_dot_is_refused_before_it_reaches_a_module_name():
    from graded.morphic import Grade

    with pytest.raises(ValueError, match=r"grade label must be a non-empty string without '\.' "
                                         r".*got 'g\.0'"):
        Grade("g.0", 2)


@pytest.mark.parametrize(("thresholds", "message"), [
    ([0.0, math.nan], r"thresholds must be finite and >= 0, got \[0.0, nan\]"),
    ([0.0, 1.0, 2.0], r"thresholds must be a float or 2 values \(one per edge\), got shape "
                      r"\(3,\)"),
])
def test_thresholds_are_one_finite_value_per_edge(thresholds, message):
    """A NaN threshold made ℓ̃ = ℓ + β(ΔL − τ) and the penalty NaN for that edge."""
    sp, es = space_and_edges()
    with pytest.raises(ValueError, match=message):
        MorphicLayer(sp, es, [LinearBlock(4, 3), LinearBlock(3, 3)], thresholds=thresholds)


def test_banded_shifts_refuse_booleans_and_shift_sets_that_leave_every_grade():
    """True was read as the shift 1; shifts beyond every index gave "no edge" without saying
    which shifts or which indices."""
    from graded.morphic import Grade

    sp = GradedStateSpace([Grade("g0", 2, 0), Grade("g1", 2, 1)])
    with pytest.raises(ValueError, match=r"shifts must be a non-empty list of ints, got \[True\]"):
        EdgeSet.banded(sp, [True])
    with pytest.raises(ValueError, match=r"banded shifts \[5, -3\] give no edge; expected some "
                                         r"shift δ .*indices \[0, 1\]"):
        EdgeSet.banded(sp, [5, -3])
    with pytest.warns(UserWarning, match=r"^banded shift \[5\] of \[1, 5\] gives no edge: "
                      r"index\(g\) \+ δ is no grade's index for any grade g \(indices \[0, 1\]\); "
                      r"it adds nothing$"):  # it was dropped without a word
        assert [e.name for e in EdgeSet.banded(sp, [1, 5])] == ["g1<-g0"]  # the shift that fits
    with pytest.warns(UserWarning, match=r"^banded shifts \[5, -4\] of \[5, 1, -4\] give"):
        EdgeSet.banded(sp, [5, 1, -4])
