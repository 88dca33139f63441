"""Trainer behaviour: exact resume, determinism, accumulation, schedules, outputs, stopping."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest
import torch
from tiny_training import TinyClassifier, make_data, make_lm_trainer, make_trainer

from graded.train.checkpoint import CheckpointManager
from graded.train.logging import read_metrics
from graded.train.objectives import evaluate
from graded.train.options import TrainOptions
from graded.train.trainer import Trainer


def test_resumed_run_has_identical_losses_to_uninterrupted_run(tmp_path):
    full = make_trainer(tmp_path / "full", steps=12).fit()
    first = make_trainer(tmp_path / "part", steps=12).fit(pause_after=5)
    # A fresh process-like trainer for the full length resumes from the step-5 checkpoint.
    second = make_trainer(tmp_path / "part", steps=12, seed=0).fit(resume_from=tmp_path / "part")
    assert first.step == 5 and second.step == 12
    assert first.losses + second.losses == full.losses  # bitwise equal, dropout included
    assert second.final_eval == full.final_eval


def test_resume_mid_epoch_sees_the_same_batches(tmp_path):
    # 96 examples / batch 16 = 6 steps per epoch: stopping at 7 resumes inside epoch 1.
    full = make_trainer(tmp_path / "a", steps=10, batch_size=16).fit()
    make_trainer(tmp_path / "b", steps=10, batch_size=16).fit(pause_after=7)
    rest = make_trainer(tmp_path / "b", steps=10, batch_size=16).fit(resume_from=tmp_path / "b")
    assert rest.losses == full.losses[7:]


def test_a_ctrl_c_during_the_last_save_lets_it_finish_and_the_run_resumes_from_it(
        tmp_path, monkeypatch):
    """A SIGINT while the checkpoint of a pause is written (after the last step, not between
    steps) is the first Ctrl-C: the save finishes, and the run resumes from it as if never
    stopped, not from the checkpoint before it."""
    full = make_trainer(tmp_path / "full", steps=12).fit()
    save = CheckpointManager.save

    def signalled_save(self, step, *args, **kwargs):
        if step == 6:
            os.kill(os.getpid(), signal.SIGINT)  # delivered before the files are written
        return save(self, step, *args, **kwargs)

    monkeypatch.setattr(CheckpointManager, "save", signalled_save)
    try:
        first = make_trainer(tmp_path / "part", steps=12).fit(pause_after=6)
    except KeyboardInterrupt:
        pytest.fail("the first Ctrl-C aborted the save")
    monkeypatch.setattr(CheckpointManager, "save", save)
    assert first.step == 6
    assert CheckpointManager(tmp_path / "part" / "checkpoints").latest().name == "step_000000006"
    rest = make_trainer(tmp_path / "part", steps=12).fit(resume_from=tmp_path / "part")
    assert first.losses + rest.losses == full.losses


def test_same_seed_gives_identical_losses_and_other_seed_differs(tmp_path):
    a = make_trainer(tmp_path / "a", seed=3).fit().losses
    b = make_trainer(tmp_path / "b", seed=3).fit().losses
    c = make_trainer(tmp_path / "c", seed=4).fit().losses
    assert a == b
    assert a != c


def test_gradient_accumulation_matches_the_full_batch_step(tmp_path):
    one = make_trainer(tmp_path / "a", dropout=0.0, grad_accum=1).fit().losses
    four = make_trainer(tmp_path / "b", dropout=0.0, grad_accum=4).fit().losses
    assert torch.allclose(torch.tensor(one), torch.tensor(four), rtol=1e-5, atol=1e-6)


def test_run_folder_has_csv_tensorboard_metrics_json_and_checkpoint(tmp_path):
    result = make_trainer(tmp_path, tensorboard=True).fit()
    metrics = read_metrics(tmp_path)
    assert [s for s, _ in metrics["train"]["loss"]] == [2, 4, 6, 8, 10, 12]
    assert [s for s, _ in metrics["eval"]["accuracy"]] == [4, 8, 12]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["step"] == 12 and summary["eval"] == result.final_eval
    assert CheckpointManager(tmp_path / "checkpoints").latest().name == "step_000000012"
    assert result.best_checkpoint is not None


@pytest.mark.parametrize("tensorboard", [True, False])
def test_a_resume_leaves_tensorboard_no_scalar_of_the_abandoned_steps(tmp_path, tensorboard):
    """A run logs 12 steps to TensorBoard and is resumed from its step-4 checkpoint (a
    checkpoint folder named: the steps after it are abandoned), with TensorBoard on or off.
    Read back with TensorBoard's own reader, the training losses are metrics.csv's: the
    resumed run's after step 4 (TensorBoard on), none after it (off), never the abandoned
    run's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    full = make_trainer(tmp_path, tensorboard=True, keep_last=5).fit()
    began = int(time.time())  # TensorBoard reads event files in name order, which starts
    while int(time.time()) == began:  # with the second a file was opened
        time.sleep(0.05)
    resumed = make_trainer(tmp_path, tensorboard=tensorboard, lr=1e-3)
    rest = resumed.fit(resume_from=tmp_path / "checkpoints" / "step_000000004")
    assert rest.losses != full.losses[4:]  # another lr: the abandoned steps' values differ
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    shown = [(e.step, e.value) for e in events.Scalars("train/loss")]
    logged = read_metrics(tmp_path)["train"]["loss"]
    assert [s for s, _ in shown] == [s for s, _ in logged if tensorboard or s <= 4]
    assert all(v == pytest.approx(w, rel=1e-6) for (_, v), (_, w) in zip(shown, logged))


