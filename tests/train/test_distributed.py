"""A 2-process torchrun (gloo) run equals one process with the same global batch, for every
task kind: classification, and language models whose ranks hold different numbers of tokens.

SIGINT handling is checked end to end through the command line in tests/test_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_training import make_lm_trainer, make_trainer

from graded.train.checkpoint import CheckpointManager
from graded.train.logging import read_metrics

SCRIPT = Path(__file__).with_name("tiny_training.py")


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SCRIPT.parent),
                                                     env.get("PYTHONPATH", "")) if p)
    return env


def _torchrun(tmp_path: Path, *args: str) -> list[float]:
    """Per-step losses of tiny_training.py run on two gloo processes."""
    losses = tmp_path / "losses.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--standalone", str(SCRIPT), str(tmp_path / "ddp"), "--losses", str(losses), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(losses.read_text())


def test_two_process_torchrun_matches_one_process_with_the_same_global_batch(tmp_path):
    ddp = _torchrun(tmp_path, "--steps", "6", "--dropout", "0")
    single = make_trainer(tmp_path / "one", steps=6, dropout=0.0).fit().losses
    assert len(ddp) == 6
    assert torch.allclose(torch.tensor(ddp), torch.tensor(single), rtol=1e-5, atol=1e-6)
    # Rank 0 alone logs and checkpoints: one row per logged step, one final checkpoint.
    assert [s for s, _ in read_metrics(tmp_path / "ddp")["train"]["loss"]] == [2, 4, 6]
    assert CheckpointManager(tmp_path / "ddp" / "checkpoints").latest().name == "step_000000006"


@pytest.mark.parametrize("task", ["dyck", "polynomials"])
def test_two_process_language_model_matches_one_process_to_1e6(tmp_path, task):
    # Rows differ in scored tokens, so the ranks' halves of a batch do too: the step's loss is
    # the global token mean, here also split into two micro-batches per rank.
    ddp = _torchrun(tmp_path, "--task", task, "--steps", "5", "--grad-accum", "2")
    single = make_lm_trainer(tmp_path / "one", task, steps=5).fit().losses
    assert len(ddp) == 5
    assert torch.allclose(torch.tensor(ddp), torch.tensor(single), rtol=0, atol=1e-6)


def test_gradient_accumulation_equals_the_full_step_for_a_padded_language_model(tmp_path):
    one = make_lm_trainer(tmp_path / "a", "polynomials", steps=6, grad_accum=1).fit()
    two = make_lm_trainer(tmp_path / "b", "polynomials", steps=6, grad_accum=2).fit()
    assert torch.allclose(torch.tensor(one.losses), torch.tensor(two.losses), rtol=0, atol=1e-6)
    assert two.final_eval["loss"] == pytest.approx(one.final_eval["loss"], abs=1e-6)
