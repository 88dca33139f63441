"""`graded generate` on runs whose model grades tokens (TransformerConfig.token_grading): the
task grades the prompt, and each generated token, as its datasets grade the same sequence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from cli_configs import TINY_MODEL, tiny_config

from graded.cli import main
from graded.config import build_model, load_run_config
from graded.tasks.dyck import DyckLM
from graded.train.checkpoint import CheckpointManager, load_checkpoint
from graded.transformer.models import TransformerDecoder, TransformerEncoder

GRADED_MODEL = {**TINY_MODEL, "grading": "exponential", "token_grading": True}


def _trained(tmp: Path, task: dict | None = None, recipe: dict | None = None) -> Path:
    path = tiny_config(tmp, model=dict(GRADED_MODEL))
    if task is not None or recipe is not None:
        cfg = yaml.safe_load(path.read_text())
        if task is not None:
            cfg["task"] = {"n_train": 64, "n_eval": 32, **task}
        if recipe is not None:
            cfg["recipe"] = recipe
        path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    return tmp / "runs" / "tiny"


def _loaded(run: Path):
    cfg = load_run_config(run)
    model = build_model(cfg, cfg.built_task).eval()
    load_checkpoint(CheckpointManager(run / "checkpoints").best(), model, restore_rng=False)
    return cfg.built_task, model


def _first_example(task, key="inputs", mask="key_padding_mask", grades="token_grades"):
    data = task.generate(4, seed=7)
    keep = ~data.tensors[mask][0]
    return data.tensors[key][0][keep].tolist(), data.tensors[grades][0][keep].tolist()


@pytest.fixture(scope="module")
def graded_lm_run(tmp_path_factory) -> Path:
    return _trained(tmp_path_factory.mktemp("graded_lm"))


def test_generate_with_a_token_graded_lm_grades_as_the_dyck_dataset(graded_lm_run, capsys,
                                                                    monkeypatch):
    """The prompt is a prefix of a dataset example (its grades are the dataset's); every token
    fed to the model, generated ones included, is graded as the dataset grades the whole
    sequence, and the text is what a naive loop regrading with the dataset's encoding gives."""
    task, model = _loaded(graded_lm_run)
    example, example_grades = _first_example(task)
    prompt = example[:4]  # <bos> and three brackets
    assert task.grade_tokens(task.vocab.decode(prompt)) == example_grades[:4]
    grades_seen = []
    forward = type(model).forward

    def recording(self, ids, *args, **kwargs):
        grades_seen.append((ids[0].tolist(), kwargs["token_grades"][0].tolist()))
        return forward(self, ids, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", recording)
    capsys.readouterr()
    assert main(["generate", str(graded_lm_run), "--prompt", task.vocab.decode_str(prompt),
                 "--max-new-tokens", "4"]) == 0
    text = capsys.readouterr().out.strip()
    monkeypatch.undo()
    fed = [t for ids, _ in grades_seen for t in ids]
    fed_grades = [g for _, grades in grades_seen for g in grades]
    assert fed[:4] == prompt and fed_grades[:4] == example_grades[:4]
    # the dataset's grades of the same sequence: DyckLM encodes <bos> word <eos>
    dataset = task._encode_words([task.vocab.decode(fed[1:], skip_pad=False)])
    assert fed_grades == dataset["token_grades"][0, :len(fed)].tolist()
    seq, eos = list(prompt), task.vocab.id("<eos>")
    with torch.no_grad():
        for _ in range(4):
            grades = task._encode_words([task.vocab.decode(seq[1:], skip_pad=False)])
            logits = model(torch.tensor([seq]),
                           token_grades=grades["token_grades"][:, :len(seq)])
            seq.append(int(logits[0, -1].argmax()))
            if seq[-1] == eos:
                break
    assert text == task.vocab.decode_str(seq)


def test_a_task_that_cannot_grade_a_continuation_is_named(graded_lm_run, capsys, monkeypatch):
    monkeypatch.setattr(DyckLM, "causal_grades", False)
    assert main(["generate", str(graded_lm_run), "--prompt", "( [", "--max-new-tokens",
                 "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "graded: error: task 'dyck' cannot grade a continuation: the grade of a token depends "
        "on tokens after it, so a generated token has no grade when the next one is chosen, "
        "and this model grades tokens (TransformerConfig.token_grading=True)")


def test_a_token_graded_classifier_answers_with_the_datasets_grades(tmp_path, capsys):
    # a classifier's graded loss needs output grades the task has not: the plain loss, asked
    run = _trained(tmp_path, {"name": "dyck_recognition",
                              "options": {"max_length": 8, "max_depth": 3}},
                   recipe={"name": "auto", "options": {"graded_loss": False}})
    task, model = _loaded(run)
    ids, grades = _first_example(task)
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", task.vocab.decode_str(ids)]) == 0
    answer = json.loads(capsys.readouterr().out)
    with torch.no_grad():
        probs = model(torch.tensor([ids]), token_grades=torch.tensor([grades]))[0].softmax(-1)
    assert answer == {"class": int(probs.argmax()),
                      "probabilities": [round(float(p), 4) for p in probs]}


def test_a_token_graded_seq2seq_grades_source_and_decoder_as_the_dataset(tmp_path, capsys,
                                                                         monkeypatch):
    run = _trained(tmp_path, {"name": "polynomials_seq2seq", "options": {"max_degree": 2}})
    task, model = _loaded(run)
    src, src_grades = _first_example(task)
    dec, dec_grades = _first_example(task, "decoder_inputs", "decoder_key_padding_mask",
                                     "decoder_token_grades")
    seen = {"encoder": [], "decoder": []}
    for name, module in (("encoder", TransformerEncoder), ("decoder", TransformerDecoder)):
        forward = module.forward

        def recording(self, ids, *args, _forward=forward, _name=name, **kwargs):
            seen[_name].append((ids[0].tolist(), kwargs))
            return _forward(self, ids, *args, **kwargs)

        monkeypatch.setattr(module, "forward", recording)
    grading = type(model.encoder.token_grading)
    graded = []
    grading_forward = grading.forward

    def grading_recording(self, token_grades, batch, length):
        graded.append(token_grades[0].tolist())
        return grading_forward(self, token_grades, batch, length)

    monkeypatch.setattr(grading, "forward", grading_recording)
    assert main(["generate", str(run), "--prompt", task.vocab.decode_str(src),
                 "--max-new-tokens", "3"]) == 0
    monkeypatch.undo()
    assert seen["encoder"][0][0] == src and graded[0] == src_grades
    fed = [t for ids, _ in seen["decoder"] for t in ids]
    fed_grades = [g for grades in graded[1:] for g in grades]
    assert fed[0] == dec[0] and fed_grades[0] == dec_grades[0]  # <bos>, grade 0
    assert fed_grades == task.grade_tokens(task.vocab.decode(fed, skip_pad=False))
