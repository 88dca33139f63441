"""A 2-process torchrun (gloo) run equals one process with the same global batch, for every
task kind: classification, and language models whose ranks hold different numbers of tokens.

SIGINT handling is checked end to end through the command line in tests/cli/test_cli.py."""

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

from graded.train.checkpoint import CheckpointManager, read_checkpoint_state, read_rng_state
from graded.train.logging import read_metrics

SCRIPT = Path(__file__).with_name("tiny_training.py")


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SCRIPT.parent),
                                                     env.get("PYTHONPATH", "")) if p)
    return env


def _torchrun(tmp_path: Path, *args: str, run: str = "ddp") -> list[float]:
    """Per-step losses of tiny_training.py run on two gloo processes in ``tmp_path / run``
    (with ``--resume``, continuing the run there). A launch that hangs is stopped with its
    workers after ``TORCHRUN_TIMEOUT_S`` and retried once in a fresh folder (a copy of the run
    as it was before the launch), with a warning that carries its output; a second hang fails.
    A worker that aborts at exit fails at once (it was retried, while the process group
    outlived ``teardown`` and was freed at interpreter exit: see
    ``test_teardown_frees_the_process_group_setup_made_after_a_ddp_wrapper``)."""
    before = tmp_path / f"{run}.before"
    if (tmp_path / run).exists():
        shutil.copytree(tmp_path / run, before)
    for attempt in (1, 2):
        losses = tmp_path / f"losses{attempt}.json"
        run_dir = tmp_path / (run if attempt == 1 else f"{run}-retry")
        if attempt == 2 and before.exists():
            shutil.copytree(before, run_dir)
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
        if run_dir.name != run:  # the tests read the run folder as tmp_path / run
            shutil.rmtree(tmp_path / run, ignore_errors=True)
            run_dir.rename(tmp_path / run)
        shutil.rmtree(before, ignore_errors=True)
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


@pytest.fixture(scope="module")
def unclosed_run(tmp_path_factory) -> tuple[Path, list[float]]:
    """The folder and losses of one 2-process run of 6 steps whose script never calls
    ``trainer.close()`` (atexit closes it), shared by the two tests that read it: a launch costs
    seconds of process start-up. Every other launch here closes its trainer."""
    tmp_path = tmp_path_factory.mktemp("unclosed")
    return tmp_path, _torchrun(tmp_path, "--steps", "6", "--dropout", "0", "--no-close")


@pytest.mark.slow  # one shared torchrun launch of 9 s on 2 cores
def test_two_process_torchrun_matches_one_process_with_the_same_global_batch(tmp_path,
                                                                           unclosed_run):
    folder, ddp = unclosed_run
    single = make_trainer(tmp_path / "one", steps=6, dropout=0.0).fit().losses
    assert len(ddp) == 6
    assert torch.allclose(torch.tensor(ddp), torch.tensor(single), rtol=1e-5, atol=1e-6)
    # Rank 0 alone logs and checkpoints: one row per logged step, one final checkpoint.
    assert [s for s, _ in read_metrics(folder / "ddp")["train"]["loss"]] == [2, 4, 6]
    assert CheckpointManager(folder / "ddp" / "checkpoints").latest().name == "step_000000006"


@pytest.mark.slow  # three or four torchrun launches: about 30 s
def test_a_resumed_two_process_run_whose_ranks_draw_apart_equals_the_uninterrupted_run(
        tmp_path):
    """Each rank's RNG stream is its own (the model draws 7 × (rank + 1) numbers before its
    dropout): the checkpoint holds every rank's state and each rank resumes its own, so a run
    paused after step 3 and resumed on two processes has the losses of the run never paused,
    bit for bit (restoring rank 0's state on rank 1 changes rank 1's dropout masks)."""
    args = ("--steps", "8", "--rank-draws")
    full = _torchrun(tmp_path, *args, run="full")
    first = _torchrun(tmp_path, *args, "--pause-after", "3", run="paused")
    rest = _torchrun(tmp_path, *args, "--resume", run="paused")
    assert len(first) == 3 and len(rest) == 5
    assert first + rest == full
    tensors, _ = read_rng_state(CheckpointManager(tmp_path / "paused" / "checkpoints")
                                .path_for(3))
    assert not torch.equal(tensors["rng.torch"], tensors["rng.rank1.torch"])  # they drew apart


