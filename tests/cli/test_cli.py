"""The `graded` command line: help texts, a tiny train/eval/generate/report, errors, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_configs import TINY_MODEL, tiny_config

from graded.cli import build_parser, main
from graded.train.checkpoint import CheckpointManager, load_checkpoint
from graded.train.logging import read_metrics

SUBCOMMANDS = ["train", "eval", "generate", "bench", "report", "demo", "search"]


def _tiny_config(tmp_path: Path, **train) -> Path:
    """An LGT with learnable grades, 6 steps, TensorBoard on."""
    options = {"steps": 6, "eval_every": 3, "tensorboard": True, **train}
    return tiny_config(tmp_path, model={**TINY_MODEL, "grading": "linear",
                                        "learnable_grades": True}, **options)


def test_top_level_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_each_subcommand_has_help(capsys, command):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: graded " + command in capsys.readouterr().out


def test_version_names_the_package_and_the_torch_build(capsys):
    import importlib.metadata

    import torch

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out.strip()
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    assert out == (f"graded {importlib.metadata.version('graded')} "
                   f"(torch {torch.__version__}, {build})")


def test_every_option_has_a_help_text():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.dest not in ("help", "search_command"):
                assert action.help, f"graded {name} {action.option_strings or action.dest}"


def test_help_states_each_default_once_and_only_when_it_says_something():
    """An option whose help states its default (``--max-new-tokens``: "default: 32, or fewer
    ...") is not followed by a second "(default: None)"; None, False and [] are not shown."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        formatter = p._get_formatter()
        for action in p._actions:
            if action.help is None:
                continue
            text = (formatter._get_help_string(action) or "").replace(
                "%(default)s", str(action.default))
            where = f"graded {name} {action.option_strings or action.dest}: {text!r}"
            assert text.count("(default") <= 1, where
            assert "(default: None)" not in text and "(default: False)" not in text, where
            assert "(default: [])" not in text, where
    generate = sub.choices["generate"].format_help()
    assert "--seed SEED           sampling seed (default: 0)" in generate


def test_console_script_runs():
    script = Path(sys.executable).with_name("graded")
    if not script.exists():
        pytest.skip("console script not installed in this environment")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "train" in done.stdout


def test_a_warning_is_one_line_without_the_library_source(tmp_path):
    """A warning of a run (a monitor_mode against its monitor) prints as ``graded: warning:
    ...``, not as the file, line and source text of the library code that raised it."""
    cfg = _tiny_config(tmp_path, monitor="token_accuracy", monitor_mode="min")
    done = subprocess.run([sys.executable, "-m", "graded.cli", "train", str(cfg)],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "GRADED_TRACEBACK"})
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if "monitor_mode" in ln]
    assert lines and lines[0].startswith("graded: warning: train.monitor_mode='min'"), lines
    assert ".py:" not in done.stderr and "Trainer(" not in done.stderr, done.stderr


def test_eval_with_another_runs_checkpoint_warns_in_the_commands_one_line_form(tmp_path,
                                                                              capsys):
    """Every warning of the command line reads ``graded: warning: ...``, as its errors read
    ``graded: error: ...``: also the one naming the keys another run's checkpoint differs in."""
    first = tiny_config(tmp_path, "first")
    second = tiny_config(tmp_path, "second")
    second.write_text(second.read_text().replace("name: second", "name: second\nseed: 1"))
    assert main(["train", str(first)]) == 0 and main(["train", str(second)]) == 0
    other = CheckpointManager(tmp_path / "runs" / "first" / "checkpoints").latest()
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "second"), "--checkpoint", str(other)]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"graded: warning: checkpoint {other} was trained with another config"
                          " than "), err
    assert "seed was 0, now 1" in err


