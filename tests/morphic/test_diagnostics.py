"""Morphic diagnostics (004 §5.4) measure what they say: per-group agreement, ablation in every
routing mode, equal-count calibration bins, and a distractor edge whose ablation costs nothing."""

import math

import pytest
import torch

from graded.morphic.blocks import LinearBlock
from graded.morphic.diagnostics import (
    calibration,
    destination_groups,
    edge_ablation,
    evaluation_loss,
    group_routing,
    routing_sparsity,
    write_report,
)
from graded.morphic.edges import EdgeSet
from graded.morphic.layer import MorphicLayer
from graded.morphic.model import MorphicTransformer
from graded.morphic.router import MODES
from graded.morphic.state import GradedStateSpace
from graded.morphic.tasks import VariableAdditionTask, build_adder_model
from graded.morphic.training import train_morphic


def _three_grade_edges() -> EdgeSet:
    space = GradedStateSpace({"a": 2, "b": 2, "c": 2})
    # into b: three edges (a choice); into c: two; into a: one (always-on)
    return EdgeSet.explicit(space, [("a", "b", "ab"), ("c", "b", "cb"), ("b", "b", "bb"),
                                    ("a", "c", "ac"), ("b", "c", "bc"), ("c", "a", "ca")])


def test_destination_groups_split_choice_groups_from_single_edges():
    choice, single = destination_groups(_three_grade_edges())
    assert choice == {"b": [0, 1, 2], "c": [3, 4]}
    assert single == {"a": 5}


def test_group_agreement_is_the_hand_count_per_group_and_skips_single_edges():
    edges = _three_grade_edges()
    # columns ab cb bb | ac bc | ca ; the single edge "ca" disagrees wildly and must not count
    ctx = torch.tensor([[.6, .3, .1, .7, .2, .9],
                        [.2, .5, .3, .1, .8, .1],
                        [.1, .1, .8, .4, .5, .5],
                        [.3, .3, .4, .6, .3, .2]])
    utl = torch.tensor([[.5, .4, .1, .1, .9, .1],   # b agrees (ab), c disagrees (ac vs bc)
                        [.1, .7, .2, .2, .7, .9],   # b agrees (cb), c agrees (bc)
                        [.6, .3, .1, .3, .6, .2],   # b disagrees (bb vs ab), c agrees (bc)
                        [.1, .2, .7, .9, .0, .8]])  # b agrees (bb), c agrees (ac)
    out = group_routing(ctx, utl, edges)
    by_dest = {g["dest"]: g for g in out["groups"]}
    assert by_dest["b"]["agreement"] == pytest.approx(3 / 4)
    assert by_dest["c"]["agreement"] == pytest.approx(3 / 4)
    assert out["agreement"] == pytest.approx(6 / 8)
    assert out["always_on"] == [{"dest": "a", "edge": "ca",
                                 "mean_prob": pytest.approx((.9 + .1 + .5 + .2) / 4)}]
    assert by_dest["b"]["choice_freq"] == pytest.approx([1 / 4, 1 / 4, 2 / 4])
    # one argmax over all six edges (the old reading) gives a different, meaningless number
    global_same = float((ctx.argmax(-1) == utl.argmax(-1)).float().mean())
    assert global_same != pytest.approx(out["agreement"])


def test_a_layer_with_only_single_edge_groups_reports_no_agreement():
    space = GradedStateSpace({"a": 2, "b": 2})
    edges = EdgeSet.explicit(space, [("a", "b", "ab"), ("b", "a", "ba")])
    out = group_routing(torch.rand(5, 2), torch.rand(5, 2), edges)
    assert out["groups"] == [] and out["agreement"] is None
    assert [r["edge"] for r in out["always_on"]] == ["ab", "ba"]


def test_group_entropy_and_support_are_those_of_the_renormalised_in_group_distribution():
    edges = _three_grade_edges()
    ctx = torch.tensor([[.3, .1, .0, .2, .2, 1.], [.04, .5, .06, .5, .01, 1.]])
    out = group_routing(ctx, ctx, edges, eps=0.1)
    by_dest = {g["dest"]: g for g in out["groups"]}
    for dest, cols in (("b", [0, 1, 2]), ("c", [3, 4])):
        ents, supports = [], []
        for row in ctx.tolist():
            mass = sum(row[i] for i in cols)
            q = [row[i] / mass for i in cols]
            ents.append(-sum(x * math.log(x) for x in q if x > 0))
            supports.append(sum(1 for x in q if x > 0.1))
        assert by_dest[dest]["entropy"] == pytest.approx(sum(ents) / 2, rel=1e-5)
        assert by_dest[dest]["support_eps"] == pytest.approx(sum(supports) / 2)


