"""Checkpoints moved between dtypes and devices, of every model kind, and written on a disk
that fails: exact round trips, refusals that name the tensor or the folder, and a previous
checkpoint that a failed save leaves intact."""

from __future__ import annotations

import errno
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import SafetensorError
from tiny_training import TinyClassifier

from graded.config import build_run, load_config
from graded.train import checkpoint as ck
from graded.train import checkpoint_folder

CONFIGS = Path(__file__).parents[2] / "configs"


def _trained(seed: int = 0) -> tuple[TinyClassifier, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TinyClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randint(0, 12, (4, 8))).sum().backward()
        opt.step()
    return model, opt


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _same_optimizer_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys() \
        and all(_same_state(sa["state"][p], sb["state"][p]) if all(
            isinstance(v, torch.Tensor) for v in sa["state"][p].values())
            else sa["state"][p] == sb["state"][p] for p in sa["state"])


# --------------------------------------------------------------------------- dtypes, devices


def test_a_float32_checkpoint_loads_into_a_bfloat16_model_as_the_cast_weights(tmp_path):
    model, _ = _trained()
    ck.save_checkpoint(tmp_path / "c", model, None, {"step": 2})
    half = TinyClassifier().to(torch.bfloat16)
    ck.load_checkpoint(tmp_path / "c", half, restore_rng=False)
    cast = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    assert _same_state(half.state_dict(), cast)


def test_a_model_built_on_meta_and_materialised_with_to_empty_loads_exactly(tmp_path):
    model, _ = _trained()
    ck.save_checkpoint(tmp_path / "c", model, None, {"step": 2})
    with torch.device("meta"):
        empty = TinyClassifier()
    empty.to_empty(device="cpu")
    ck.load_checkpoint(tmp_path / "c", empty, restore_rng=False)
    assert _same_state(empty.state_dict(), model.state_dict())


def test_loading_into_a_model_still_on_meta_is_refused_naming_its_tensors(tmp_path):
    """load_state_dict copies into a meta tensor as a no-op: the load 'succeeded' with a
    warning and the model held no weights."""
    model, _ = _trained()
    ck.save_checkpoint(tmp_path / "c", model, None, {"step": 2})
    with torch.device("meta"):
        empty = TinyClassifier()
    with pytest.raises(ck.CheckpointError, match=r"model\.safetensors: cannot load into the "
                       r"model's embed\.weight, hidden\.weight, hidden\.bias and 2 more: on the "
                       r"meta device.*model\.to_empty\(device=\.\.\.\)"):
        ck.load_checkpoint(tmp_path / "c", empty, restore_rng=False)


def test_saving_a_model_on_meta_is_refused_naming_its_tensors_and_writes_nothing(tmp_path):
    """It was a bare NotImplementedError ('Cannot copy out of meta tensor; no data!')."""
    with torch.device("meta"):
        empty = TinyClassifier()
    with pytest.raises(ValueError, match=r"cannot save the model's embed\.weight, hidden\.weight,"
                                         r" hidden\.bias and 2 more: on the meta device"):
        ck.save_checkpoint(tmp_path / "c", empty, None, {"step": 0})
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- every model kind