def test_a_finished_train_writes_its_plots_into_the_run_unless_told_not_to(tmp_path, capsys):
    from graded.config.schema import OutputSection

    assert OutputSection().plots is True  # on by default
    assert main(["train", str(_tiny_config(tmp_path)), "--set", "output.plots=true"]) == 0
    run = tmp_path / "runs" / "tiny"
    assert f"plots: {run / 'report'}" in capsys.readouterr().out
    report = (run / "report" / "report.md").read_text()
    final = json.loads((run / "metrics.json").read_text())
    row = next(line for line in report.splitlines() if line.startswith("| tiny |"))
    assert f"| {final['step']} |" in row and f"{final['eval']['loss']:.4g}" in row
    for png in ("train_loss.png", "eval_loss.png", "grades_tiny.png"):  # LGT: grade plot too
        assert (run / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"]({png})" in report
    from graded.train.runs import MANIFEST_FILE  # written by graded: output.overwrite removes it

    assert "report" in json.loads((run / MANIFEST_FILE).read_text())["written"]

    assert main(["train", str(_tiny_config(tmp_path)), "--set", "name=quiet",
                 "--set", "output.plots=false"]) == 0
    assert (tmp_path / "runs" / "quiet" / "metrics.json").is_file()
    assert not (tmp_path / "runs" / "quiet" / "report").exists()


def test_tiny_train_writes_csv_tensorboard_metrics_and_checkpoint_then_eval_generate_report(
    tmp_path, capsys
):
    assert main(["train", str(_tiny_config(tmp_path))]) == 0
    run = tmp_path / "runs" / "tiny"
    assert yaml.safe_load((run / "config.yaml").read_text())["task"]["name"] == "dyck"
    assert [s for s, _ in read_metrics(run)["train"]["loss"]] == [1, 2, 3, 4, 5, 6]
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((run / "metrics.json").read_text())["step"] == 6
    assert (run / "grades.jsonl").read_text().count("\n") == 7  # step 0 and every step
    assert CheckpointManager(run / "checkpoints").latest().name == "step_000000006"
    capsys.readouterr()

    assert main(["eval", str(run), "--checkpoint", "latest", "--baselines"]) == 0
    ev = json.loads((run / "eval.json").read_text())
    final = json.loads((run / "metrics.json").read_text())["eval"]
    assert ev["metrics"]["loss"] == pytest.approx(final["loss"], rel=1e-5)
    assert set(ev["baselines"]) >= {"majority", "bigram"}
    # each baseline is scored by every metric the model is, not by one metric left unnamed
    from graded.config import build_data, load_run_config
    from graded.kinds import run_baselines

    cfg = load_run_config(run)
    train, test = build_data(cfg, cfg.built_task)
    for metric in set(ev["metrics"]) - {"loss", "perplexity"}:
        for name, score in run_baselines(train, test, metric=metric).items():
            assert ev["baselines"][name][metric] == score
    assert {m for b in ev["baselines"].values() for m in b} == set(ev["metrics"]) - {
        "loss", "perplexity"}

    assert main(["train", "--resume", str(run)]) == 0  # finished: nothing to do, nothing lost
    assert "nothing to do" in capsys.readouterr().out
    assert json.loads((run / "metrics.json").read_text())["eval"] == final

    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "( [", "--max-new-tokens", "3"]) == 0
    text = capsys.readouterr().out.strip().split()
    assert text[:2] == ["(", "["] and 2 < len(text) <= 5

    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").exists()
    assert (tmp_path / "rep" / "train_loss.png").exists()
    assert (tmp_path / "rep" / "grades_tiny.png").exists()