def test_group_routing_rejects_mismatched_shapes_and_bad_eps():
    edges = _three_grade_edges()
    with pytest.raises(ValueError, match=r"must both be \(N, 6\)"):
        group_routing(torch.rand(3, 6), torch.rand(3, 5), edges)
    with pytest.raises(ValueError, match="eps must lie in"):
        group_routing(torch.rand(3, 6), torch.rand(3, 6), edges, eps=1.5)


# ------------------------------------------------------------------------- edge ablation
def _routed_model(mode: str, stay: bool) -> MorphicTransformer:
    """One layer: a single edge f: a → b and a group {g1: a → a, g2: b → a}. The router's logits
    are constant (zero projections, unit biases): ℓ = r·W_e with W_f = 10 I, W_g1 = 5 I,
    W_g2 = 4.5 I, so every mode picks f and g1 at every token, clearly above the stay option (0)."""
    torch.manual_seed(0)
    space = GradedStateSpace({"a": 3, "b": 3})
    edges = EdgeSet.explicit(space, [("a", "b", "f"), ("a", "a", "g1"), ("b", "a", "g2")])
    blocks = [LinearBlock(3, 3) for _ in edges]
    layer = MorphicLayer(space, edges, blocks, router={"mode": mode, "stay": stay, "rank": 2})
    r = layer.router
    with torch.no_grad():
        r.proj_u.weight.zero_()
        r.proj_u.bias.fill_(1.0)
        for lin in r.proj_v.values():
            lin.weight.zero_()
            lin.bias.fill_(1.0)
        for i, scale in enumerate((10.0, 5.0, 4.5)):
            r.bilinear[i] = scale * torch.eye(2)
    return MorphicTransformer(space, [layer], 7, max_len=6)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 7, (4, 6), generator=g)
    return ids, torch.randint(0, 7, (4, 6), generator=g)


