"""The trainer reads its steps' values from the device only where it needs them.

A training step leaves its loss, gradient norm and metrics on the device; the trainer reads
all the steps since the last read in one transfer at a log step, before an evaluation or a
checkpoint, and at the end (``Trainer._read``), so that on a GPU the host can queue one step
while the device computes the last. Losses, logs and the error for a non-finite loss are those
of reading every step; the training data are checked once, at construction, and the steps run
inside ``graded.checks.checked_inputs``.
"""

from __future__ import annotations

import copy
import csv

import pytest
import torch
from tiny_training import LM_TASKS, OPTIONS, make_lm_trainer, make_trainer

from graded import TransformerConfig
from graded.checks import inputs_checked
from graded.kinds import get_kind
from graded.tasks import get_task
from graded.train.options import TrainOptions
from graded.train.recipes import get_recipe
from graded.train.trainer import Trainer


def train_rows(folder) -> dict[tuple[int, str], float]:
    """(step, name) -> value of the training scalars in a run's metrics.csv."""
    with (folder / "metrics.csv").open() as f:
        return {(int(r["step"]), r["name"]): float(r["value"]) for r in csv.DictReader(f)
                if r["split"] == "train"}


def windows_of(trainer: Trainer) -> list[list[int]]:
    """Record the steps of every window the trainer reads."""
    seen: list[list[int]] = []
    read = trainer._read

    def recording(window):
        if window:
            seen.append([w.step for w in window])
        return read(window)

    trainer._read = recording
    return seen


def test_values_are_read_once_per_window_and_equal_reading_every_step(tmp_path):
    every = make_lm_trainer(tmp_path / "every", "dyck", log_every=1, eval_every=100)
    seen_every = windows_of(every)
    losses_every = every.fit().losses
    assert seen_every == [[s] for s in range(1, 13)]
    windowed = make_lm_trainer(tmp_path / "windowed", "dyck", log_every=5, eval_every=4,
                               checkpoint_every=6)
    seen = windows_of(windowed)
    losses = windowed.fit().losses
    # log steps 5, 10; evaluations 4, 8, 12; checkpoint 6; the end 12
    assert seen == [[1, 2, 3, 4], [5], [6], [7, 8], [9, 10], [11, 12]]
    assert losses == losses_every  # the same steps, read later
    logged = train_rows(tmp_path / "windowed")
    assert sorted({step for step, name in logged if name == "loss"}) == [5, 10, 12]


def test_the_logged_scalars_are_those_of_the_step(tmp_path):
    a = make_lm_trainer(tmp_path / "a", "dyck", log_every=1, eval_every=100)
    b = make_lm_trainer(tmp_path / "b", "dyck", log_every=4, eval_every=100)
    a.fit(), b.fit()

    ra, rb = train_rows(tmp_path / "a"), train_rows(tmp_path / "b")
    assert sorted({step for step, _ in rb}) == [4, 8, 12]
    for (step, name), value in rb.items():
        if name != "tokens_per_s":  # a timing
            assert value == pytest.approx(ra[step, name], rel=1e-12), (step, name)
    assert {name for _, name in rb} >= {"loss", "grad_norm", "lr", "tokens_per_s"}


def test_a_non_finite_loss_names_its_step_and_saves_nothing_after_it(tmp_path, monkeypatch):
    trainer = make_lm_trainer(tmp_path / "nan", "dyck", log_every=5, eval_every=100,
                              checkpoint_every=100)
    kind_loss = trainer.kind.loss
    calls = {"n": 0}

    def poisoned(model, batch, **kw):
        part = kind_loss(model, batch, **kw)
        calls["n"] += 1
        if calls["n"] == 3:  # the third step's loss
            part.total = part.total * float("nan")
        return part

    monkeypatch.setattr(trainer.kind, "loss", poisoned)
    with pytest.raises(FloatingPointError, match=r"training loss became nan at step 3") as err:
        trainer.fit()
    # checkpoint folders are step_NNNNNNNNN (CheckpointManager): none was written
    assert not any((tmp_path / "nan" / "checkpoints").glob("step_*"))
    # clipping is on (clip_norm 1.0): the advice is a smaller clip_norm, not to enable it
    assert trainer.opts.clip_norm == 1.0
    assert "enable clip_norm" not in str(err.value)
    assert "a smaller clip_norm (now 1.0)" in str(err.value)