def test_report_tells_apart_runs_with_the_same_folder_name(tmp_path):
    # the demo's layout: <task>/lgt-seed0 twice; keyed by folder name, the second run's
    # curves and grade plot replaced the first's and one run's "(graded)" marked both
    for sub, config in (("a", tiny_config), ("b", _tiny_config)):  # plain, then LGT
        (tmp_path / sub).mkdir()
        assert main(["train", str(config(tmp_path / sub, steps=2))]) == 0
    runs = [tmp_path / sub / "runs" / "tiny" for sub in ("a", "b")]
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "rep")]) == 0
    rows = {line.split(" | ")[0].lstrip("| "): line
            for line in (tmp_path / "rep" / "report.md").read_text().splitlines()
            if line.startswith("| a/") or line.startswith("| b/")}
    labels = ["a/runs/tiny", "b/runs/tiny"]  # as many parent folders as tell them apart
    assert sorted(rows) == labels
    for run, label in zip(runs, labels, strict=True):
        summary = json.loads((run / "metrics.json").read_text())
        graded = summary["train_objective"] == "graded"
        loss = f"{summary['train_loss']:.4g}" + (" (graded)" if graded else "")
        assert f"| {label} | 2 | {loss} |" in rows[label]
    assert [json.loads((r / "metrics.json").read_text())["train_objective"] for r in runs] == [
        "plain", "graded"]
    assert (tmp_path / "rep" / "grades_b_runs_tiny.png").exists()  # the LGT's grades


def _written_run(folder: Path, **summary) -> Path:
    """A run folder as the trainer leaves it, without training: metrics.csv and metrics.json."""
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("step,split,name,value\n2,train,loss,0.5\n"
                                        "2,eval,accuracy,0.75\n")
    (folder / "metrics.json").write_text(json.dumps(
        {"step": 2, "steps": 2, "train_loss": 0.5, "train_objective": "plain",
         "eval": {"accuracy": 0.75}, "interrupted": False, "early_stopped": False,
         "error": None, **summary}))
    return folder


def test_report_says_which_runs_were_interrupted_or_stopped_early(tmp_path, capsys):
    # Ctrl-C writes metrics.json too: the report listed such a run as a finished one
    runs = [_written_run(tmp_path / "done"),
            _written_run(tmp_path / "cut", steps=1000, interrupted=True),
            _written_run(tmp_path / "early", steps=1000, early_stopped=True)]
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "| done | 2 | 0.5 | 0.75 |" in text
    assert "| cut | 2 (interrupted) | 0.5 | 0.75 |" in text
    assert "| early | 2 (stopped early) | 0.5 | 0.75 |" in text
    assert "- cut was interrupted at step 2 of 1000" in text
    assert "early was interrupted" not in text


def test_report_of_one_run_given_by_two_spellings_reports_it_once(tmp_path, monkeypatch):
    # `runs/a` and `/abs/runs/a` were two rows labelled by the whole absolute path
    run = _written_run(tmp_path / "runs" / "a")
    monkeypatch.chdir(tmp_path)
    assert main(["report", "runs/a", str(run), "--out", "rep"]) == 0
    rows = [ln for ln in (tmp_path / "rep" / "report.md").read_text().splitlines()
            if ln.startswith("| ") and not ln.startswith("| run ")]
    assert rows == ["| a | 2 | 0.5 | 0.75 |"]


def test_report_curves_draw_a_run_evaluated_once(tmp_path, monkeypatch):
    # a run shorter than eval_every is evaluated once, at its end: a line through one point
    # draws nothing, and its curve was missing from the plot while the legend named it
    import graded.train.report as report

    drawn = {}

    def save(fig, path, **kwargs):
        drawn[Path(path).name] = [
            (ln.get_label(), len(ln.get_xdata()) > 1 or ln.get_marker() not in ("None", "", None))
            for ax in fig.axes for ln in ax.get_lines()]
        return saving(fig, path, **kwargs)

    saving = report.save_figure
    monkeypatch.setattr(report, "save_figure", save)
    run = _written_run(tmp_path / "once")
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert drawn["eval_accuracy.png"] == [("once (n=1)", True)]
    assert drawn["train_loss.png"] == [("once (n=1)", True)]


MORPHIC_MODEL = {"architecture": "morphic", "morphic": {
    "grades": [{"label": "g0", "dim": 8, "index": 0}, {"label": "g1", "dim": 8, "index": 1}],
    "layers": [{"banded": [0, 1], "block": "linear", "router": {"rank": 4}}]}}