@pytest.mark.slow  # three or four torchrun launches: about 30 s
def test_a_run_resumes_on_another_number_of_processes(tmp_path):
    """Two processes paused after step 3 resume on one (rank 0's RNG state), and one process
    paused resumes on two (rank 1 takes rank 0's state: the checkpoint holds none for it); both
    give the losses of one process run without a pause."""
    args = ("--steps", "6", "--dropout", "0")
    single = make_trainer(tmp_path / "one", steps=6, dropout=0.0).fit().losses
    head = _torchrun(tmp_path, *args, "--pause-after", "3", run="two-one")
    tail = make_trainer(tmp_path / "two-one", steps=6, dropout=0.0).fit(
        resume_from=tmp_path / "two-one").losses
    first = make_trainer(tmp_path / "one-two", steps=6, dropout=0.0).fit(pause_after=3).losses
    rest = _torchrun(tmp_path, *args, "--resume", run="one-two")
    for losses in (head + tail, first + rest):
        assert len(losses) == 6
        assert torch.allclose(torch.tensor(losses), torch.tensor(single), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # three or four torchrun launches: about 30 s
def test_a_sigint_to_one_rank_stops_both_after_the_next_step_and_the_resume_equals_one_process(
        tmp_path):
    """SIGINT reaches rank 1 alone, after step 2. The ranks agree on stopping one step late,
    without waiting for each other at every step (StopVote): both end after step 3, rank 0
    writes the one checkpoint of step 3 (both ranks' RNG states in it), and resuming it on two
    processes gives the losses of one process run without a stop."""
    ends = tmp_path / "ends"
    args = ("--steps", "8", "--dropout", "0")
    first = _torchrun(tmp_path, *args, "--sigint-after", "2", "--ends", str(ends))
    assert [json.loads((ends / f"rank{r}.json").read_text()) for r in (0, 1)] == [
        {"step": 3, "interrupted": True}] * 2
    checkpoints = CheckpointManager(tmp_path / "ddp" / "checkpoints")
    assert checkpoints.steps() == [3]
    state = read_checkpoint_state(checkpoints.latest())
    assert state["step"] == 3 and list(state["rng"]["ranks"]) == ["1"]
    rest = _torchrun(tmp_path, *args, "--resume")
    single = make_trainer(tmp_path / "one", steps=8, dropout=0.0).fit().losses
    assert len(first) == 3 and len(rest) == 5
    assert torch.allclose(torch.tensor(first + rest), torch.tensor(single), rtol=1e-5, atol=1e-6)


def test_the_stop_vote_holds_a_host_tensor_and_answers_one_call_late(tmp_path, monkeypatch):
    """StopVote's all-reduce takes a CPU tensor whatever the training device (here "meta", a
    stand-in for a GPU the host would wait for) and is launched without waiting; its answer is
    read at the next call: a flag raised before call k stops at call k + 1. In one process a
    call answers its own flag, with no collective."""
    import torch.distributed as dist

    from graded.train import distributed as D

    launched = []
    all_reduce = dist.all_reduce

    def recorded(tensor, *args, **kwargs):
        launched.append((tensor.device.type, kwargs.get("async_op")))
        return all_reduce(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", recorded)
    assert D.StopVote(D.DistContext())(True) is True and launched == []
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        vote = D.StopVote(D.DistContext(world_size=2, device=torch.device("meta")))
        assert [vote(flag) for flag in (False, False, True, False)] == [False, False, False, True]
        vote.close()
    finally:
        dist.destroy_process_group()
    assert launched == [("cpu", True)] * 3  # none after the agreed stop


def test_under_a_device_backend_the_stop_vote_travels_over_a_gloo_group_of_its_own(
        tmp_path, monkeypatch):
    """Under NCCL (here a one-process gloo group that reports itself as NCCL) setup makes a
    gloo group for host values, and the stop vote runs on it, with CPU tensors."""
    import torch.distributed as dist

    from graded.train import distributed as D

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        backend = dist.get_backend
        monkeypatch.setattr(dist, "get_backend",
                            lambda group=None: "nccl" if group is None else backend(group))
        ctx = D.setup("cpu")
        assert ctx.host_group is not None and backend(ctx.host_group) == "gloo"
        vote = D.StopVote(ctx)
        assert [vote(flag) for flag in (True, False)] == [False, True]
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # one shared torchrun launch of 9 s on 2 cores
def test_a_torchrun_script_that_never_closes_its_trainer_exits_cleanly(unclosed_run):
    _, ddp = unclosed_run  # _torchrun checked the exit status and that no launch hung
    assert len(ddp) == 6


@pytest.mark.parametrize("task", ["dyck", "polynomials"])
@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
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


FREED_BY_TEARDOWN = """
import gc, os, sys, weakref
import torch
import torch.distributed as dist
from graded.train import distributed as D

os.environ.update(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")  # as torchrun sets them
init = dist.init_process_group
dist.init_process_group = lambda backend: init(backend, init_method="file://" + sys.argv[1],
                                               rank=0, world_size=1)
ctx = D.setup("cpu")
group = weakref.ref(dist.group.WORLD)
model = D.wrap_model(torch.nn.Linear(3, 2), ctx)  # DDP's first use imports torch._dynamo
model(torch.ones(1, 3)).sum().backward()
del model
gc.collect()
D.teardown(ctx)
gc.collect()
print("freed" if group() is None else "alive")
"""


def test_teardown_frees_the_process_group_setup_made_after_a_ddp_wrapper(tmp_path):
    """The group setup() made is freed by teardown() once the DDP wrapper is gone, and with
    it its gloo threads, rather than at interpreter exit (where a rank now and then aborted,
    "terminate called without an active exception"). It used to stay alive: DDP imports
    torch._dynamo and with it torch.distributed.nn, whose functions take group.WORLD as a
    default argument and so held the group made before the import. A fresh interpreter:
    whether that module is imported already depends on what ran before."""
    proc = subprocess.run([sys.executable, "-c", FREED_BY_TEARDOWN, str(tmp_path / "store")],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["freed"]


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