KINDS = {  # a shipped config of each kind, made small, with learnable grades where graded
    "lm": ("dyck", ["model.d_model=16", "model.n_layers=1", "model.tie_embeddings=true"]),
    "morphic-lm": ("dyck_morphic", []),
    "classification": ("dyck_recognition", ["model.d_model=16", "model.n_layers=1"]),
    "regression": ("polynomial_regression", ["model.d_model=16", "model.n_layers=1"]),
    "seq2seq": ("polynomials_seq2seq", ["model.d_model=16", "model.n_layers=1",
                                        "model.grading=linear", "model.learnable_grades=true",
                                        "recipe=auto"]),
}
SMALL = ["task.n_train=48", "task.n_eval=8", "train.steps=2", "train.batch_size=8",
         "train.eval_every=2", "train.warmup_steps=1", "train.progress=false",
         "train.tensorboard=false", "train.device=cpu", "output.plots=false"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_of_every_model_kind_restores_weights_optimizer_and_rng_exactly(tmp_path,
                                                                                     kind):
    name, extra = KINDS[kind]
    cfg = load_config(CONFIGS / f"{name}.yaml", [*SMALL, *extra, f"output.dir={tmp_path}"])
    trained = build_run(cfg)
    trained.trainer.fit()
    latest = ck.CheckpointManager(cfg.run_dir() / "checkpoints").latest()
    ck.save_checkpoint(tmp_path / "again", trained.model, trained.trainer.optimizer,
                       {"step": 2})
    draws = torch.rand(3).tolist(), random.random(), np.random.rand()  # next after the save

    fresh = build_run(cfg, tmp_path / "fresh")
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    ck.load_checkpoint(tmp_path / "again", fresh.model, fresh.trainer.optimizer)
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == draws
    assert _same_state(fresh.model.state_dict(), trained.model.state_dict())
    assert _same_optimizer_state(fresh.trainer.optimizer, trained.trainer.optimizer)
    if kind != "morphic-lm":
        assert any(n.endswith("grades") for n, p in fresh.model.named_parameters()
                   if p.requires_grad), "the graded model should learn its grades"
    ck.load_checkpoint(latest, fresh.model, restore_rng=False)  # the trainer's own checkpoint
    assert _same_state(fresh.model.state_dict(), trained.model.state_dict())
    if kind == "lm":  # tied weights come back tied
        embed, head = fresh.model.decoder.embed.tokens.weight, fresh.model.head.proj.weight
        assert embed.data_ptr() == head.data_ptr()


# --------------------------------------------------------------------------- refused loads


def test_a_checkpoint_whose_rng_state_is_corrupt_is_refused_before_the_model_changes(tmp_path):
    """A state.json whose RNG state does not read (edited, or of another NumPy) was a bare
    TypeError, ValueError or KeyError raised after the weights and optimiser were loaded."""
    model, opt = _trained()
    ck.save_checkpoint(tmp_path / "c", model, opt, {"step": 2})
    state_file = tmp_path / "c" / "state.json"
    state = json.loads(state_file.read_text())
    for corrupt, problem in [(lambda r: r.__setitem__("python", None), "TypeError"),
                             (lambda r: r.__setitem__("python", [3, [1, 2], None]), "ValueError"),
                             (lambda r: r["numpy"].__setitem__(1, [1, 2]), "IndexError"),
                             (lambda r: r.pop("numpy"), "KeyError")]:
        rng = json.loads(json.dumps(state["rng"]))
        corrupt(rng)
        state_file.write_text(json.dumps({**state, "rng": rng}))
        other, other_opt = _trained(seed=1)
        before = {k: v.clone() for k, v in other.state_dict().items()}
        with pytest.raises(ck.CheckpointError, match=r"state\.json: RNG state: corrupt Python or "
                                                     f"NumPy generator state \\({problem}"):
            ck.load_checkpoint(tmp_path / "c", other, other_opt)
        assert _same_state(other.state_dict(), before)
        with pytest.raises(ck.CheckpointError, match=r"state\.json: RNG state"):
            ck.read_rng_state(tmp_path / "c")


def test_optimizer_state_that_does_not_fit_is_refused_before_the_model_changes(tmp_path):
    model, opt = _trained()
    ck.save_checkpoint(tmp_path / "c", model, opt, {"step": 2})
    other = TinyClassifier()
    before = {k: v.clone() for k, v in other.state_dict().items()}
    two_groups = torch.optim.AdamW([{"params": [other.embed.weight]},
                                    {"params": list(other.parameters())[1:]}])
    with pytest.raises(ck.CheckpointError, match=r"parameter groups of sizes \[5\] does not fit "
                                                 r"the optimizer's \[1, 4\]"):
        ck.load_checkpoint(tmp_path / "c", other, two_groups)
    assert _same_state(other.state_dict(), before)


def test_a_parameter_group_without_its_params_is_named_as_corrupt_optimizer_state(tmp_path):
    model, opt = _trained()
    ck.save_checkpoint(tmp_path / "c", model, opt, {"step": 2})
    state_file = tmp_path / "c" / "state.json"
    state = json.loads(state_file.read_text())
    del state["optimizer"]["param_groups"][0]["params"]
    state_file.write_text(json.dumps(state))
    with pytest.raises(ck.CheckpointError, match=r"state\.json: corrupt optimizer state "
                                                 r"\(KeyError\('params'\)\)"):
        ck.load_checkpoint(tmp_path / "c", *_trained(seed=1))


# --------------------------------------------------------------------------- failing disks


def _no_space(*args, **kwargs):
    # what safetensors raises when the disk fills up while it writes
    raise SafetensorError("Error while serializing: I/O error: No space left on device "
                          "(os error 28)")


def test_a_save_that_fails_over_a_checkpoint_of_the_same_step_leaves_that_checkpoint(
        tmp_path, monkeypatch):
    """CheckpointManager.save removed a checkpoint of the same step before writing the new one:
    a full disk then left no checkpoint of that step at all."""
    model, opt = _trained()
    manager = ck.CheckpointManager(tmp_path / "checkpoints")
    path = manager.save(2, model, opt, {})
    saved = {name: (path / name).read_bytes() for name in ("model.safetensors", "state.json")}
    monkeypatch.setattr(checkpoint_folder, "save_file", _no_space)
    with pytest.raises(OSError):
        manager.save(2, *_trained(seed=1), {})
    assert {name: (path / name).read_bytes() for name in saved} == saved
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [path.name]
    monkeypatch.undo()
    fresh = TinyClassifier()
    ck.load_checkpoint(manager.latest(), fresh, restore_rng=False)
    assert _same_state(fresh.state_dict(), model.state_dict())
    replaced, _ = _trained(seed=1)
    manager.save(2, replaced, None, {})  # a save that succeeds replaces it
    ck.load_checkpoint(manager.latest(), fresh, restore_rng=False)
    assert _same_state(fresh.state_dict(), replaced.state_dict())
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [path.name]


def test_a_full_disk_is_an_oserror_naming_the_checkpoint_folder(tmp_path, monkeypatch):
    """It was safetensors' SafetensorError, naming no file."""
    monkeypatch.setattr(checkpoint_folder, "save_file", _no_space)
    target = tmp_path / "checkpoints" / "step_000000002"
    with pytest.raises(OSError) as exc:
        ck.save_checkpoint(target, *_trained(), {"step": 2})
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(target)
    assert "No space left on device" in str(exc.value)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_a_read_only_folder_is_an_oserror_naming_the_checkpoint_not_its_temporary_folder(
        tmp_path, monkeypatch):
    """The error named the hidden temporary folder the checkpoint is assembled in."""
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.name.startswith(".step_"):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    target = tmp_path / "checkpoints" / "step_000000002"
    with pytest.raises(OSError) as exc:
        ck.CheckpointManager(target.parent).save(2, *_trained(), {})
    assert exc.value.errno == errno.EROFS and exc.value.filename == str(target)


def test_a_folder_that_cannot_be_made_is_named_itself(tmp_path):
    """The parent folder's own error is kept: it, not the checkpoint, is what failed."""
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run folder should be")
    with pytest.raises(OSError) as exc:
        ck.save_checkpoint(blocker / "checkpoints" / "step_000000001", *_trained(), {"step": 1})
    assert exc.value.filename == str(blocker / "checkpoints")