def test_report_with_a_morphic_run_whose_checkpoint_is_missing_writes_nothing(tmp_path, capsys):
    # a morphic run that ended before its first checkpoint: the report and its plots were
    # written, then the morphic diagnostics failed, leaving a report without them (exit 2)
    done = _written_run(tmp_path / "done")
    morphic = _written_run(tmp_path / "morphic", error="FloatingPointError: loss is nan")
    cfg = yaml.safe_load(tiny_config(tmp_path, model=MORPHIC_MODEL).read_text())
    (morphic / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["report", str(done), str(morphic), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert f"{morphic} has no checkpoint" in err and "Traceback" not in err
    assert not (tmp_path / "rep").exists()


def test_morphic_model_trains_through_its_training_loss_and_gets_its_diagnostics(tmp_path):
    path = _tiny_config(tmp_path, steps=3)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"] = MORPHIC_MODEL
    cfg["recipe"] = "plain"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    run = tmp_path / "runs" / "tiny"
    assert "routing_entropy" in read_metrics(run)["train"]  # reported by training_loss
    for extra in ([], ["--num-beams", "3"], ["--sample", "--top-p", "0.9"]):
        assert main(["generate", str(run), "--prompt", "( [", "--max-new-tokens", "3",
                     *extra]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "morphic_tiny" / "report.json").exists()
    assert "Morphic diagnostics" in (tmp_path / "rep" / "report.md").read_text()


def test_bad_config_fails_before_training_naming_the_key(tmp_path, capsys):
    path = _tiny_config(tmp_path)
    assert main(["train", str(path), "--set", "train.stesp=3"]) == 2
    err = capsys.readouterr().err
    assert "train.stesp: unknown key (did you mean 'steps'?)" in err
    assert not (tmp_path / "runs").exists()  # nothing was started


@pytest.mark.parametrize(("model", "bad", "expected"), [
    (None, "train.monitor=accuracy", "train.monitor='accuracy' is not reported by the "
     "evaluation of this lm run; expected one of loss, token_accuracy, exact_match, "
     "masked_token_accuracy, perplexity"),
    (MORPHIC_MODEL, "train.label_smoothing=0.1", "train.label_smoothing=0.1: a morphic LM "
     "trains through its own loss, which has no label smoothing; expected 0"),
])
def test_options_the_run_cannot_honour_fail_in_one_line_before_anything_is_written(
        tmp_path, capsys, model, bad, expected):
    # a monitor the evaluation does not report used to fail at the first evaluation, with a
    # KeyError traceback, after training and writing the run folder
    path = _tiny_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    if model is not None:
        cfg["model"], cfg["recipe"] = model, "plain"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path), "--set", bad]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"graded: error: {expected}"
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_existing_run_folder_is_not_overwritten_silently(tmp_path, capsys):
    path = _tiny_config(tmp_path, steps=2)
    assert main(["train", str(path)]) == 0
    assert main(["train", str(path)]) == 2
    assert "graded train --resume" in capsys.readouterr().err


