"""A ``resume_from`` that cannot be resumed (a folder that is not a run, a file, a run whose
config a resume refuses) is refused before the run folder's lock file is written: no new
folder and no ``run.lock`` are left behind, in a new folder or in an existing one. A resume of
a run another process holds is refused before any checkpoint is read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_training import make_trainer

from graded.train.runs import RunError, RunLockedError
from graded.train.state_tensors import CheckpointError

OPTIONS = {"steps": 4, "eval_every": 4}


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_folder_that_is_not_a_run_is_refused_naming_it_and_leaves_no_new_folder(tmp_path):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "readme.txt").write_text("not a run")
    with pytest.raises(CheckpointError) as refused:
        make_trainer(tmp_path / "new", **OPTIONS).fit(resume_from=other)
    assert not (tmp_path / "new").exists()
    assert _files(other) == ["readme.txt"]
    assert str(refused.value).startswith(
        f"cannot resume from {other}: it is a folder holding no checkpoint "
        "(checkpoints/step_<N>), config.yaml or state.json, neither a run folder nor one of "
        "its checkpoint folders")


def test_a_file_is_refused_as_a_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 8)
    with pytest.raises(CheckpointError, match=rf"cannot resume from {path}: it is a file"):
        make_trainer(tmp_path / "new", **OPTIONS).fit(resume_from=path)
    assert not (tmp_path / "new").exists()


def test_an_existing_empty_run_folder_gets_no_lock_file_from_a_refused_resume(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(CheckpointError):
        make_trainer(tmp_path / "run", **OPTIONS).fit(resume_from=tmp_path / "run")
    assert _files(tmp_path / "run") == []


def test_a_resume_with_a_refused_config_leaves_no_new_folder(tmp_path):
    make_trainer(tmp_path / "source", **OPTIONS).fit()
    with pytest.raises(RunError, match=r"train.batch_size was 16, now 8"):
        make_trainer(tmp_path / "new", **{**OPTIONS, "batch_size": 8}).fit(
            resume_from=tmp_path / "source")
    assert not (tmp_path / "new").exists()


HOLD_LOCK = (
    "import sys\nfrom graded.train.runs import RunFolder\n"
    "RunFolder(sys.argv[1]).acquire()\nprint('locked', flush=True)\nsys.stdin.read()\n"
)


def test_a_resume_of_a_run_another_process_holds_is_refused_before_loading(tmp_path):
    make_trainer(tmp_path / "run", **OPTIONS).fit()
    trainer = make_trainer(tmp_path / "run", **OPTIONS)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "run")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=rf"in use by process {proc.pid} for training"):
            trainer.fit(resume_from=tmp_path / "run")
    finally:
        proc.communicate("")
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())
    with pytest.raises(RunError, match="already holds checkpoints; resume it"):
        trainer.fit()  # nothing was loaded: a fresh run is refused for the folder's run alone


@pytest.mark.parametrize(("resume_from", "error", "message"), [
    ("", ValueError, "resume_from is empty; expected a run folder or one of its checkpoints "
                     r"\(None for a new run\)"),
    ("  ", ValueError, "resume_from is empty"),
    (3, TypeError, r"resume_from must be a path \(str or Path\) or None, got int 3"),
])
def test_an_empty_or_untyped_resume_from_is_refused_before_anything(tmp_path, monkeypatch,
                                                                    resume_from, error, message):
    make_trainer(tmp_path / "cwd", **OPTIONS).fit()  # the working folder holds a run
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(error, match=message):
        make_trainer(tmp_path / "new", **OPTIONS).fit(resume_from=resume_from)
    assert not (tmp_path / "new").exists()


def test_prepare_resume_checks_its_source_as_fit_checks_resume_from(tmp_path, monkeypatch):
    make_trainer(tmp_path / "cwd", **OPTIONS).fit()
    monkeypatch.chdir(tmp_path / "cwd")
    trainer = make_trainer(tmp_path / "new", **OPTIONS)
    with pytest.raises(ValueError, match="resume_from is empty"):
        trainer.prepare_resume("")
    with pytest.raises(TypeError, match=r"source must be a path .* got None"):
        trainer.prepare_resume(None)
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        trainer.prepare_resume(tmp_path / "nowhere")
    trainer.fit()  # nothing was loaded: a new run