@pytest.mark.parametrize("stay", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_ablating_an_edge_changes_the_output_in_every_mode_exactly_when_it_is_used(mode, stay):
    model = _routed_model(mode, stay).eval()
    ids, targets = _batch()
    layer = model.layers[0]
    base = model(ids)
    assert torch.equal(base, model(ids))  # evaluation routing is deterministic in every mode
    used = (model.routing(ids)[0].alpha != 0).flatten(0, 1).any(0).tolist()
    # f (the only edge into b) and g1 are always used; g2 is used by soft routing only
    assert used == [True, True, mode == "soft"]
    for ei in range(len(layer.edges)):
        layer.disabled = {ei}
        try:
            ablated = model(ids)
        finally:
            layer.disabled = set()
        # (up to rounding: straight-through weights are hard + K − K, not exactly hard)
        assert torch.allclose(ablated, base, atol=1e-6) != used[ei], layer.edges[ei].name
    rows = edge_ablation(model, [(ids, targets)])
    assert layer.disabled == set()
    for row, is_used in zip(rows, used):
        assert (abs(row["delta"]) > 1e-4) == is_used, row


@pytest.mark.parametrize("stay", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_ablating_the_only_edge_into_a_grade_leaves_that_grade_on_the_skip_path(mode, stay):
    """Independent computation: with f disabled, z^{(b)} is unchanged, which is exactly what the
    same model gives with f's block replaced by the identity on its destination."""
    model = _routed_model(mode, stay).eval()
    ids, targets = _batch()
    layer = model.layers[0]
    z = model.embed_tokens(ids)
    layer.disabled = {0}
    try:
        z_new, trace = layer(z)
        loss_off = edge_ablation(model, [(ids, targets)])[0]["loss"]
    finally:
        layer.disabled = set()
    b = model.space.slices["b"]
    assert torch.equal(trace.alpha[..., 0], torch.zeros_like(trace.alpha[..., 0]))
    assert torch.allclose(z_new[..., b], z[..., b])

    class DestinationIdentity(torch.nn.Module):
        def forward(self, x_src, x_dst=None):
            return x_dst

    layer.blocks[0] = DestinationIdentity()
    assert loss_off == pytest.approx(evaluation_loss(model, [(ids, targets)]), rel=1e-6)


def test_a_distractor_edge_costs_nothing_to_ablate_on_a_trained_adder():
    task = VariableAdditionTask(5, (1, 2))
    torch.manual_seed(0)
    model = build_adder_model(task, sem_dim=8, rank=4, distractor="random")

    def batches(g):
        ids, t, _ = task.sample(32, g)
        return ids, t

    train_morphic(model, batches, steps=60, lr=0.01, seed=0, log_every=60)
    ids, t, _ = task.all_examples()
    rows = {r["edge"]: r for r in edge_ablation(model, [(ids, t)])}
    assert abs(rows["distractor"]["delta"]) < 1e-4
    assert rows["add_1"]["delta"] > 0.1 and rows["add_2"]["delta"] > 0.1
    assert rows["copy"]["delta"] > 0.1


# --------------------------------------------------------------------------- calibration
def test_equal_count_bins_hold_equal_counts_in_increasing_order():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(103, generator=g) ** 4
    y = torch.rand(103, generator=g) < p
    cal = calibration(p, y, bins=10)
    counts = [r["count"] for r in cal["bins"]]
    assert len(counts) == 10 and sum(counts) == 103 and set(counts) == {10, 11}
    for lo_bin, hi_bin in zip(cal["bins"], cal["bins"][1:]):
        assert lo_bin["hi"] <= hi_bin["lo"]


def test_ece_equals_the_formula_over_sorted_equal_count_chunks():
    g = torch.Generator().manual_seed(3)
    p = torch.rand(50, generator=g)
    y = torch.rand(50, generator=g) < 0.5
    pairs = sorted(zip(p.tolist(), y.tolist()))
    sizes = [50 // 7 + (1 if i < 50 % 7 else 0) for i in range(7)]
    ece, start = 0.0, 0
    for n in sizes:
        chunk = pairs[start:start + n]
        start += n
        mean_p = sum(a for a, _ in chunk) / n
        freq = sum(1.0 for _, b in chunk if b) / n
        ece += n / 50 * abs(mean_p - freq)
    cal = calibration(p, y, bins=7)
    assert cal["ece"] == pytest.approx(ece, rel=1e-5)
    assert cal["binning"] == "equal_count"


def test_a_confident_router_fills_every_equal_count_bin_but_only_the_end_width_bins():
    g = torch.Generator().manual_seed(0)
    p = torch.cat([torch.rand(500, generator=g) * 0.05, 0.95 + torch.rand(500, generator=g) * 0.05])
    y = torch.rand(1000, generator=g) < 0.5
    assert len(calibration(p, y, binning="equal_width")["bins"]) == 2
    assert len(calibration(p, y)["bins"]) == 10


def test_calibration_rejects_bad_bins_binning_and_lengths():
    p, y = torch.rand(10), torch.rand(10) > 0.5
    with pytest.raises(ValueError, match="bins must be a positive int, got 0"):
        calibration(p, y, bins=0)
    with pytest.raises(ValueError, match=r"binning must be one of .* got 'quantile'"):
        calibration(p, y, binning="quantile")
    with pytest.raises(ValueError, match="probs has 10 entries and positive 9"):
        calibration(p, y[:9])


def test_cli_report_of_a_morphic_run_has_utilities_before_training_from_the_runs_initial_model(
        tmp_path):
    """``graded report`` compares the trained run with its initial weights: the "before"
    figures equal ``collect`` on the model ``build_run`` makes (the trainer's own start), and
    differ from the "after" ones."""
    import json

    import yaml

    from graded.cli import main
    from graded.config import build_run, load_run_config
    from graded.morphic.diagnostics import collect

    cfg = {"name": "m", "seed": 3,
           "task": {"name": "dyck", "options": {"max_length": 8, "max_depth": 3},
                    "n_train": 64, "n_eval": 16},
           "model": {"architecture": "morphic", "morphic": {
               "grades": [{"label": "g0", "dim": 8, "index": 0},
                          {"label": "g1", "dim": 8, "index": 1}],
               "layers": [{"banded": [0, 1], "router": {"rank": 4}}]}},
           "recipe": "plain",
           "train": {"steps": 4, "batch_size": 16, "warmup_steps": 1, "eval_every": 4,
                     "lr": 0.01, "progress": False, "tensorboard": False},
           "output": {"dir": str(tmp_path / "runs")}}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    run = tmp_path / "runs" / "m"
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    layer = json.loads((tmp_path / "rep" / "morphic_m" / "report.json").read_text())["layers"][0]
    parts = build_run(load_run_config(run), tmp_path / "unused")
    ids, targets = parts.test.inputs[:16], parts.test.targets[:16]
    want = collect(parts.model, [(ids, targets)])[0]["utilities"]
    assert layer["mean_utility_before"] == pytest.approx(want.mean(0).tolist(), abs=1e-6)
    assert layer["mean_utility_before"] != pytest.approx(layer["mean_utility"], abs=1e-6)


def test_evaluation_loss_runs_in_eval_mode_and_the_report_agrees_with_the_ablation_base(
        tmp_path):
    """A model left in training mode with input noise (the A1 model, σ_n > 0) used to score the
    report's evaluation loss with noise: random, and not the base of the ablation's deltas."""
    from graded.morphic.diagnostics import write_report
    from graded.morphic.tasks.fixed_adder import FixedAdditionTask, build_fixed_adder_model

    task = FixedAdditionTask(p=5, k=2, noise=0.5)
    torch.manual_seed(0)
    model = build_fixed_adder_model(task)
    ids, targets = task.all_examples()
    model.eval()
    with torch.no_grad():
        want = float(torch.nn.functional.cross_entropy(model(ids).flatten(0, 1),
                                                       targets.flatten()))
    model.train()
    assert evaluation_loss(model, [(ids, targets)]) == pytest.approx(want, rel=1e-6)
    assert model.training  # restored
    report = write_report(model, [(ids, targets)], tmp_path)
    assert report["evaluation_loss"] == pytest.approx(want, rel=1e-6)
    for row in report["ablation"]:
        assert row["loss"] - row["delta"] == pytest.approx(want, rel=1e-6)


def test_routing_sparsity_equals_hand_counted_supports():
    # rows: 90% of the edge mass needs 2 edges (0.6 + 0.3), 3 edges (0.5 + 0.3 = 0.8 < 0.9),
    # 1 edge (0.95), 0 edges for a token with no mass on any edge (every edge disabled), which
    # was counted as |E| + 1 = 4 edges
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.3, 0.2], [0.95, 0.05, 0.0], [0.0, 0.0, 0.0]])
    entropy = torch.tensor([1.0, 2.0, 3.0, 0.0])
    out = routing_sparsity(probs, entropy, eps=0.15)
    assert out["support_90"] == pytest.approx((2 + 3 + 1 + 0) / 4)
    assert out["support_eps"] == pytest.approx((2 + 3 + 1 + 0) / 4)  # #{p > 0.15} per row
    assert out["entropy"] == pytest.approx(1.5)
    assert out["eps"] == 0.15


