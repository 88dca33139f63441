import inspect

import pytest
import torch

import graded.morphic.layer as layer_mod
from graded.morphic import (
    BandedBlocks,
    EdgeSet,
    FFNBlock,
    Grade,
    GradedStateSpace,
    GradeTypedAttention,
    MorphicLayer,
    MorphicObjective,
    MorphicTransformer,
    train_morphic,
)


def small_model(mode="soft", update="gated_replace", normalization="dest", objective=None,
                train_routing="context"):
    torch.manual_seed(0)
    sp = GradedStateSpace([Grade("g0", 4, 0), Grade("g1", 4, 1), Grade("g2", 4, 2)])
    bb = BandedBlocks(sp, [0, 1])
    l1 = MorphicLayer(sp, bb.edge_set, bb, router={"rank": 4, "mode": mode,
                                                   "normalization": normalization}, update=update,
                      train_routing=train_routing)
    es = EdgeSet.explicit(sp, [("g0", "g2", "att"), ("g1", "g1", "ffn")])
    blocks = [GradeTypedAttention(4, 4, num_heads=2, head_dim=2, value_source="source"),
              FFNBlock(4, 4, 8)]
    l2 = MorphicLayer(sp, es, blocks, router={"rank": 4, "mode": mode,
                                              "normalization": normalization}, update=update,
                      train_routing=train_routing)
    return MorphicTransformer(sp, [l1, l2], vocab_size=9, max_len=16, objective=objective)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 9, (3, 7), generator=g)
    return ids, torch.roll(ids, -1, 1)


def test_evaluation_and_generation_take_no_targets_and_never_build_a_utility_probe(monkeypatch):
    for fn in (MorphicTransformer.forward, MorphicTransformer.generate):
        assert "targets" not in inspect.signature(fn).parameters
    model = small_model()

    def forbidden(*args, **kwargs):
        raise AssertionError("a utility probe (targets) was built on the evaluation path")

    monkeypatch.setattr(layer_mod, "UtilityProbe", forbidden)
    import graded.morphic.model as model_mod
    monkeypatch.setattr(model_mod, "UtilityProbe", forbidden)
    ids, _ = batch()
    model.eval()
    logits = model(ids)
    assert logits.shape == (3, 7, 9)
    out = model.generate(ids[:, :3], 4)
    assert out.shape == (3, 7)
    model.routing(ids)


def test_training_loss_returns_a_scalar_and_float_metrics_and_trains_the_router():
    model = small_model()
    model.train()
    ids, targets = batch()
    loss, metrics = model.training_loss(ids, targets)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(isinstance(v, float) for v in metrics.values())
    loss.backward()
    assert model.layers[0].router.bilinear.grad.abs().sum() > 0
    assert model.layers[1].blocks[0].q.weight.grad is not None


@pytest.mark.parametrize("mode,update,norm", [("hard", "gated_replace", "dest"),
                                              ("gumbel", "residual_typed", "dest"),
                                              ("reinforce", "sample_one", "global"),
                                              ("soft", "convex_identity", "global"),
                                              ("soft", "routed_LN", "global")])
def test_every_router_mode_and_update_trains_end_to_end(mode, update, norm):
    model = small_model(mode, update, norm, MorphicObjective(omega="group_lasso"))
    model.train()
    loss, _ = model.training_loss(*batch())
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.layers[0].router.bilinear.grad.abs().sum() > 0


