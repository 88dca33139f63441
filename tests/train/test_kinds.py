"""Task kinds (graded.kinds): registry, forward, loss sums against naive loops, metrics through
graded.evaluation, generation, and the morphic LM with its padding mask."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from graded.evaluation import compute_metric
from graded.evaluation.baselines import sequence_baselines
from graded.kinds import (
    KIND_NAMES,
    LM,
    Classification,
    LossSum,
    MorphicLM,
    MorphicModel,
    Regression,
    Seq2Seq,
    as_kind,
    get_kind,
)
from graded.tasks import IGNORE_INDEX, available_tasks, get_task
from graded.train import evaluate, predict
from graded.transformer import TransformerConfig

# one small task per kind
TASKS = {"lm": ("dyck", {"max_length": 10}),
         "seq2seq": ("polynomials_seq2seq", {"max_degree": 2}),
         "classification": ("listops", {}),
         "regression": ("polynomial_regression", {})}


def task_and_model(kind_name: str, seed: int = 0):
    name, options = TASKS[kind_name]
    task = get_task(name, **options)
    info = task.info()
    torch.manual_seed(seed)
    config = TransformerConfig(vocab_size=info["vocab_size"], input_dim=info["input_dim"],
                               d_model=16, n_heads=2, n_layers=1, d_ff=32,
                               max_len=task.max_len + 4, positional="learned",
                               pad_id=info["pad_id"])
    model = get_kind(task.kind).build_model(config, task)
    return task, model.eval(), task.generate(12, seed=seed + 1)


def test_kind_names_are_the_registry_and_cover_every_registered_task():
    assert KIND_NAMES == ("lm", "seq2seq", "classification", "regression")
    assert {get_task(name).kind for name in available_tasks()} <= set(KIND_NAMES)
    assert [type(get_kind(n)) for n in KIND_NAMES] == [LM, Seq2Seq, Classification, Regression]
    assert type(get_kind("lm", "morphic")) is MorphicLM


def test_unknown_kind_or_architecture_is_rejected_naming_it():
    with pytest.raises(ValueError, match=r"unknown task kind 'ranking'.*'lm'"):
        get_kind("ranking")
    with pytest.raises(ValueError, match=r"'regression' has no 'morphic' architecture"):
        get_kind("regression", "morphic")
    with pytest.raises(TypeError, match="kind must be a name"):
        as_kind(3)


def test_a_kind_defined_outside_the_library_is_found_by_name_and_evaluates():
    """docs/training.md, "How to extend": a subclass defined in a user's module registers
    itself; get_kind finds it by name and evaluate sums its own loss (absolute error here,
    against a loop over the rows)."""
    from graded.kinds.base import _REGISTRY

    class Ranking(Regression):
        name = "ranking"

        def output_loss(self, output, batch, *, label_smoothing=0.0, weights=None, count=None):
            error = (self.raw_prediction(output, batch).float() - batch["targets"]).abs()
            return LossSum(error.sum(), self._count(batch, count))

    try:
        kind = get_kind("ranking")
    finally:
        _REGISTRY.pop(("ranking", "transformer"))
    assert type(kind) is Ranking and "ranking" not in KIND_NAMES
    _, model, data = task_and_model("regression")
    batch = data.tensors
    with torch.no_grad():
        outputs = model(batch["inputs"], batch.get("key_padding_mask"))
    targets = batch["targets"]
    expected = sum(abs(float(o) - float(t)) for o, t in
                   zip(outputs.reshape(targets.shape).flatten(), targets.flatten(), strict=True))
    result = evaluate(model, batch, kind, batch_size=5)
    assert result["loss"] == pytest.approx(expected / targets.numel(), rel=1e-5)


def test_missing_batch_keys_are_named():
    with pytest.raises(ValueError, match=r"'seq2seq' batch needs.*missing \['decoder_inputs'\]"):
        get_kind("seq2seq").forward(torch.nn.Identity(), {"inputs": torch.zeros(1, 2)})


@pytest.mark.parametrize("kind_name", KIND_NAMES)
def test_forward_never_reads_targets_and_passes_the_padding_mask(kind_name):
    _, model, data = task_and_model(kind_name)
    kind = get_kind(kind_name)
    batch = dict(data.tensors)
    with torch.no_grad():
        out = kind.forward(model, batch)
        unlabelled = {k: v for k, v in batch.items() if k not in ("targets", "loss_mask")}
        assert torch.equal(kind.forward(model, unlabelled), out)
        mask = batch["key_padding_mask"]
        if kind_name == "seq2seq":
            direct = model(batch["inputs"], batch["decoder_inputs"], mask,
                           batch["decoder_key_padding_mask"])
        else:
            direct = model(batch["inputs"], mask)
    assert torch.equal(out, direct)


def _naive_cross_entropy(logits, targets, smoothing):
    """Σ over scored positions of −(1−ε) log p_y − (ε/V) Σ_v log p_v (002 §6.4), one by one."""
    logp = logits.double().log_softmax(-1).reshape(-1, logits.shape[-1])
    total, count = 0.0, 0
    for row, y in zip(logp, targets.reshape(-1).tolist()):
        if y == IGNORE_INDEX:
            continue
        total += float(-(1 - smoothing) * row[y] - smoothing * row.mean())
        count += 1
    return total, count


@pytest.mark.parametrize("kind_name", ["lm", "seq2seq", "classification"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_loss_is_a_sum_over_scored_items_with_their_count(kind_name, smoothing):
    _, model, data = task_and_model(kind_name)
    kind = get_kind(kind_name)
    part = kind.loss(model, data.tensors, label_smoothing=smoothing)
    with torch.no_grad():
        total, count = _naive_cross_entropy(kind.forward(model, data.tensors),
                                            data.targets, smoothing)
    assert part.count == count == kind.loss_count(data.tensors)
    assert float(part.total.detach()) == pytest.approx(total, rel=1e-5)
    assert float(part.mean.detach()) == pytest.approx(total / count, rel=1e-5)
    if kind_name != "classification":  # tokens, padding excluded
        assert count == int((data.targets != IGNORE_INDEX).sum()) < data.targets.numel()


def test_regression_loss_sums_squared_errors_over_elements():
    _, model, data = task_and_model("regression")
    kind = get_kind("regression")
    part = kind.loss(model, data.tensors)
    with torch.no_grad():
        pred = model(data.inputs, data.tensors["key_padding_mask"]).double()
    y = data.targets.double()
    naive = sum(float((pred[i, j] - y[i, j]) ** 2)
                for i in range(y.shape[0]) for j in range(y.shape[1]))
    assert part.count == y.numel()
    assert float(part.total.detach()) == pytest.approx(naive, rel=1e-5)


def test_count_items_counts_input_tokens_without_padding():
    _, _, data = task_and_model("seq2seq")
    t = data.tensors
    expected = int((~t["key_padding_mask"]).sum() + (~t["decoder_key_padding_mask"]).sum())
    assert get_kind("seq2seq").count_items(t) == expected
    assert get_kind("lm").count_items({"inputs": torch.zeros(3, 5)}) == 15


@pytest.mark.parametrize("kind_name", KIND_NAMES)
def test_evaluate_equals_graded_evaluation_metrics_on_collected_predictions(kind_name):
    _, model, data = task_and_model(kind_name)
    kind = get_kind(kind_name)
    small = evaluate(model, data.tensors, kind_name, batch_size=5)  # 5 + 5 + 2 rows
    whole = evaluate(model, data.tensors, kind, batch_size=64)
    pred = predict(model, data.tensors, kind, batch_size=5)
    for name in kind.metrics_for(data):
        want = compute_metric(name, pred, data)  # real outputs vary in the last bits by batch
        assert small[name] == pytest.approx(want, abs=1e-6) == whole[name], name
    full = kind.loss(model, data.tensors)
    assert small["loss"] == pytest.approx(float(full.mean.detach()), rel=1e-5)
    expected = {"loss", *kind.metrics_for(data)}
    if kind_name in ("lm", "seq2seq"):
        expected.add("perplexity")
        assert small["perplexity"] == pytest.approx(math.exp(small["loss"]))
    assert set(small) == expected


def test_lm_metrics_include_masked_token_accuracy_when_the_data_has_a_metric_mask():
    _, _, data = task_and_model("lm")  # Dyck: closing brackets
    assert "masked_token_accuracy" in get_kind("lm").metrics_for(data)
    assert "masked_token_accuracy" not in get_kind("lm").metrics_for(
        {k: v for k, v in data.tensors.items() if k != "metric_mask"})


def test_lm_baselines_are_those_of_graded_evaluation():
    task = get_task("polynomials", max_degree=2)
    train, test = task.split("random", 40, 20, seed=0)
    got = get_kind("lm").baselines(train, test)
    want = sequence_baselines(train, test, encoder_decoder=False)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in got)


@pytest.mark.parametrize("kind_name", ["lm", "seq2seq"])
def test_sequence_generation_decodes_the_models_greedy_continuation(kind_name):
    task, model, data = task_and_model(kind_name)
    ids = data.inputs[:1, :3]
    text = get_kind(kind_name).generate(model, task, ids, 2)
    extra = {"bos_token_id": task.info()["bos_id"]} if kind_name == "seq2seq" else {}
    # the padding token is never generated: it is never a target, and decoding drops it
    out = model.generate(ids, 2, eos_token_id=task.info()["eos_id"],
                         pad_token_id=task.vocab.pad_id, bad_words_ids=[[task.vocab.pad_id]],
                         **extra)
    assert text == task.vocab.decode_str(out[0])


def test_classification_and_regression_generation_predict_from_the_prompt():
    task, model, data = task_and_model("classification")
    ids, two = data.inputs[:1, :6], data.inputs[:2, :6]
    got = get_kind("classification").generate(model, task, ids, 0)
    with torch.no_grad():
        logits = model(ids)[0]
    assert got["class"] == int(logits.argmax())
    assert sum(got["probabilities"]) == pytest.approx(1.0, abs=1e-3)
    task, model, data = task_and_model("regression")
    x = data.inputs[:1]
    with torch.no_grad():
        assert get_kind("regression").generate(model, task, x, 0) == {
            "prediction": model(x)[0].tolist()}
    with pytest.raises(ValueError, match=r"one prompt of shape \(1, T\), got \(2, 6\)"):
        get_kind("classification").generate(model, task, two, 0)


# ---- the morphic LM ----------------------------------------------------------------------
def morphic_model():
    import graded.morphic as M

    torch.manual_seed(0)
    sp = M.GradedStateSpace([M.Grade("g0", 4, 0), M.Grade("g1", 4, 1)])
    es = M.EdgeSet.explicit(sp, [("g0", "g1", "att"), ("g1", "g1", "ffn")])
    blocks = [M.GradeTypedAttention(4, 4, num_heads=2, head_dim=2), M.FFNBlock(4, 4, 8)]
    layer = M.MorphicLayer(sp, es, blocks, router={"rank": 4, "pooling": "attention"})
    return M.MorphicTransformer(sp, [layer], vocab_size=9, max_len=16)


def test_morphic_model_follows_the_protocol_and_gets_the_morphic_lm_kind():
    model = morphic_model()
    assert isinstance(model, MorphicModel)
    assert type(as_kind("lm", model)) is MorphicLM
    assert type(as_kind("lm", torch.nn.Linear(2, 2))) is LM


def test_morphic_right_padding_leaves_real_tokens_unchanged_and_left_padding_is_refused():
    model = morphic_model().eval()
    ids = torch.randint(0, 9, (1, 5), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[False] * 5 + [True] * 3])
    with torch.no_grad():
        alone = model(ids)
        both = get_kind("lm", "morphic").forward(model, {"inputs": padded,
                                                         "key_padding_mask": mask})
    torch.testing.assert_close(both[:, :5], alone, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="row 0 has padding before a real token"):
        model(padded, mask.flip(1))
    with pytest.raises(ValueError, match=r"expected input_ids' shape \(1, 8\)"):
        model(padded, mask[:, :4])


def test_morphic_lm_loss_is_the_training_loss_mean_times_the_scored_tokens():
    model = morphic_model()
    ids = torch.randint(0, 9, (3, 8), generator=torch.Generator().manual_seed(2))
    targets = ids.roll(-1, 1)
    targets[0, 5:] = IGNORE_INDEX
    mask = targets == IGNORE_INDEX
    batch = {"inputs": ids, "targets": targets, "key_padding_mask": mask}
    kind = get_kind("lm", "morphic")
    torch.manual_seed(3)
    part = kind.loss(kind.training_module(model), batch)
    torch.manual_seed(3)
    mean, metrics = model.training_loss(ids, targets, mask)
    assert part.count == 24 - 3
    assert float(part.total.detach()) == pytest.approx(float(mean.detach()) * 21, rel=1e-6)
    assert "loss" not in part.metrics and part.metrics["lm_loss"] == metrics["lm_loss"]
    # the LM part alone is the token cross-entropy of the evaluation path
    with torch.no_grad():
        model.eval()
        ce = F.cross_entropy(model(ids, mask).flatten(0, 1), targets.flatten(), reduction="sum")
        got = get_kind("lm", "morphic").output_loss(model(ids), batch).total
    assert float(got) == pytest.approx(float(ce), rel=1e-5)
    with pytest.raises(ValueError, match=r"label_smoothing must be 0, got 0\.1"):
        kind.loss(model, batch, label_smoothing=0.1)


def test_morphic_check_data_checks_ids_and_padding_once_and_trusts_them_after():
    from graded.checks import checked_inputs

    model = morphic_model()
    kind = get_kind("lm", "morphic")
    ids = torch.randint(0, 9, (2, 6), generator=torch.Generator().manual_seed(3))
    right = torch.zeros(2, 6, dtype=torch.bool)
    right[0, 4:] = True
    assert kind.check_data(model, {"inputs": ids, "targets": ids, "key_padding_mask": right})
    with pytest.raises(ValueError, match="row 0 has padding before a real token"):
        kind.check_data(model, {"inputs": ids, "targets": ids,
                                "key_padding_mask": right.flip(1)})
    with pytest.raises(ValueError, match=r"'inputs': token ids must lie in \[0, 9\)"):
        kind.check_data(model, {"inputs": ids + 9, "targets": ids})
    with checked_inputs():  # checked by the caller: the model reads neither again
        model(ids, right.flip(1))


def test_lm_data_with_targets_outside_the_vocabulary_are_refused_naming_their_range():
    _, model, data = task_and_model("lm")
    kind = get_kind("lm")
    batch = dict(data.tensors)
    assert kind.check_data(model, batch)  # -100 marks unscored targets: allowed
    targets = batch["targets"].clone()
    targets[0, 0] = model.config.vocab_size
    with pytest.raises(ValueError, match=r"'targets': token ids must lie in \[0, \d+\); got "
                                         r"range \[\d+, \d+\]"):
        kind.check_data(model, {**batch, "targets": targets})


@pytest.mark.parametrize("kind_name", KIND_NAMES)
@pytest.mark.parametrize("grading", [{}, dict(grading="linear", learnable_grades=True)])
def test_a_loss_counted_by_the_caller_reads_no_value_of_a_checked_batch(kind_name, grading):
    """The trainer counts a batch's items on the host and checks its data once: the loss of
    such a batch then reads nothing from the (device) batch, and equals the loss that counts."""
    from graded.checks import checked_inputs
    from host_reads import HostReads

    name, options = TASKS[kind_name]
    task = get_task(name, **options)
    info = task.info()
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=info["vocab_size"], input_dim=info["input_dim"],
                               d_model=16, n_heads=2, n_layers=1, d_ff=32,
                               max_len=task.max_len + 4, positional="learned",
                               pad_id=info["pad_id"], **grading)
    kind = get_kind(kind_name)
    model = kind.build_model(config, task)
    batch = task.generate(12, seed=1).tensors
    assert kind.check_data(model, batch)
    count = kind.loss_count(batch)
    with checked_inputs(), HostReads() as reads:
        part = kind.loss(model, batch, count=count)
        part.total.backward()
    assert reads.sites == []
    plain = kind.loss(model, batch)
    assert part.count == plain.count == count
    assert torch.equal(part.total.detach(), plain.total.detach())


def test_a_counted_morphic_loss_takes_the_callers_count():
    """A morphic LM's kind reads nothing for its count either; on its eager path the model
    reads which rows are scored, once per layer (graded.morphic.utilities gathers them by
    index), and one flag per edge (rows outside the exact utility's fast range are redone);
    nothing else, and nothing when compiled."""
    from graded.checks import checked_inputs
    from host_reads import HostReads

    model = morphic_model()
    ids = torch.randint(0, 9, (3, 8), generator=torch.Generator().manual_seed(2))
    targets = ids.roll(-1, 1)
    targets[0, 5:] = IGNORE_INDEX
    batch = {"inputs": ids, "targets": targets, "key_padding_mask": targets == IGNORE_INDEX}
    kind = get_kind("lm", "morphic")
    assert kind.check_data(model, batch)
    count = kind.loss_count(batch)
    with checked_inputs(), HostReads() as reads:
        torch.manual_seed(3)
        part = kind.loss(kind.training_module(model), batch, count=count)
    torch.manual_seed(3)
    plain = kind.loss(kind.training_module(model), batch)
    assert part.count == plain.count == 21
    assert torch.equal(part.total.detach(), plain.total.detach())
    names = sorted(site.split(" in ")[0] for site in reads.sites)
    assert names == ["_local_scalar_dense"] * 2 + ["nonzero"], reads.sites  # 2 edges, 1 layer
    kinds_files = ("base.py:", "sequence.py:", "rows.py:")  # graded/kinds (sites name files)
    assert not [s for s in reads.sites if any(f in s for f in kinds_files)]
