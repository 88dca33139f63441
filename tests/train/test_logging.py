"""The run logger's grade trajectories: one ``grades.jsonl`` line per call with the grades the
model holds at that call, on disk as soon as written; a resume drops the lines past its step."""

from __future__ import annotations

import pytest
import torch

from graded import TransformerConfig, TransformerLM
from graded.train.logging import RunLogger, grading_modules, read_grades, read_metrics


def graded_model() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(TransformerConfig(vocab_size=10, d_model=8, n_heads=2, n_layers=2,
                                           d_ff=16, max_len=8, grading="linear",
                                           learnable_grades=True))


def grades_now(model: torch.nn.Module) -> dict[str, list]:
    return {name: m.grades.detach().float().tolist()
            for name, m in grading_modules(model).items()}


def test_each_line_holds_the_grades_of_its_call_and_is_on_disk_at_once(tmp_path):
    model = graded_model()
    log = RunLogger(tmp_path, tensorboard=False)
    expected = []
    for step in (0, 5, 10):
        log.grades(step, model)
        expected.append({"step": step, "grades": grades_now(model)})
        assert read_grades(tmp_path) == expected  # before close
        with torch.no_grad():  # the grades move between log steps
            for m in grading_modules(model).values():
                m.grades.add_(0.25)
    log.close()
    assert expected[0]["grades"] != expected[1]["grades"]
    # a resume at step 5 keeps steps 0 and 5, and appends after them
    log = RunLogger(tmp_path, tensorboard=False, resume_step=5)
    log.grades(7, model)
    log.close()
    assert [r["step"] for r in read_grades(tmp_path)] == [0, 5, 7]
    assert read_grades(tmp_path)[-1]["grades"] == grades_now(model)


def test_a_model_without_grades_writes_no_grades_file(tmp_path):
    model = torch.nn.Linear(3, 2)
    log = RunLogger(tmp_path, tensorboard=False)
    log.grades(0, model)
    log.grades(1, model)
    log.close()
    assert not (tmp_path / "grades.jsonl").exists()


def test_a_resume_drops_a_line_cut_short_by_a_dead_writer_and_keeps_whole_ones(tmp_path):
    # a writer that died mid-line (a full disk, a kill) leaves a partial last row and line;
    # the resume keeps the whole rows up to its step, and the files read back
    log = RunLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3, 4):
        log.scalars(step, "train", {"loss": 1.0 / step})
    model = graded_model()
    for step in (0, 2, 4):
        log.grades(step, model)
    log.close()
    with (tmp_path / "metrics.csv").open("a", newline="") as fh:
        fh.write("5,train,lo")
    with (tmp_path / "grades.jsonl").open("a") as fh:
        fh.write('{"step": 6, "grades": {"decoder.embed')
    log = RunLogger(tmp_path, tensorboard=False, resume_step=3)
    log.scalars(4, "train", {"loss": 0.5})
    log.grades(4, model)
    log.close()
    assert read_metrics(tmp_path)["train"]["loss"] == [(1, 1.0), (2, 0.5), (3, 1.0 / 3), (4, 0.5)]
    assert [r["step"] for r in read_grades(tmp_path)] == [0, 2, 4]
    # past every whole row: the partial ones alone are dropped
    with (tmp_path / "metrics.csv").open("a", newline="") as fh:
        fh.write("9,tr")
    RunLogger(tmp_path, tensorboard=False, resume_step=100).close()
    assert [s for s, _ in read_metrics(tmp_path)["train"]["loss"]] == [1, 2, 3, 4]


def test_a_run_killed_mid_line_reads_back_its_whole_rows_and_names_a_cut_grades_line(tmp_path):
    # before a resume trims them, the files of a run killed mid-line are read as the resume
    # would keep them (metrics.csv, which graded report plots), or the bad line is named
    log = RunLogger(tmp_path, tensorboard=False)
    for step in (1, 2):
        log.scalars(step, "train", {"loss": 1.0 / step})
    log.grades(2, graded_model())
    log.close()
    with (tmp_path / "metrics.csv").open("a", newline="") as fh:
        fh.write("3,train,lo")
    assert read_metrics(tmp_path) == {"train": {"loss": [(1, 1.0), (2, 0.5)]}}
    with (tmp_path / "grades.jsonl").open("a") as fh:
        fh.write('{"step": 3, "gra')
    with pytest.raises(ValueError, match=rf"{tmp_path / 'grades.jsonl'}:2 is not a JSON grade "
                                         r"snapshot .*'\{\"step\": 3, \"gra'"):
        read_grades(tmp_path)