def test_a_non_finite_loss_without_clipping_advises_enabling_it(tmp_path, monkeypatch):
    trainer = make_lm_trainer(tmp_path / "nan", "dyck", log_every=1, eval_every=100,
                              clip_norm=None)
    kind_loss = trainer.kind.loss

    def poisoned(model, batch, **kw):
        part = kind_loss(model, batch, **kw)
        part.total = part.total * float("inf")
        return part

    monkeypatch.setattr(trainer.kind, "loss", poisoned)
    with pytest.raises(FloatingPointError, match=r"at step 1; lower lr .* or enable clip_norm"):
        trainer.fit()


def test_the_steps_of_checked_data_run_inside_checked_inputs(tmp_path):
    trainer = make_lm_trainer(tmp_path / "lm", "dyck", steps=3, eval_every=100)
    assert trainer.inputs_checked
    seen = []
    forward = trainer.model.forward

    def recording(*args, **kwargs):
        seen.append(inputs_checked())
        return forward(*args, **kwargs)

    trainer.model.forward = recording
    trainer.fit()
    assert seen and all(seen[:2])  # the training steps; evaluation checks its own inputs
    # a model of unknown vocabulary checks its own inputs in every step
    assert not make_trainer(tmp_path / "clf", steps=3).inputs_checked


def test_bad_training_data_fail_when_the_trainer_is_built(tmp_path):
    task = get_task("dyck", **LM_TASKS["dyck"])
    train, test = task.split("random", 32, 8, seed=1)
    info = task.info()
    config = TransformerConfig(vocab_size=info["vocab_size"], d_model=16, n_heads=2,
                               n_layers=1, d_ff=32, max_len=task.max_len, pad_id=info["pad_id"])
    kind = get_kind(task.kind)
    data = dict(train.tensors)
    data["inputs"] = data["inputs"].clone()
    data["inputs"][3, 2] = info["vocab_size"] + 4
    with pytest.raises(ValueError, match=rf"'inputs': token ids must lie in \[0, "
                                         rf"{info['vocab_size']}\); got range \[0, "
                                         rf"{info['vocab_size'] + 4}\]"):
        Trainer(kind.build_model(config, task), data, test.tensors, kind=kind,
                options=TrainOptions(**OPTIONS), run_dir=tmp_path / "bad")
    grades = {"token_grades": torch.full(data["inputs"].shape, -1.0)}
    with pytest.raises(ValueError, match=r"'token_grades' must be finite and >= 0"):
        kind.check_data(kind.build_model(config, task), {**train.tensors, **grades})


def test_a_padding_mask_without_padding_is_dropped_on_the_host(tmp_path):
    """Inside checked_inputs a model takes a mask as given; the trainer drops one that masks
    nothing, so the steps keep the fused kernels' mask-free path without reading the device."""
    plain = make_lm_trainer(tmp_path / "plain", "dyck", eval_every=100)
    data = dict(plain.train_data)
    data.pop("key_padding_mask", None)
    plain.train_data = data
    masked = make_lm_trainer(tmp_path / "masked", "dyck", eval_every=100)
    masked.train_data = {**data, "key_padding_mask": torch.zeros_like(data["inputs"],
                                                                      dtype=torch.bool)}
    seen = []
    forward = masked.model.forward

    def recording(ids, mask=None, **kwargs):
        if masked.model.training:  # the training steps (evaluation reads its own data)
            seen.append(mask)
        return forward(ids, mask, **kwargs)

    masked.model.forward = recording
    assert masked.fit().losses == plain.fit().losses
    assert seen and all(m is None for m in seen)


@pytest.mark.parametrize("grading", [{}, dict(grading="linear", learnable_grades=True)])
def test_a_training_step_reads_only_host_tensors(tmp_path, grading):
    """A step counts its items and targets on the host batch; from the batch's move to the
    device to the optimizer step nothing reads a value (on a GPU: no wait). The reads of
    a step on the CPU are attributed to their code: only the host counts, and AdamW's step
    counters (CPU tensors on a GPU too)."""
    from host_reads import HostReads

    trainer = make_lm_trainer(tmp_path, "dyck", steps=3, eval_every=100, config=grading)
    loss = trainer.kind.loss
    inside: list[list[str]] = []

    def recorded(*args, **kwargs):
        with HostReads() as reads:
            part = loss(*args, **kwargs)
        inside.append(reads.sites)
        return part

    trainer.kind = copy.copy(trainer.kind)
    trainer.kind.loss = recorded
    step = trainer._train_step
    sites: list[str] = []

    def strict(i):
        with HostReads() as reads:
            out = step(i)
        sites.extend(reads.sites)
        return out

    trainer._train_step = strict
    trainer.fit()
    assert len(inside) == 3 and inside == [[], [], []]
    allowed = ("loss_count", "count_items", "drop_empty_padding",
               "optimizer.py:_get_value")
    assert sites and all(any(a in s for a in allowed) for s in sites), sites


