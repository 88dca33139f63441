"""One checkpoint folder, written atomically and read with every check first: tensors in
safetensors, everything else in JSON; nothing unpickles.

A checkpoint is a folder ``<run>/checkpoints/step_<N>/`` holding

- ``model.safetensors``      the model's state; a tensor registered under several names (tied
                              embeddings, grades shared by several stages) is stored once and
                              the other names are listed in the file's metadata;
- ``optimizer.safetensors``  every tensor of the optimiser state (``exp_avg``, ``step``, ...)
                              and the torch (and CUDA) RNG states;
- ``state.json``             everything else: step, data position, optimiser scalars and param
                              groups, scheduler state, Python and NumPy RNG states,
                              best-metric and early-stopping state
                              (:mod:`graded.train.stopping`), config.

A checkpoint of a run on several processes holds every rank's RNG state, each under its rank
(:func:`~graded.train.state_tensors.ranked_rng_state`); a rank it holds none for restores rank
0's.

Writes are atomic and durable: the folder is assembled under a temporary name, each of its
files ``fsync``-ed, and moved into place with :func:`os.replace`, the parent folder ``fsync``-ed
after, so a crash, a power cut or an exception leaves either the previous checkpoints or the
new one, never a partial folder (a writer killed mid-save leaves its hidden temporary folder,
which the next save of the run removes). A checkpoint of the same step is replaced only once
the new one is complete: the old folder is moved aside (:data:`MOVED_ASIDE`) and the new one
renamed into place, as POSIX cannot replace a folder that holds files in one rename; a crash
between the two leaves the old folder under its moved-aside name, which
:class:`~graded.train.checkpoint.CheckpointManager` reads as that step's checkpoint. A write
the disk refuses (full, read-only) is an :class:`OSError` naming the checkpoint folder.
Nothing here calls :func:`torch.load`: loading a checkpoint cannot execute code.
:mod:`graded.train.state_tensors` turns the model, optimiser and RNG states into the files;
:mod:`graded.train.checkpoint` keeps a run's checkpoints.

Loading checks before it changes anything it can: ``state.json`` records the SHA-256 of both
tensor files, and a missing, truncated or corrupt file, weights and optimiser state that do
not fit the model (keys, shapes, parameter groups; a model still on the meta device), or RNG
states that do not restore, raise :class:`CheckpointError` before the model, optimiser or
generators change (:func:`check_checkpoint` does those checks alone, for a caller that has
its own to make before anything is loaded); its one-line message names the file and the
problem. A weights-only load (``optimizer=None, restore_rng=False``, for evaluation and
generation) reads ``model.safetensors`` and ``state.json`` only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from graded._io import _fsync_folder, atomic_write_text
from graded.train.state_tensors import (
    RngState,
    capture_rng_state,
    check_rng_state,
    checkpoint_error,
    jsonable,
    load_model_state,
    optimizer_state_for,
    optimizer_to_flat,
    ranked_rng_state,
    read_tensors,
    restore_rng_state,
    save_model_state,
    sha256_of,
)

__all__ = ["MODEL_FILE", "MOVED_ASIDE", "OPTIM_FILE", "STATE_FILE", "TEMP_DIR",
           "CheckedCheckpoint", "check_checkpoint", "load_checkpoint", "read_checkpoint_state",
           "read_rng_state", "save_checkpoint"]

# the temporary folder a checkpoint is assembled in (save_checkpoint), left by a killed writer
TEMP_DIR = re.compile(r"^\.step_\d{9}\..+\.tmp$")
# a checkpoint a save of the same step moved aside (a TEMP_DIR too), its step grouped
MOVED_ASIDE = re.compile(r"^\.step_(\d{9})\..+\.old\.tmp$")
STATE_FILE = "state.json"
MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optimizer.safetensors"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def save_checkpoint(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    *,
    rng: Sequence[RngState] | None = None,
    replace: bool = False,
) -> Path:
    """Write one checkpoint folder atomically and return its path.

    ``state`` holds the JSON part (step, scheduler state, config, ...); it must be JSON-able.
    The optimiser tensors and the RNG states are added here: ``rng`` every rank's, by rank
    (:func:`~graded.train.state_tensors.capture_rng_state` on each), else this process's. The
    folder appears only once every file in it is complete; with ``replace`` it replaces a
    folder of that name then, which stays as it was if the write fails. A write that fails on
    the disk (full, read-only) is an :class:`OSError` naming ``directory``, with its errno.
    """
    directory = Path(directory)
    if directory.exists() and not replace:
        raise FileExistsError(f"checkpoint folder {directory} already exists")
    # os.mkdir honours the umask (mkdtemp's folder is 0700: a checkpoint others cannot read)
    tmp = directory.parent / f".{directory.name}.{os.getpid()}-{secrets.token_hex(6)}.tmp"
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        save_model_state(model, tmp / MODEL_FILE)
        extra_tensors, rng_rest = ranked_rng_state(rng or [capture_rng_state()])
        meta: dict[str, Any] = {"format": "graded-checkpoint-1", **jsonable(state)}
        meta["rng"] = rng_rest
        if optimizer is not None:
            opt_tensors, opt_rest = optimizer_to_flat(optimizer.state_dict())
            meta["optimizer"] = opt_rest
        else:
            opt_tensors = {}
        save_file({**opt_tensors, **extra_tensors}, str(tmp / OPTIM_FILE))
        meta["sha256"] = {name: sha256_of(tmp / name) for name in (MODEL_FILE, OPTIM_FILE)}
        atomic_write_text(tmp / STATE_FILE, json.dumps(meta, indent=1, sort_keys=True))
        # the files as the umask allows, as the folder is (safetensors and atomic_write_text
        # write 0600 files)
        mode = stat.S_IMODE(tmp.stat().st_mode) & 0o666
        for name in (MODEL_FILE, OPTIM_FILE, STATE_FILE):
            os.chmod(tmp / name, mode)
            _fsync_file(tmp / name)  # on disk before the folder's name says it is complete
        _fsync_folder(tmp)
        _move_into_place(tmp, directory)
        _fsync_folder(directory.parent)  # the rename itself survives a power cut
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        error = _write_error(directory, tmp, exc)
        if error is None:
            raise
        raise error from exc
    return directory


def _fsync_file(path: Path) -> None:
    """``fsync`` of the file ``path``: its bytes and metadata are on the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_into_place(tmp: Path, directory: Path) -> None:
    """Rename the complete folder ``tmp`` to ``directory``; a ``directory`` there already is
    moved aside first (:data:`MOVED_ASIDE`: read as that step's checkpoint while
    ``directory`` is missing, put back or removed by the next save's rotation) and removed
    after, or put back if the rename fails."""
    if not directory.exists():
        os.replace(tmp, directory)
        return
    old = directory.parent / f".{directory.name}.{os.getpid()}-{secrets.token_hex(6)}.old.tmp"
    os.replace(directory, old)
    try:
        os.replace(tmp, directory)
    except BaseException:
        os.replace(old, directory)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _write_error(directory: Path, tmp: Path, exc: BaseException) -> OSError | None:
    """The error of a checkpoint write that failed on the disk, naming ``directory`` (not the
    temporary folder it was assembled in), or None to raise ``exc`` as it is. safetensors
    reports a full disk as ``SafetensorError('... No space left on device (os error 28)')``."""
    if isinstance(exc, OSError):
        if exc.errno is None or (exc.filename is not None
                                 and not str(exc.filename).startswith(str(tmp))):
            return None  # names its own file (the parent folder that cannot be made)
        code = exc.errno
    elif isinstance(exc, SafetensorError):
        found = re.search(r"os error (\d+)", str(exc))
        if found is None:
            return None
        code = int(found.group(1))
    else:
        return None
    return OSError(code, f"{os.strerror(code)} (writing checkpoint)", str(directory))