def test_greedy_generation_appends_the_argmax_of_the_forward_logits():
    model = small_model().eval()
    ids, _ = batch()
    out = model.generate(ids[:, :4], 3)
    seq = ids[:, :4]
    for _ in range(3):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    torch.testing.assert_close(out, seq)
    sampled = model.generate(ids[:, :4], 3, do_sample=True, top_k=2,
                             generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (3, 7)


def test_bad_inputs_raise_clear_errors():
    model = small_model()
    with pytest.raises(TypeError, match="LongTensor"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="token ids must lie in"):
        model(torch.full((1, 3), 9))
    with pytest.raises(ValueError, match="targets shape"):
        model.training_loss(torch.zeros(2, 3, dtype=torch.long),
                            torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="sample_one"):
        sp = GradedStateSpace({"a": 2})
        es = EdgeSet.explicit(sp, [("a", "a")])
        MorphicLayer(sp, es, [FFNBlock(2, 2, 2)], update="sample_one")


def test_training_is_seeded_and_deterministic():
    def run():
        model = small_model()
        res = train_morphic(model, lambda g: batch(int(torch.randint(0, 5, (1,), generator=g))),
                            steps=3, seed=1, log_every=1)
        return [h["loss"] for h in res.history], model.readout.weight.detach().clone()

    (h1, w1), (h2, w2) = run(), run()
    assert h1 == h2
    torch.testing.assert_close(w1, w2)


def test_context_training_routes_by_context_logits_and_utility_training_by_augmented_logits():
    from graded.morphic import UtilityProbe

    model = small_model(train_routing="utility")
    layer = model.layers[0]
    ids, targets = batch()
    z = model.embed_tokens(ids)
    probe = UtilityProbe(model.readout.weight, model.readout.bias, targets)
    _, tr = layer(z, probe)
    torch.testing.assert_close(tr.routing_logits, tr.utility_logits)
    layer.train_routing = "context"
    _, tr = layer(z, probe)
    torch.testing.assert_close(tr.routing_logits, tr.context_logits)


def test_training_routes_by_context_by_default_in_python_and_yaml_configs():
    from graded.morphic.config import MorphicLayerSpec

    assert inspect.signature(MorphicLayer).parameters["train_routing"].default == "context"
    assert MorphicLayerSpec(edges=[["g0", "g1", "e"]]).train_routing == "context"
    assert all(layer.train_routing == "context" for layer in small_model().layers)
    from graded.morphic.config import RouterOptions

    assert RouterOptions().stay is True and all(layer.router.stay for layer in small_model().layers)


def test_context_agreement_counts_stay_choices_per_routed_group_by_hand():
    from graded.morphic import Router
    from graded.morphic.model import routing_agreement

    sp = GradedStateSpace({"a": 2, "b": 2})
    es = EdgeSet.explicit(sp, [("a", "b", "e1"), ("b", "b", "e2"), ("a", "a", "e3")])
    u = torch.tensor([[[1.0, -1.0, 2.0], [-1.0, -2.0, -1.0]]])  # (1, 2, 3)
    c = torch.tensor([[[0.5, 0.2, -1.0], [-3.0, -1.0, -2.0]]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    # with stay: token 0: b e1 = e1 (hit), a e3 vs stay (miss); token 1: b stay = stay,
    # a stay = stay → 3 / 4
    assert routing_agreement(Router(sp, es), u, c, valid) == pytest.approx(0.75)
    # without stay a is always-on and not counted: token 0 e1 = e1, token 1 e1 vs e2 → 1 / 2
    assert routing_agreement(Router(sp, es, stay=False), u, c, valid) == pytest.approx(0.5)


def test_context_agreement_of_a_model_skips_layers_without_a_choice_instead_of_becoming_nan():
    """Layer 0 is one always-on block (stay=False): it has no agreement. The model's figure is
    layer 1's, recounted here from its traces by hand (argmax per destination, stay included)."""
    from graded.morphic.config import build_morphic_model

    grades = [{"label": "g0", "dim": 4, "index": 0}, {"label": "g1", "dim": 4, "index": 1}]
    model = build_morphic_model({
        "vocab_size": 6, "max_len": 8, "grades": grades,
        "layers": [{"edges": [["g0", "g1", "x"]], "router": {"stay": False}},
                   {"banded": [0, 1], "router": {"init_std": 0.5}}]})
    assert model.layers[0].router.routed_groups == []
    torch.manual_seed(1)
    ids = torch.randint(0, 6, (3, 7))
    targets = ids.roll(-1, 1)
    targets[0, 3] = -100
    _, metrics = model.training_loss(ids, targets)
    with torch.no_grad():
        _, traces = model.utility_routing(ids, targets)
    layer, tr = model.layers[1], traces[1]
    hits = total = 0
    for b in range(3):
        for t in range(7):
            if targets[b, t] == -100:
                continue
            for h in layer.edges.dests:  # each destination: its edges and the stay option (0)
                idx = layer.edges.incoming(h)
                pick = [float(tr.utility_logits[b, t, i]) for i in idx] + [0.0]
                ctx = [float(tr.context_logits[b, t, i]) for i in idx] + [0.0]
                hits += max(range(len(pick)), key=pick.__getitem__) == max(
                    range(len(ctx)), key=ctx.__getitem__)
                total += 1
    assert metrics["context_agreement"] == pytest.approx(hits / total)


def test_utility_routed_training_also_reports_the_context_routed_loss():
    """loss_context is the cross-entropy of the evaluation path model(ids), recomputed here."""
    ids, targets = batch()
    model = small_model(train_routing="utility")
    _, metrics = model.training_loss(ids, targets)
    with torch.no_grad():
        logits = model(ids)
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert metrics["loss_context"] == pytest.approx(float(want), rel=1e-5)
    # target-aware routing differs from context routing: two different figures
    assert metrics["lm_loss"] != pytest.approx(metrics["loss_context"], rel=1e-6)
    # under context routing the training loss is the context-routed loss itself
    context = small_model()
    _, metrics = context.training_loss(ids, targets)
    assert metrics["loss_context"] == metrics["lm_loss"]
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(context(ids).flatten(0, 1), targets.flatten())
    assert metrics["lm_loss"] == pytest.approx(float(want), rel=1e-5)


def test_distillation_term_is_kl_from_the_utility_gibbs_routing_to_the_context_routing():
    obj = MorphicObjective(utility_weight=0.0, omega="none", distill_weight=1.0)
    model = small_model(objective=obj, train_routing="utility")
    ids, targets = batch()
    _, metrics = model.training_loss(ids, targets)
    with torch.no_grad():
        _, traces = model.utility_routing(ids, targets)
    want = 0.0
    for layer, tr in zip(model.layers, traces):
        teacher = layer.beta * (tr.utilities - layer.thresholds.to(tr.utilities.dtype))
        want += float(layer.router.kl(teacher, tr.context_logits).mean())
    assert metrics["distill"] == pytest.approx(want, rel=1e-5)


def test_training_with_first_order_utilities_runs_and_reaches_the_blocks():
    model = small_model(objective=MorphicObjective(utility="first_order", utility_weight=1.0))
    loss, _ = model.training_loss(*batch())
    loss.backward()
    assert model.layers[1].blocks[1].w1.weight.grad.abs().sum() > 0


def test_generation_supports_top_p_and_beam_search_and_the_widest_beam_is_exhaustive():
    model = small_model().eval()
    ids, _ = batch()
    prompt = ids[:, :4]
    assert torch.equal(model.generate(prompt, 3, num_beams=1), model.generate(prompt, 3))
    g = torch.Generator().manual_seed(0)
    nucleus = model.generate(prompt, 3, do_sample=True, top_p=1e-6, generator=g)
    torch.testing.assert_close(nucleus, model.generate(prompt, 3))  # top-p → the argmax only
    # With as many beams as tokens, two steps of beam search are an exhaustive search.
    vocab = model.vocab_size
    beam = model.generate(prompt, 2, num_beams=vocab)
    with torch.no_grad():
        for b in range(prompt.shape[0]):
            best, best_seq = float("-inf"), None
            for a in range(vocab):
                for c in range(vocab):
                    seq = torch.cat([prompt[b], torch.tensor([a, c])])[None]
                    logp = torch.log_softmax(model(seq[:, :-1])[0, -2:], -1)
                    score = float(logp[0, a] + logp[1, c])
                    if score > best:
                        best, best_seq = score, seq[0]
            torch.testing.assert_close(beam[b], best_seq)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(prompt, 2, do_sample=True, top_p=1.5)
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(prompt, 2, num_beams=0)


@pytest.mark.parametrize("train_routing", ["context", "utility"])
def test_lm_loss_is_the_mean_over_scored_tokens_and_zero_without_any(train_routing):
    """lm_loss equals F.cross_entropy's mean over the scored tokens of the same logits; a batch
    with no scored token (every target ignore_index, e.g. one micro-batch of padding) gives a
    loss of 0 with finite gradients, as the router terms already do, instead of 0/0 = NaN."""
    model = small_model(mode="reinforce", train_routing=train_routing)
    ids, targets = batch()
    targets[0] = -100
    targets[1, :4] = -100
    model.eval()  # deterministic routing: the same logits in model(ids) and in training_loss
    _, metrics = model.training_loss(ids, targets)
    with torch.no_grad():
        logits = model(ids) if train_routing == "context" else model.utility_routing(
            ids, targets)[0]
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert metrics["lm_loss"] == pytest.approx(float(want), rel=1e-5)
    model.train()
    loss, metrics = model.training_loss(ids, torch.full_like(targets, -100))
    assert metrics["lm_loss"] == 0.0 and metrics["loss_context"] == 0.0
    assert torch.isfinite(loss) and loss.item() == 0.0
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