@pytest.mark.parametrize("kind_name", ["lm", "classification"])
def test_evaluation_checks_its_data_once_and_reads_the_device_once(kind_name, monkeypatch):
    """``graded.train.evaluate`` checks the data once, runs the batches inside
    ``checked_inputs``, counts each batch's items on its host slice and keeps the loss and the
    predictions on the device: the model and the loss read no value in any batch, the only
    device read is the summed loss at the end, and the figures are those of a batch of all."""
    from graded.train import evaluate
    from host_reads import HostReads

    kind_tasks = {"lm": ("dyck", dict(max_length=10)), "classification": ("listops", {})}
    name, options = kind_tasks[kind_name]
    t = get_task(name, **options)
    info = t.info()
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=info["vocab_size"], d_model=16, n_heads=2, n_layers=1,
                               d_ff=32, max_len=t.max_len + 4, positional="learned",
                               pad_id=info["pad_id"])
    kind = get_kind(kind_name)
    model = kind.build_model(config, t)
    data = t.generate(20, seed=1).tensors
    inside: list[str] = []
    for method in ("forward", "output_loss"):
        original = getattr(type(kind), method)

        def recorded(self, *args, _original=original, **kwargs):
            with HostReads() as reads:
                out = _original(self, *args, **kwargs)
            inside.extend(reads.sites)
            return out

        monkeypatch.setattr(type(kind), method, recorded)
    seen = []
    check = type(kind).check_data
    monkeypatch.setattr(type(kind), "check_data",
                        lambda self, m, d: seen.append(1) or check(self, m, d))
    with HostReads() as reads:
        small = evaluate(model, data, kind, batch_size=6)  # 6 + 6 + 6 + 2 rows
    assert inside == [] and seen == [1]
    # evaluate itself reads float(total) once; the other reads are of the host data (its
    # check, the counts, the padding masks) and of the predictions on the CPU (the metrics)
    where = [s.split(" <- ")[0].split(" in ")[1] for s in reads.sites]
    assert where.count("objectives.py:evaluate") == 1, reads.sites
    whole = evaluate(model, data, kind, batch_size=64)
    assert small["loss"] == pytest.approx(whole["loss"], rel=1e-5)


def test_graded_steps_find_the_gradings_without_walking_the_model(tmp_path):
    """The recipe's regularisation, loss weights and grade learning-rate bound find the
    model's gradings (``gradings``); inside ``fit`` they answer from the gradings held on entry
    (``held_gradings``) instead of walking the modules three times a step."""
    task = get_task("dyck", **LM_TASKS["dyck"])
    train, test = task.split("random", 96, 32, seed=1)
    info = task.info()
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=info["vocab_size"], d_model=16, n_heads=2,
                               n_layers=1, d_ff=32, max_len=task.max_len, positional="learned",
                               pad_id=info["pad_id"], grading="exponential",
                               learnable_grades=True)
    kind = get_kind(task.kind)
    model = kind.build_model(config, task)
    trainer = Trainer(model, train.tensors, test.tensors, kind=kind,
                      options=TrainOptions(**{**OPTIONS, "steps": 4, "log_every": 100,
                                              "eval_every": 100}),
                      run_dir=tmp_path / "run", seed=0, recipe=get_recipe("egt-alg7.1"))
    walks: list[int] = []
    named_modules = model.named_modules

    def counting(*args, **kwargs):
        walks.append(1)
        return named_modules(*args, **kwargs)

    step = trainer._train_step
    per_step: list[int] = []

    def counted_step(i):
        before = len(walks)
        out = step(i)
        per_step.append(len(walks) - before)
        return out

    model.named_modules = counting
    trainer._train_step = counted_step
    trainer.fit()
    assert per_step == [0, 0, 0, 0]
    # outside fit, each call walks again (a model changed between calls is seen)
    before = len(walks)
    trainer.recipe.regularization(model)
    assert len(walks) == before + 1