def read_checkpoint_state(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON part of a checkpoint (no tensors loaded); :class:`CheckpointError` if unusable."""
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise checkpoint_error(path, f"missing ({directory} is not a checkpoint folder)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise checkpoint_error(path, f"truncated, corrupt or unreadable ({exc})") from None
    if not isinstance(meta, dict):
        raise checkpoint_error(path, "not a checkpoint state (no integer 'step')")
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise checkpoint_error(path, f"not a checkpoint state: 'step' is {step!r}, expected an "
                                     "integer >= 0")
    sums = meta.get("sha256")
    if sums is not None and not (
            isinstance(sums, dict) and all(
                isinstance(v, str) and _SHA256.fullmatch(v) for v in sums.values())):
        # a damaged record would skip the check of the tensor files it is there for
        raise checkpoint_error(path, f"'sha256' is {sums!r}, expected a map of file names to "
                                     "64 hexadecimal digits")
    return meta


def read_rng_state(
    directory: str | os.PathLike[str],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The RNG states stored in a checkpoint (every rank's), for :func:`restore_rng_state`
    (only the RNG tensors of ``optimizer.safetensors`` are read)."""
    directory = Path(directory)
    meta, path = read_checkpoint_state(directory), directory / OPTIM_FILE
    try:
        with safe_open(str(path), framework="pt") as fh:
            names = [k for k in fh.keys() if k.startswith("rng.")]  # noqa: SIM118
            tensors = {k: fh.get_tensor(k) for k in names}
    except (SafetensorError, OSError) as exc:
        raise checkpoint_error(path, f"truncated, corrupt or unreadable ({exc})") from None
    return _rng_part(directory, tensors, meta)


def _rng_part(directory: Path, tensors: dict[str, torch.Tensor],
              meta: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    rng = {k: v for k, v in tensors.items() if k.startswith("rng.")}
    if "rng.torch" not in rng:
        raise checkpoint_error(directory / OPTIM_FILE, "holds no RNG state")
    if not isinstance(meta.get("rng"), dict):
        raise checkpoint_error(directory / STATE_FILE, "holds no RNG state")
    ranks = meta["rng"].get("ranks", {})  # the other ranks' states, by rank (from 1)
    if not isinstance(ranks, dict):
        raise checkpoint_error(directory / STATE_FILE, f"rng.ranks is a {type(ranks).__name__}; "
                                                       "expected a map of ranks to RNG states")
    lacking = [k for k, v in ranks.items()
               if not isinstance(v, dict) or f"rng.rank{k}.torch" not in rng]
    if lacking:
        raise checkpoint_error(directory / STATE_FILE,
                               f"RNG state of rank {', '.join(lacking)}: expected a JSON object "
                               f"here and rng.rank<r>.torch in {OPTIM_FILE}")
    check_rng_state(rng, meta["rng"], path=directory / OPTIM_FILE,
                    state_path=directory / STATE_FILE)
    return rng, meta["rng"]


class CheckedCheckpoint(NamedTuple):
    """A checkpoint read and checked against a model (and optimizer) by
    :func:`check_checkpoint`, not yet loaded into them (:meth:`load_into`)."""

    meta: dict[str, Any]  # the JSON state
    model_state: dict[str, torch.Tensor]  # for model.load_state_dict, aliases included
    optimizer_state: dict[str, Any] | None  # for optimizer.load_state_dict; None without one
    rng: RngState | None  # every rank's RNG state; None for a weights-only read

    def load_into(self, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer | None = None) -> None:
        """Load the checked state into ``model`` (and ``optimizer``, as checked for)."""
        model.load_state_dict(self.model_state, strict=True)
        if optimizer is not None:
            optimizer.load_state_dict(self.optimizer_state)


class _CheckedModel:
    """Stands in for a model in :func:`load_model_state`: its checks (names, shapes, a model
    on the meta device) run against the model's state dict, and the tensors that pass them are
    kept here instead of being loaded."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._expected = model.state_dict()
        self.tensors: dict[str, torch.Tensor] = {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._expected

    def load_state_dict(self, tensors: dict[str, torch.Tensor], strict: bool = True) -> None:
        self.tensors = tensors


def check_checkpoint(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    rng: bool = True,
) -> CheckedCheckpoint:
    """Read a checkpoint folder and check it fits ``model`` (and ``optimizer``), changing
    nothing; :class:`CheckpointError` naming the file otherwise. ``optimizer.safetensors`` is
    read (and its RNG states checked) when ``optimizer`` is given or ``rng``: a weights-only
    read (``optimizer=None, rng=False``) needs only ``model.safetensors`` and ``state.json``."""
    directory = Path(directory)
    meta = read_checkpoint_state(directory)
    sums = meta.get("sha256") if isinstance(meta.get("sha256"), dict) else {}
    rng_state = optimizer_state = None
    if optimizer is not None or rng:
        path = directory / OPTIM_FILE
        if not path.is_file():
            raise checkpoint_error(path, "missing; it holds the optimizer and RNG state a "
                                         "resume needs (a weights-only load, restore_rng=False, "
                                         "needs only model.safetensors and state.json)")
        tensors, _ = read_tensors(path, sums.get(OPTIM_FILE))
        rng_state = _rng_part(directory, tensors, meta)
        if optimizer is not None:
            optimizer_state = optimizer_state_for(optimizer, tensors, meta.get("optimizer"),
                                                  path=path, state_path=directory / STATE_FILE)
    checked = _CheckedModel(model)
    load_model_state(checked, directory / MODEL_FILE, sha256=sums.get(MODEL_FILE))
    return CheckedCheckpoint(meta, checked.tensors, optimizer_state, rng_state)


def load_checkpoint(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    restore_rng: bool = True,
    confirm: Callable[[CheckedCheckpoint], object] | None = None,
) -> dict[str, Any]:
    """Load a checkpoint folder into ``model`` (and ``optimizer``); return its JSON state.

    Only safetensors and JSON are read: no pickle, so an untrusted checkpoint cannot run code.
    With ``optimizer=None, restore_rng=False`` (a weights-only load) ``optimizer.safetensors`` is
    neither needed nor read. Every problem raises :class:`CheckpointError` naming the file,
    before the model, optimiser or RNG changes (:func:`check_checkpoint`). ``confirm`` sees
    the checked checkpoint then, before anything changes: what it raises is raised, with the
    model, optimiser and RNG as they were (a caller's own refusal, all or nothing).
    """
    checked = check_checkpoint(directory, model, optimizer, rng=restore_rng)
    if confirm is not None:
        confirm(checked)
    checked.load_into(model, optimizer)
    if restore_rng:
        restore_rng_state(*checked.rng)
    return checked.meta
