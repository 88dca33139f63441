"""User-facing failures of the `graded` command line: one line on stderr, exit code 2."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from cli_configs import tiny_config

from graded.cli import DEFAULT_NEW_TOKENS, main


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cli_errors")
    assert main(["train", str(tiny_config(tmp))]) == 0
    return tmp / "runs" / "tiny"


def _max_len(run: Path) -> int:
    from graded.config import load_run_config

    return load_run_config(run).built_model_config.max_len


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("graded: error: "), err
    assert "Traceback" not in err, err
    return lines[-1]


def test_generate_out_of_the_box_fits_the_models_max_len(run, capsys):
    max_len = _max_len(run)
    assert max_len < 2 + DEFAULT_NEW_TOKENS  # the default alone would not fit
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "( ["]) == 0
    tokens = capsys.readouterr().out.split()
    assert tokens[:2] == ["(", "["] and len(tokens) <= max_len


def test_generate_refuses_a_prompt_that_fills_max_len(run, capsys):
    max_len = _max_len(run)
    prompt = " ".join(["("] * max_len)
    assert main(["generate", str(run), "--prompt", prompt]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"max_len={max_len}" in line and "--prompt" in line


def test_generate_refuses_more_new_tokens_than_fit(run, capsys):
    max_len = _max_len(run)
    assert main(["generate", str(run), "--prompt", "(", "--max-new-tokens", str(max_len)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"--max-new-tokens {max_len} does not fit" in line
    assert f"room for {max_len - 1}" in line


def test_generate_names_a_token_outside_the_vocabulary(run, capsys):
    assert main(["generate", str(run), "--prompt", "( banana"]) == 2
    assert "banana" in _one_error_line(capsys.readouterr().err)


def test_generate_refuses_the_padding_token_in_a_prompt(run, capsys):
    # the model never reads padding as input (it is masked in training and evaluation); the
    # generated text, which drops padding, would hide that it was there
    from graded.config import load_run_config

    pad = load_run_config(run).built_task.vocab.pad
    assert main(["generate", str(run), "--prompt", f"( {pad} ["]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"graded: error: --prompt '( {pad} [': '{pad}' is the padding token, which the model "
        "never reads as input; give the prompt without it")


def test_generate_says_a_prompt_is_space_separated_tokens(run, capsys):
    assert main(["generate", str(run), "--prompt", "(["]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "unknown token '(['" in line and "separated by spaces" in line


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("--max-new-tokens", "0", "expected an integer >= 1, got 0"),
    ("--max-new-tokens", "many", "expected an integer, got 'many'"),
    ("--temperature", "-1", "expected a finite number > 0, got -1.0"),
    ("--top-p", "1.5", "expected a number in (0, 1], got 1.5"),
    ("--top-k", "0", "expected an integer >= 1, got 0"),
    ("--num-beams", "0", "expected an integer >= 1, got 0"),
    ("--repetition-penalty", "0", "expected a finite number > 0, got 0.0"),
    ("--no-repeat-ngram-size", "-1", "expected an integer >= 0, got -1"),
    ("--min-new-tokens", "x", "expected an integer, got 'x'"),
])
def test_generate_argument_out_of_range_is_a_usage_error(run, capsys, option, value, expected):
    with pytest.raises(SystemExit) as exc:
        main(["generate", str(run), "--prompt", "(", option, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert option in err and expected in err and "Traceback" not in err


@pytest.mark.parametrize("options", [["--temperature", "5"], ["--top-k", "2"],
                                     ["--top-p", "0.5", "--num-beams", "2"]])
def test_generate_refuses_sampling_options_without_sample(run, capsys, options):
    # greedy decoding and beam search read none of them: the output was the greedy one, as if
    # the option had not been given
    assert main(["generate", str(run), "--prompt", "(", *options]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert options[0] in line and "--sample" in line
    assert main(["generate", str(run), "--prompt", "(", "--sample", *options[:2]]) == 0


@pytest.mark.parametrize("options", [["--seed", "3"], ["--seed", "0"],
                                     ["--seed", "1", "--num-beams", "2"]])
def test_generate_refuses_a_seed_without_sample(run, capsys, options):
    # greedy decoding and beam search draw nothing: the seed seeded a generator no step read,
    # and the output was the same whatever the seed (an explicit --seed 0, the default, too)
    assert main(["generate", str(run), "--prompt", "(", *options]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--seed" in line and "--sample" in line
    assert main(["generate", str(run), "--prompt", "(", "--sample", *options[:2]]) == 0


def test_generate_never_emits_the_padding_token(run, capsys):
    # near-uniform sampling drew <pad>, which the printed text drops: fewer tokens than asked
    # for, and the model went on reading a token it never reads
    new = _max_len(run) - 1
    for seed in range(4):
        assert main(["generate", str(run), "--prompt", "(", "--sample", "--temperature", "1e4",
                     "--max-new-tokens", str(new), "--min-new-tokens", str(new),
                     "--seed", str(seed)]) == 0
        assert len(capsys.readouterr().out.split()) == 1 + new


@pytest.mark.parametrize("device", ["tpu7", "cpu:5"])
def test_unknown_device_is_a_config_error_before_anything_is_written(tmp_path, capsys, device):
    """``cpu:5`` was recorded and trained on the CPU, though the message lists no ``cpu:N``."""
    path = tiny_config(tmp_path)
    assert main(["train", str(path), "--set", f"train.device={device}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"graded: error: invalid config {path}:") and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (f"  train.device: device {device!r} is not "
                                            "supported: expected 'auto', 'cpu', 'cuda' or "
                                            "'cuda:N'")
    assert not (tmp_path / "runs").exists()


def test_output_folder_that_cannot_be_created_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    path = tiny_config(tmp_path)
    assert main(["train", str(path), "--set", f"output.dir={blocker}/runs"]) == 2
    assert str(blocker) in _one_error_line(capsys.readouterr().err)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores folder permissions")
def test_read_only_output_folder_is_a_one_line_error(tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        path = tiny_config(tmp_path)
        assert main(["train", str(path), "--set", f"output.dir={parent}"]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert str(parent) in line and "permission denied" in line
    finally:
        parent.chmod(0o700)


def test_eval_checkpoint_names_a_folder_of_the_run_or_the_ones_there(run, capsys):
    from graded.train.checkpoint import CheckpointManager

    folders = CheckpointManager(run / "checkpoints").folders()
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", folders[-1].name]) == 0  # inside the run
    assert json.loads(capsys.readouterr().out)["checkpoint"] == str(folders[-1])
    assert main(["eval", str(run), "--checkpoint", "step_9"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"graded: error: --checkpoint 'step_9': no such folder; expected 'best', 'latest', a "
        f"checkpoint folder of {run / 'checkpoints'} ({', '.join(p.name for p in folders)}) "
        "or a path to one")


def test_eval_of_a_run_whose_best_json_is_damaged_names_that_file(run, tmp_path, capsys):
    """A cut-short best.json is one error line naming it (not a bare JSON parser message);
    `--checkpoint latest` does not read it and still evaluates."""
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    best = copy / "checkpoints" / "best.json"
    best.write_text(best.read_text()[:12])
    capsys.readouterr()
    assert main(["eval", str(copy)]) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(
        f"graded: error: checkpoint file {best}: truncated, corrupt or unreadable (")
    assert main(["eval", str(copy), "--checkpoint", "latest"]) == 0


def test_eval_of_the_best_checkpoint_whose_folder_is_gone_says_so(run, tmp_path, capsys):
    """A best.json naming a deleted folder: `eval` evaluated the latest checkpoint instead,
    printing its figures as the best's; now one error line naming both."""
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    checkpoints = copy / "checkpoints"
    shutil.copytree(checkpoints / "step_000000002", checkpoints / "step_000000003")
    shutil.rmtree(checkpoints / "step_000000002")
    capsys.readouterr()
    assert main(["eval", str(copy)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(checkpoints / "best.json") in line and "step_000000002" in line
    assert "--checkpoint latest" in line
    assert main(["eval", str(copy), "--checkpoint", "latest"]) == 0


def test_eval_of_a_folder_without_a_run_is_a_one_line_error(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert str(tmp_path) in _one_error_line(capsys.readouterr().err)


def test_report_takes_a_folder_of_runs_and_names_one_without_any(run, tmp_path, capsys):
    """``graded report FOLDER``: every finished run directly inside, into FOLDER/report; a
    folder with no finished run is named in one error line."""
    runs = run.parent
    assert main(["report", str(runs)]) == 0
    text = (runs / "report" / "report.md").read_text()
    assert f"| {run.name} |" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert str(empty) in _one_error_line(capsys.readouterr().err)


def _trained(tmp: Path, task: dict) -> Path:
    """A tiny run of ``task`` (its section of the run config)."""
    path = tiny_config(tmp)
    cfg = yaml.safe_load(path.read_text())
    cfg["task"] = {"n_train": 64, "n_eval": 32, **task}
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    return tmp / "runs" / "tiny"


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory) -> Path:
    return _trained(tmp_path_factory.mktemp("classifier"),
                    {"name": "dyck_recognition", "options": {"max_length": 8, "max_depth": 3}})


def test_a_classifier_answers_a_prompt_that_fills_its_max_len(classifier_run, capsys):
    # it generates nothing, so an input as long as the longest it was trained on is fine
    import torch

    from graded.config import build_model, load_run_config
    from graded.train.checkpoint import CheckpointManager, load_checkpoint

    cfg = load_run_config(classifier_run)
    max_len = cfg.built_model_config.max_len
    tokens = ["(", "[", "]", ")"] * (max_len // 4) + ["("] * (max_len % 4)
    capsys.readouterr()
    assert main(["generate", str(classifier_run), "--prompt", " ".join(tokens)]) == 0
    answer = json.loads(capsys.readouterr().out)
    model = build_model(cfg, cfg.built_task).eval()
    load_checkpoint(CheckpointManager(classifier_run / "checkpoints").best(), model,
                    restore_rng=False)
    with torch.no_grad():
        probs = model(torch.tensor([cfg.built_task.vocab.encode(" ".join(tokens))]))[0].softmax(-1)
    assert answer == {"class": int(probs.argmax()),
                      "probabilities": [round(float(p), 4) for p in probs]}


@pytest.mark.parametrize("flags", [["--top-k", "2", "--sample"], ["--num-beams", "3"],
                                   ["--repetition-penalty", "2"], ["--max-new-tokens", "4"],
                                   ["--seed", "1", "--sample"], ["--min-new-tokens", "1"],
                                   ["--temperature", "0.5", "--top-p", "0.9", "--sample"],
                                   ["--no-repeat-ngram-size", "2"]])
def test_decoding_options_given_to_a_classifier_are_refused_naming_them(classifier_run, capsys,
                                                                        flags):
    """A classifier answers from the prompt alone: a decoding option would change nothing,
    so it is refused (it used to print the class as if it had been used)."""
    capsys.readouterr()
    assert main(["generate", str(classifier_run), "--prompt", "( )", *flags]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("graded: error: --")
    assert line.endswith("is classification, answered from the prompt alone with no token "
                         "generated, so decoding options are not used; leave them out")
    named = line.removeprefix("graded: error: ").split(": task ")[0].split(", ")
    expected = {"--top-k": "--top-k 2", "--sample": "--sample", "--num-beams": "--num-beams 3",
                "--repetition-penalty": "--repetition-penalty 2.0",
                "--max-new-tokens": "--max-new-tokens 4", "--seed": "--seed 1",
                "--min-new-tokens": "--min-new-tokens 1", "--temperature": "--temperature 0.5",
                "--top-p": "--top-p 0.9", "--no-repeat-ngram-size": "--no-repeat-ngram-size 2"}
    assert sorted(named) == sorted(expected[f] for f in flags if f.startswith("--"))


def test_sample_with_beams_given_to_a_classifier_is_refused_as_unused_options(classifier_run,
                                                                            capsys):
    """For a classifier the two flags are refused for what they are, decoding options it does
    not use (the conflict between them was named first, as if fixing it would help)."""
    from graded.config import load_run_config

    capsys.readouterr()
    assert main(["generate", str(classifier_run), "--prompt", "( )", "--sample",
                 "--num-beams", "2"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "graded: error: --sample, --num-beams 2: task " + load_run_config(
            classifier_run).built_task.name + " is classification, answered from the prompt "
        "alone with no token generated, so decoding options are not used; leave them out")


def test_a_classifier_prompt_longer_than_max_len_is_refused_naming_the_numbers(classifier_run,
                                                                              capsys):
    max_len = _max_len(classifier_run)
    assert main(["generate", str(classifier_run), "--prompt", " ".join(["("] * (max_len + 1))]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"graded: error: --prompt: the input's {max_len + 1} tokens do not fit the model's "
        f"max_len={max_len}; use a prompt of at most {max_len} tokens")


def test_a_seq2seq_source_longer_than_max_len_is_refused_naming_the_numbers(tmp_path, capsys):
    run = _trained(tmp_path, {"name": "polynomials_seq2seq", "options": {"max_degree": 2}})
    max_len = _max_len(run)
    assert main(["generate", str(run), "--prompt", " ".join(["1"] * (max_len + 1))]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"graded: error: --prompt: the source's {max_len + 1} tokens do not fit the model's "
        f"max_len={max_len}; use a prompt of at most {max_len} tokens")


def test_a_run_of_the_python_trainer_is_named_in_one_line_by_every_command(tmp_path, capsys):
    # its config.yaml records the kind and the model, not a task: the command line cannot
    # rebuild its data, and says so instead of listing the schema's complaints
    import torch

    from graded.train import Trainer, TrainOptions

    torch.manual_seed(0)
    x = torch.randn(32, 4)
    run = tmp_path / "mine"
    Trainer(torch.nn.Linear(4, 2), {"inputs": x, "targets": (x[:, 0] > 0).long()}, None,
            kind="classification", run_dir=run,
            options=TrainOptions(steps=2, batch_size=16, progress=False,
                                 tensorboard=False)).fit()
    assert yaml.safe_load((run / "config.yaml").read_text())["kind"] == "classification"
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    for argv in (["train", "--resume", str(run)], ["eval", str(run)],
                 ["generate", str(run), "--prompt", "a"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        line = _one_error_line(err)
        assert f"{run} is a run of the Python Trainer" in line and "'classification'" in line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files


def test_a_report_folder_blocked_by_a_file_is_named_in_plain_words(run, tmp_path, capsys):
    # was "[Errno 17] File exists: '...'": the OS's wording, not what to do
    blocker = tmp_path / "taken"
    blocker.write_text("mine")
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(blocker)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == (f"graded: error: {blocker} exists and is not a folder: expected a folder "
                    "or a new path")
    assert main(["report", str(run), "--out", str(blocker / "sub")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{blocker / 'sub'}: a part of that path is a file" in line and "Errno" not in line
    assert blocker.read_text() == "mine"


def test_generate_passes_hugging_faces_processors_to_the_model(run, capsys):
    """The command's output equals the library's generation with the same options: the run's
    model, prompt and task end token (``graded.kinds``), the padding token banned, with each
    option changing nothing when off."""
    import torch

    from graded.cli.loading import _load_run
    from graded.kinds import as_kind

    _, task, model, _, _ = _load_run(run, "best")
    ids = torch.tensor([task.vocab.encode("( [ ( [")])
    kind = as_kind(task.kind, model)
    options = {"repetition_penalty": 3.0, "no_repeat_ngram_size": 1, "min_new_tokens": 2}
    with torch.no_grad():
        expected = kind.generate(model, task, ids, 3, **options)
    assert len(expected.split()) == 4 + 3
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "( [ ( [", "--max-new-tokens", "3",
                 "--repetition-penalty", "3", "--no-repeat-ngram-size", "1",
                 "--min-new-tokens", "2"]) == 0
    assert capsys.readouterr().out.strip() == expected
    new = expected.split()[4:]
    assert len(set(new)) == len(new) and not set(new) & {"(", "["}  # no token seen before
    assert main(["generate", str(run), "--prompt", "( [", "--max-new-tokens", "3",
                 "--repetition-penalty", "1"]) == 0
    plain = capsys.readouterr().out
    assert main(["generate", str(run), "--prompt", "( [", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out == plain


def test_generate_refuses_sample_with_beams_naming_the_flags_typed(run, capsys):
    # it said "beam search with do_sample=True is not supported", the Python parameter's name
    assert main(["generate", str(run), "--prompt", "(", "--sample", "--num-beams", "2"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == ("graded: error: --sample and --num-beams 2 cannot go together: beam search "
                    "does not sample; choose one (--num-beams 1 samples)")
    assert "do_sample" not in line and "num_beams" not in line
    for one in (["--sample"], ["--num-beams", "2"]):  # either alone generates
        assert main(["generate", str(run), "--prompt", "(", *one]) == 0


@pytest.mark.parametrize("options, subject", [
    (["--temperature", "5"], "--temperature is used only when sampling"),
    (["--temperature", "5", "--seed", "1"], "--temperature and --seed are used only when"),
    (["--temperature", "5", "--top-k", "2", "--seed", "1"],
     "--temperature, --top-k and --seed are used only when"),
])
def test_generate_sampling_options_without_sample_are_told_in_grammatical_english(
        run, capsys, options, subject):
    # "--temperature shape sampling, which is off": a plural verb after one flag
    assert main(["generate", str(run), "--prompt", "(", *options]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"graded: error: {subject}"), line
    assert ("leave it out" in line) == (len(options) == 2), line
