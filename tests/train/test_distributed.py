"""A 2-process torchrun (gloo) run equals one process with the same global batch, for every
task kind: classification, and language models whose ranks hold different numbers of tokens.

SIGINT handling is checked end to end through the command line in tests/test_cli.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
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
    """Per-step losses of tiny_training.py run on two gloo processes. A launch that hangs is
    stopped with its workers after ``TORCHRUN_TIMEOUT_S`` and retried once in a fresh folder,
    with a warning that carries its output; a second hang fails."""
    for attempt in (1, 2):
        losses = tmp_path / f"losses{attempt}.json"
        run_dir = tmp_path / ("ddp" if attempt == 1 else "ddp-retry")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--standalone", str(SCRIPT), str(run_dir), "--losses", str(losses), *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env())
        try:
            out, err = proc.communicate(timeout=TORCHRUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _stop(proc, run_dir)
            out, err = proc.communicate()
            message = (f"torchrun ({' '.join(args)}) did not finish in {TORCHRUN_TIMEOUT_S} s "
                       f"(attempt {attempt}); its output:\n{out[-1500:]}\n{err[-3000:]}")
            if attempt == 2:
                pytest.fail(message)
            warnings.warn(message + "\nretrying once", RuntimeWarning, stacklevel=2)
            continue
        assert proc.returncode == 0, err[-3000:]
        if run_dir.name != "ddp":  # the tests read the run folder as tmp_path / "ddp"
            shutil.rmtree(tmp_path / "ddp", ignore_errors=True)
            run_dir.rename(tmp_path / "ddp")
        return json.loads(losses.read_text())
    raise AssertionError("unreachable")


TORCHRUN_TIMEOUT_S = 120


def _stop(proc: subprocess.Popen, run_dir: Path) -> None:
    """Stops a hung torchrun and its workers. torchrun stops its workers on SIGTERM; workers
    that outlive it (they run in sessions of their own) are found by the run folder in their
    command line and killed."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if str(run_dir).encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def test_two_process_torchrun_matches_one_process_with_the_same_global_batch(tmp_path):
    ddp = _torchrun(tmp_path, "--steps", "6", "--dropout", "0")
    single = make_trainer(tmp_path / "one", steps=6, dropout=0.0).fit().losses
    assert len(ddp) == 6
    assert torch.allclose(torch.tensor(ddp), torch.tensor(single), rtol=1e-5, atol=1e-6)
    # Rank 0 alone logs and checkpoints: one row per logged step, one final checkpoint.
    assert [s for s, _ in read_metrics(tmp_path / "ddp")["train"]["loss"]] == [2, 4, 6]
    assert CheckpointManager(tmp_path / "ddp" / "checkpoints").latest().name == "step_000000006"


def test_a_torchrun_script_that_never_closes_its_trainer_exits_cleanly(tmp_path):
    ddp = _torchrun(tmp_path, "--steps", "4", "--no-close")
    assert len(ddp) == 4


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


def test_close_frees_the_ddp_wrapper_before_it_leaves_the_process_group(tmp_path, monkeypatch):
    """The order that keeps a gloo run from hanging at exit (Trainer.close): the wrapper (and
    with it DDP's reducer) is freed while the process group is still registered, then the
    group is destroyed."""
    import dataclasses
    import weakref

    from graded.train import distributed as D

    trainer = make_trainer(tmp_path / "run")
    wrapper = torch.nn.Module()  # stands in for DistributedDataParallel(model)
    freed = weakref.ref(wrapper)
    trainer.step_module, wrapper = wrapper, None
    trainer.ctx = dataclasses.replace(trainer.ctx, world_size=2)
    seen = []
    monkeypatch.setattr(D, "teardown", lambda ctx: seen.append(freed() is None))
    trainer.close()
    assert seen == [True]
    assert trainer.step_module is trainer.model


def test_a_trainer_under_torchrun_that_is_never_closed_is_closed_at_exit(tmp_path, monkeypatch):
    """Trainer registers close() with atexit when it runs on several ranks (through a weak
    reference: the trainer is not kept alive by it), and close() withdraws it; a trainer
    already freed at exit still leaves its process group."""
    import atexit
    import gc
    import weakref

    from graded.train import distributed as D

    registered, left = [], []
    monkeypatch.setattr(D, "setup", lambda device: D.DistContext(rank=0, world_size=2))
    monkeypatch.setattr(D, "wrap_model", lambda model, ctx: model)
    monkeypatch.setattr(D, "teardown", lambda ctx: left.append(ctx))
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", registered.remove)
    trainer = make_trainer(tmp_path / "a")
    assert len(registered) == 1
    hook = registered[0]
    hook()  # as at exit: closes the trainer, which withdraws the hook
    assert registered == [] and left == [trainer.ctx]
    trainer.close()  # a second close: nothing left to withdraw
    assert registered == []

    other = make_trainer(tmp_path / "b")
    hook, ctx, alive = registered[0], other.ctx, weakref.ref(other)
    del other
    gc.collect()
    assert alive() is None  # the hook did not keep it
    hook()  # the trainer is gone: its process group is left all the same
    assert left[-1] is ctx