def test_a_new_run_in_the_folder_of_an_earlier_one_shows_tensorboard_none_of_its_scalars(
        tmp_path):
    """A run that ended before its first checkpoint (it diverged, or was killed) is trained
    anew in its folder, with another lr. TensorBoard's own reader shows the new run's losses,
    those of metrics.csv, not both runs' at the same steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    earlier = make_trainer(tmp_path, tensorboard=True).fit()
    shutil.rmtree(tmp_path / "checkpoints")  # what a run ended before its first one leaves
    began = int(time.time())  # event files are read in name order, which starts with the
    while int(time.time()) == began:  # second a file was opened
        time.sleep(0.05)
    again = make_trainer(tmp_path, tensorboard=True, lr=1e-3).fit()
    assert again.losses != earlier.losses
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    shown = [(e.step, e.value) for e in events.Scalars("train/loss")]
    logged = read_metrics(tmp_path)["train"]["loss"]
    assert [s for s, _ in shown] == [s for s, _ in logged] == [2, 4, 6, 8, 10, 12]
    assert all(v == pytest.approx(w, rel=1e-6) for (_, v), (_, w) in zip(shown, logged))


def test_early_stopping_stops_after_patience_evaluations_without_improvement(tmp_path):
    # lr tiny and monitor = accuracy with a huge min_delta: never improves after the first eval.
    trainer = make_trainer(tmp_path, steps=40, eval_every=2, lr=1e-6, monitor="accuracy",
                           monitor_mode="max", early_stopping={"patience": 3, "min_delta": 1.0})
    result = trainer.fit()
    assert result.early_stopped
    assert result.step == 2 * (1 + 3)


def test_an_early_stopped_run_resumes_stopped_and_a_larger_patience_continues_it(tmp_path):
    # never improves after the first evaluation (see the test above): stops at step 2·(1+3)
    opts = {"steps": 40, "eval_every": 2, "lr": 1e-6, "monitor": "accuracy",
            "monitor_mode": "max"}
    stop3 = {**opts, "early_stopping": {"patience": 3, "min_delta": 1.0}}
    stop5 = {**opts, "early_stopping": {"patience": 5, "min_delta": 1.0}}
    first = make_trainer(tmp_path / "run", **stop3).fit()
    assert first.early_stopped and first.step == 8
    csv = (tmp_path / "run" / "metrics.csv").read_text()
    # resumed unchanged, it is the run that stopped: no step, nothing rewritten
    again = make_trainer(tmp_path / "run", **stop3).fit(resume_from=tmp_path / "run")
    assert again.early_stopped and again.step == 8 and again.losses == []
    assert (tmp_path / "run" / "metrics.csv").read_text() == csv
    assert CheckpointManager(tmp_path / "run" / "checkpoints").latest().name == "step_000000008"
    # a larger patience continues it exactly as an uninterrupted run with that patience
    longer = make_trainer(tmp_path / "run", **stop5).fit(resume_from=tmp_path / "run")
    full = make_trainer(tmp_path / "full", **stop5).fit()
    assert full.early_stopped and full.step == 2 * (1 + 5)
    assert longer.early_stopped and longer.step == full.step
    assert first.losses + longer.losses == full.losses


def test_monitoring_accuracy_keeps_the_most_accurate_checkpoint_by_default(tmp_path):
    # monitor_mode used to default to "min" whatever the monitor: the least accurate
    # checkpoint was kept as best, and early stopping waited for accuracy to fall
    result = make_trainer(tmp_path, steps=24, eval_every=2, lr=1e-2, monitor="accuracy",
                          keep_last=1).fit()
    curve = read_metrics(tmp_path)["eval"]["accuracy"]
    top = max(v for _, v in curve)
    assert top > min(v for _, v in curve)  # the choice matters here
    first_top = next(s for s, v in curve if v == top)
    assert result.best_metric == top
    assert result.best_checkpoint.name == f"step_{first_top:09d}"
    assert json.loads((tmp_path / "checkpoints" / "best.json").read_text())["step"] == first_top


def test_a_monitor_mode_against_the_metric_is_kept_and_warned_about(tmp_path):
    with pytest.warns(RuntimeWarning, match=r"train\.monitor_mode='min' with "
                                            r"train\.monitor='accuracy': the best checkpoint "
                                            r"is the one with the lowest accuracy"):
        trainer = make_trainer(tmp_path, monitor="accuracy", monitor_mode="min")
    assert trainer.opts.monitor_mode == "min"


@pytest.mark.parametrize("task_name", [None, "dyck"])
def test_monitor_is_one_of_the_names_the_evaluation_reports(tmp_path, task_name):
    def trainer(run_dir, **options):
        if task_name is None:  # classification
            return make_trainer(run_dir, **options)
        return make_lm_trainer(run_dir, task_name, **options)

    built = trainer(tmp_path / "probe")
    reported = evaluate(built.model, built.eval_data, built.kind)  # what the trainer will read
    for name in reported:
        trainer(tmp_path / name, monitor=name)  # each is accepted
    with pytest.raises(ValueError, match=r"train\.monitor='r2'") as exc:
        trainer(tmp_path / "bad", monitor="r2")
    assert str(exc.value).endswith("expected one of " + ", ".join(reported))
    assert not (tmp_path / "bad").exists()  # refused when built: nothing trained or written


def test_evaluate_classification_matches_a_direct_computation():
    torch.manual_seed(0)
    model = TinyClassifier(dropout=0.0).eval()
    data = make_data(50, 9)
    got = evaluate(model, data, "classification", batch_size=7)
    logits = model(data["inputs"])
    want_loss = torch.nn.functional.cross_entropy(logits, data["targets"]).item()
    want_acc = (logits.argmax(-1) == data["targets"]).float().mean().item()
    assert got["loss"] == pytest.approx(want_loss, rel=1e-5)
    assert got["accuracy"] == pytest.approx(want_acc)


def test_evaluate_regression_r2_is_the_column_average_of_its_definition():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    x = torch.randn(30, 2, 2)
    y = torch.randn(30, 2) * torch.tensor([1.0, 5.0])
    got = evaluate(model, {"inputs": x, "targets": y}, "regression", batch_size=8)
    with torch.no_grad():
        pred = model(x)
    r2s, sse_all = [], 0.0
    for j in range(2):
        sse = sum((float(pred[i, j]) - float(y[i, j])) ** 2 for i in range(30))
        mean = sum(float(y[i, j]) for i in range(30)) / 30
        sst = sum((float(y[i, j]) - mean) ** 2 for i in range(30))
        r2s.append(1 - sse / sst)
        sse_all += sse
    assert got["mse"] == pytest.approx(sse_all / 60, rel=1e-5)
    assert got["r2"] == pytest.approx(sum(r2s) / 2, rel=1e-5)


def test_lm_evaluation_ignores_padding_targets():
    class Echo(torch.nn.Module):  # predicts the input token: perfect on shifted-equal data
        def forward(self, x):
            return torch.nn.functional.one_hot(x, 5).float() * 10

    x = torch.tensor([[1, 2, 3, 4], [2, 2, 1, 0]])
    t = torch.tensor([[1, 2, 3, -100], [2, 2, 4, -100]])
    got = evaluate(Echo(), {"inputs": x, "targets": t}, "lm")
    assert got["token_accuracy"] == pytest.approx(5 / 6)
    assert got["exact_match"] == pytest.approx(0.5)
    only = torch.tensor([[False, False, True, True], [False, False, True, True]])
    masked = evaluate(Echo(), {"inputs": x, "targets": t, "metric_mask": only}, "lm")
    assert masked["masked_token_accuracy"] == pytest.approx(1 / 2)  # position 2 (3 ignored)
    assert masked["token_accuracy"] == got["token_accuracy"]


def test_morphic_protocol_model_is_trained_through_its_training_loss_with_its_mask(tmp_path):
    calls = []

    class ToyMorphic(torch.nn.Module):  # follows graded.kinds.MorphicModel
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(12, 12)

        def forward(self, input_ids, key_padding_mask=None):
            return self.embed(input_ids)

        def training_loss(self, input_ids, targets, key_padding_mask=None):
            calls.append((input_ids.shape[0], key_padding_mask is not None))
            loss = torch.nn.functional.cross_entropy(self(input_ids).flatten(0, 1),
                                                     targets.flatten())
            return loss, {"extra": 1.5, "loss": -1.0}

        def generate(self, input_ids, max_new_tokens, **sampling):
            return input_ids

    data = make_data(32, 1)
    mask = torch.zeros_like(data["inputs"], dtype=torch.bool)
    mask[:, -1] = True  # right padding: the mask reaches the model (one without any is dropped)
    lm = {"inputs": data["inputs"], "targets": data["inputs"].roll(-1, 1),
          "key_padding_mask": mask}
    opts = TrainOptions(steps=3, batch_size=8, eval_every=3, log_every=1, progress=False,
                        tensorboard=False, device="cpu")
    trainer = Trainer(ToyMorphic(), lm, lm, kind="lm", options=opts, run_dir=tmp_path)
    assert trainer.kind.architecture == "morphic"
    trainer.fit()
    assert calls == [(8, True)] * 3
    logged = read_metrics(tmp_path)["train"]
    assert [v for _, v in logged["extra"]] == [1.5, 1.5, 1.5]
    assert all(v > 0 for _, v in logged["loss"])  # the trainer's loss, not the model's "loss"


def test_bad_batch_size_is_rejected_naming_the_values(tmp_path):
    with pytest.raises(ValueError, match=r"batch size \(train.batch_size\) must be in "
                       r"\[1, 96\].*got 500"):
        make_trainer(tmp_path, batch_size=500)


@pytest.mark.parametrize("damage", ["a token outside the vocabulary", "a targets tensor short"])
def test_bad_evaluation_data_is_refused_when_the_trainer_is_built(tmp_path, damage):
    """Checked as the training data are, before any step: found at the first evaluation, it
    would end the run after eval_every steps that no checkpoint holds."""
    from graded import TransformerClassifier, TransformerConfig

    cfg = TransformerConfig(vocab_size=12, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                            max_len=8, positional="learned")
    eval_data = make_data(32, 2)
    if damage == "a token outside the vocabulary":
        eval_data["inputs"][3, 5] = 12
        expected = r"evaluation data: 'inputs': token ids must lie in \[0, 12\); got range " \
                   r"\[0, 12\]"
    else:
        eval_data["targets"] = eval_data["targets"][:30]
        expected = (r"evaluation data: dataset tensors disagree on their first dimension: "
                    r"\{'inputs': 32, 'targets': 30\}")
    with pytest.raises(ValueError, match=expected):
        Trainer(TransformerClassifier(cfg, 3), make_data(64, 1), eval_data,
                kind="classification", run_dir=tmp_path / "run",
                options=TrainOptions(steps=4, batch_size=16, progress=False, device="cpu"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("grading, recipe", [("linear", "lgt-alg5.1"),
                                             ("exponential", "egt-alg7.1")])
def test_graded_model_with_recipe_resumes_with_identical_losses(tmp_path, grading, recipe):
    from graded import TransformerClassifier, TransformerConfig
    from graded.train.recipes import get_recipe

    def trainer(run):
        torch.manual_seed(0)
        cfg = TransformerConfig(vocab_size=12, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                                max_len=8, positional="learned", grading=grading,
                                learnable_grades=True)
        opts = TrainOptions(steps=8, batch_size=16, lr=1e-2, eval_every=4, log_every=1,
                            progress=False, tensorboard=False, device="cpu", warmup_steps=1)
        return Trainer(TransformerClassifier(cfg, 3), make_data(64, 1), make_data(32, 2),
                       kind="classification", options=opts, run_dir=run, seed=0,
                       recipe=get_recipe(recipe), output_grades=[0.0, 1.0, 2.0])

    assert trainer(tmp_path / "check").graded_loss  # the graded loss of 000 Def 5.37 / 7.1
    full = trainer(tmp_path / "full").fit()
    first = trainer(tmp_path / "part").fit(pause_after=3)
    rest = trainer(tmp_path / "part").fit(resume_from=tmp_path / "part")
    assert first.losses + rest.losses == full.losses
    logged = read_metrics(tmp_path / "full")["train"]
    assert "grade_lr" in logged  # the recipe's on_step values are logged
    if grading == "exponential":  # λ annealed from 1 towards λ_max over the run (000 Alg. 7.1)
        lam = [v for _, v in logged["lambda"]]
        assert lam == sorted(lam) and lam[0] > 1.0


@pytest.mark.parametrize("task_name", ["dyck", "polynomials", "multiscale", "listops"])
def test_evaluate_agrees_with_graded_evaluation_metrics(task_name):
    from graded.config import build_model, build_task, validate_config
    from graded.evaluation import compute_metric
    from graded.kinds import get_kind
    from graded.train.objectives import predict

    cfg = validate_config({"task": {"name": task_name},
                           "model": {"d_model": 16, "n_heads": 2, "n_layers": 1,
                                     "positional": "learned"}})
    task = build_task(cfg)
    data = task.generate(40, seed=3)
    torch.manual_seed(0)
    model = build_model(cfg, task)
    got = evaluate(model, data.tensors, task.kind, batch_size=16)
    pred = predict(model, data.tensors, task.kind, batch_size=16)
    metrics = get_kind(task.kind).metrics_for(data)
    assert ("masked_token_accuracy" in metrics) == ("metric_mask" in data)
    for metric in metrics:
        assert got[metric] == pytest.approx(compute_metric(metric, pred, data), abs=1e-6), metric


def test_metrics_json_of_a_run_ended_by_an_error_or_an_abort_says_so(tmp_path):
    """A run that an exception ends still writes metrics.json (its figures so far); it names
    the error (the run report marks the run failed), and a second Ctrl-C (KeyboardInterrupt)
    reads as interrupted and aborted (status, as in the history), not as a run that ended
    normally."""
    from graded.train.report import write_runs_report

    failing = make_trainer(tmp_path / "failed")
    failing.evaluate = lambda: (_ for _ in ()).throw(RuntimeError("disk on fire"))
    with pytest.raises(RuntimeError, match="disk on fire"):
        failing.fit()
    summary = json.loads((tmp_path / "failed" / "metrics.json").read_text())
    assert summary["error"] == "RuntimeError: disk on fire" and summary["step"] == 4
    assert not summary["interrupted"]
    end = json.loads((tmp_path / "failed" / "history.jsonl").read_text().splitlines()[-1])
    assert end["event"] == "end" and end["status"] == "failed"
    assert end["error"] == "RuntimeError: disk on fire"

    aborted = make_trainer(tmp_path / "aborted")
    step = aborted._train_step

    def abort_at_3(s):
        if s == 2:  # the third step
            raise KeyboardInterrupt
        return step(s)

    aborted._train_step = abort_at_3
    with pytest.raises(KeyboardInterrupt):
        aborted.fit()
    summary = json.loads((tmp_path / "aborted" / "metrics.json").read_text())
    assert summary["interrupted"] and summary["step"] == 2 and summary["error"] is None
    assert summary["status"] == "aborted"
    end = json.loads((tmp_path / "aborted" / "history.jsonl").read_text().splitlines()[-1])
    assert end["event"] == "end" and end["status"] == "aborted"

    finished = make_trainer(tmp_path / "finished", steps=4).fit()
    summary = json.loads((tmp_path / "finished" / "metrics.json").read_text())
    assert summary["error"] is None and not summary["interrupted"] and finished.step == 4

    report = write_runs_report([tmp_path / "failed", tmp_path / "finished"], tmp_path / "rep")
    text = report.read_text()
    assert "| failed | 4 (failed) |" in text and "| finished | 4 |" in text
    assert "- failed failed at step 4: RuntimeError: disk on fire" in text