def test_write_report_refuses_batches_without_a_scored_token(tmp_path):
    # every target ignored: the report said ECE 0.0 and evaluation loss 0.0 (means over no token)
    task = VariableAdditionTask(5, (1, 2))
    model = build_adder_model(task)
    ids, targets, _ = task.all_examples()
    with pytest.raises(ValueError, match=r"at least one scored token; every target of the 1 "
                                         r"batch\(es\) is ignore_index = -100"):
        write_report(model, [(ids, torch.full_like(targets, -100))], tmp_path / "report")
    assert not (tmp_path / "report").exists()


def test_evaluation_loss_refuses_batches_without_a_scored_token_as_write_report_does():
    # every target ignored, or no batch: evaluation_loss returned 0.0, a mean over no token
    task = VariableAdditionTask(5, (1, 2))
    model = build_adder_model(task)
    ids, targets, _ = task.all_examples()
    ignored = torch.full_like(targets, model.ignore_index)
    model.train()
    for fn in (evaluation_loss, edge_ablation):  # the ablation's base is evaluation_loss
        with pytest.raises(ValueError, match=r"evaluation_loss needs at least one scored token; "
                                             r"every target of the 2 batch\(es\) is "
                                             r"ignore_index = -100"):
            fn(model, [(ids, ignored), (ids, ignored)])
        assert model.training  # the mode is restored on the error too
    with pytest.raises(ValueError, match=r"evaluation_loss needs at least one \(input_ids, "
                                         r"targets\) batch"):
        evaluation_loss(model, iter([]))
    # one scored token among ignored ones: the loss is that token's cross-entropy alone
    one = ignored.clone()
    one[0, -1] = targets[0, -1]
    model.eval()
    with torch.no_grad():
        want = float(torch.nn.functional.cross_entropy(model(ids)[0, -1], targets[0, -1]))
    assert evaluation_loss(model, [(ids, one), (ids, ignored)]) == pytest.approx(want, rel=1e-6)