def test_bench_rejects_unknown_names(capsys):
    assert main(["bench", "no_such_benchmark"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


def test_sigint_during_graded_train_saves_and_resume_finishes(tmp_path):
    path = _tiny_config(tmp_path, steps=100000, eval_every=100000, tensorboard=False)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "graded.cli", "train", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    run = tmp_path / "runs" / "tiny"
    # Wait until training is under way (the handler is installed by then); a loaded machine may
    # take long to import torch, and a SIGINT during the import would test nothing.
    deadline, started = time.monotonic() + 300, False
    while not started and time.monotonic() < deadline and proc.poll() is None:
        csv = run / "metrics.csv"
        started = csv.exists() and csv.read_text().count("\n") > 3
        time.sleep(0.05)
    if not started:
        proc.kill()
        pytest.fail(f"training did not start within 300 s: {proc.communicate()[1][-2000:]}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"resume with: graded train --resume {run}" in err
    ckpt = CheckpointManager(run / "checkpoints").latest()
    step = load_checkpoint(ckpt, _model_of(run), restore_rng=False)["step"]
    assert main(["train", "--resume", str(run), "--set", f"train.steps={step + 2}"]) == 0
    assert json.loads((run / "metrics.json").read_text())["step"] == step + 2


def _model_of(run: Path):
    from graded.config import build_model, build_task, load_config

    cfg = load_config(run / "config.yaml")
    return build_model(cfg, build_task(cfg))


# ----------------------------------------------------------------------------- demo


@pytest.mark.parametrize("quick", [False, True])
def test_every_demo_run_config_is_valid(tmp_path, quick):
    from graded.config import validate_config
    from graded.demo import MODELS, TASKS, run_config

    for task in TASKS:
        for model in MODELS:
            cfg = validate_config(run_config(task, model, 0, tmp_path, quick))
            grading = MODELS[model]["grading"]
            assert cfg.recipe_name() == {None: "plain", "linear": "lgt-alg5.1",
                                         "exponential": "egt-alg7.1"}[grading]


def test_demo_runs_train_on_the_graded_loss_where_the_targets_have_grades(tmp_path):
    """No run of the main job warns of a missing loss grading: LGT and EGT take the graded
    loss on weighted_projective (targets graded by their weights) and are asked for the
    plain loss on polynomial_regression (one ungraded target)."""
    from graded.config import build_run, validate_config
    from graded.demo import MODELS, TASKS, run_config

    for task, spec in TASKS.items():
        for model in MODELS:
            cfg = validate_config(run_config(task, model, 0, tmp_path, True))
            trainer = build_run(cfg, tmp_path / task / model).trainer
            assert trainer.plain_loss_note is None, (task, model)
            graded = MODELS[model]["grading"] is not None and spec.get("graded_loss", True)
            assert trainer.graded_loss == graded, (task, model)
    assert TASKS["weighted_projective"].get("graded_loss", True)


def test_demo_verdict_calls_a_difference_only_beyond_two_standard_errors():
    from graded.demo import _verdict

    base = [0.50, 0.52, 0.54]  # mean 0.52, std 0.02
    lines = _verdict("t", "r2", {"baseline": base, "LGT": [0.60, 0.62, 0.64],
                                 "EGT": [0.51, 0.53, 0.55]}, {"ridge": [0.3, 0.3, 0.3]})
    text = "\n".join(lines)
    # LGT: Δ = 0.10, SE = sqrt(2 · 0.02² / 3) ≈ 0.0163 -> better; EGT: Δ = 0.01 -> not.
    assert "best transformer is **LGT**" in text
    assert ("LGT is **better** than the ungraded transformer: Δ = +0.100 "
            "(standard error 0.016") in text
    assert "EGT is not distinguishable from the ungraded transformer: Δ = +0.010" in text
    assert "the best transformer beats it" in text
    # For a loss-like metric, lower is better.
    worse = "\n".join(_verdict("t", "mse", {"baseline": base, "LGT": [0.60, 0.62, 0.64]}, {}))
    assert "LGT is **worse** than" in worse and "best transformer is **baseline**" in worse


def test_demo_verdict_with_one_seed_calls_no_difference():
    # one seed per model has no sample spread: its "standard error" of 0 would call any
    # difference, however small, better or worse "beyond two standard errors"
    from graded.demo import _verdict

    text = "\n".join(_verdict("t", "r2", {"baseline": [0.52], "LGT": [0.53], "EGT": [0.40]},
                              {}))
    assert "**better**" not in text and "**worse**" not in text
    # the differences are still reported, as the plain subtraction gives them
    assert f"Δ = {0.53 - 0.52:+.3f}, not tested" in text
    assert f"Δ = {0.40 - 0.52:+.3f}, not tested" in text
    # and no spread is printed for it: a sample std of one value is undefined, not 0
    assert "best transformer is **LGT** (0.530)." in text


def test_demo_report_of_one_seed_prints_values_without_a_spread(tmp_path):
    from graded.demo import _fmt

    assert _fmt([0.25]) == "0.250" and _fmt([0.1, 0.3]) == "0.200 ± 0.141"
    assert _fmt([0.25, float("nan")]) == "0.250" and _fmt([]) == "–"


def test_demo_report_tables_come_from_the_results(tmp_path):
    from graded.demo import write_demo_report

    results = []
    for model, vals in {"baseline": [0.1, 0.3], "LGT": [0.5, 0.7]}.items():
        for seed, v in enumerate(vals):
            results.append({"task": "polynomial_regression", "model": model, "seed": seed,
                            "run_dir": str(tmp_path / f"{model}{seed}"), "metric_name": "r2",
                            "metric": v, "eval": {"r2": v, "mse": 1 - v}, "params": 10,
                            "train_s": 1.0})
    results.append({"task": "polynomial_regression", "model": "EGT", "seed": 0,
                    "run_dir": "", "error": "diverged: loss became nan"})
    for r in results[:-1]:
        Path(r["run_dir"]).mkdir()
        (Path(r["run_dir"]) / "metrics.csv").write_text(
            f"step,split,name,value\n1,eval,r2,{r['metric']}\n1,train,loss,1.0\n")
    budget = {"model_size": {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16},
              "batch_size": 4, "seeds": 2, "steps": {"polynomial_regression": 5,
                                                     "weighted_projective": 5},
              "n_train": {"polynomial_regression": 9, "weighted_projective": 9},
              "wall_s": 3.0, "workers": 1, "cpus": 2, "machine": "x", "python": "3",
              "quick": True}
    baselines = {"polynomial_regression": [{"mean": 0.0}, {"mean": 0.0}],
                 "weighted_projective": [{"mean": 0.0}]}
    text = write_demo_report(tmp_path, results, baselines, budget).read_text()
    assert "| baseline | 0.200 ± 0.141 |" in text  # mean and sample std of 0.1, 0.3
    assert "| LGT | 0.600 ± 0.141 |" in text
    assert "| EGT | not run: diverged: loss became nan |" in text
    assert "| *mean* (simple baseline) | 0.000 ± 0.000 |" in text
    assert (tmp_path / "polynomial_regression_eval_r2.png").exists()


# each starts the demo's processes (7 to 20 s on 2 cores): behind the slow marker (a signal to
# a training run is tested in the default run: test_sigint_during_graded_train_saves_...)
@pytest.mark.slow
@pytest.mark.parametrize(("sig", "workers"), [
    (signal.SIGINT, 2), (signal.SIGTERM, 2), (signal.SIGTERM, 1)])
def test_a_signal_to_the_demo_main_process_alone_stops_it_within_10_s(tmp_path, sig, workers):
    out = tmp_path / "demo"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "graded.cli", "demo", "--seeds", "1",
                             "--workers", str(workers), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline, started = time.monotonic() + 300, False
    while not started and time.monotonic() < deadline and proc.poll() is None:
        started = any(p.read_text().count("\n") > 3 for p in out.glob("*/*/metrics.csv"))
        time.sleep(0.05)
    if not started:
        proc.kill()
        pytest.fail(f"the demo did not start training within 300 s: {proc.communicate()[1]}")
    sent = time.monotonic()
    proc.send_signal(sig)  # to the main process only, not its process group
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("graded demo did not stop within 10 s of the signal")
    assert time.monotonic() - sent < 10
    assert proc.returncode == 130, err
    assert "interrupted:" in err and "runs finished" in err
    # the runs in progress wrote a checkpoint and say how to resume them from the CLI
    assert "resume with: graded train --resume" in err
    assert list(out.glob("*/*/checkpoints/step_*"))
