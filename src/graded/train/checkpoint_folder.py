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

Writes are atomic: the folder is assembled under a temporary name and moved into place with
:func:`os.replace`, so a crash or an exception leaves either the previous checkpoints or the new
one, never a partial folder (a writer killed mid-save leaves its hidden temporary folder, which
the next save of the run removes). A checkpoint of the same step is replaced only once the new
one is complete; a write the disk refuses (full, read-only) is an :class:`OSError` naming the
checkpoint folder. Nothing here calls :func:`torch.load`: loading a checkpoint cannot execute
code. :mod:`graded.train.state_tensors` turns the model, optimiser and RNG states into the
files; :mod:`graded.train.checkpoint` keeps a run's checkpoints.

Loading checks before it changes anything it can: ``state.json`` records the SHA-256 of both
tensor files, and a missing, truncated or corrupt file, weights and optimiser state that do
not fit the model (keys, shapes, parameter groups; a model still on the meta device), or RNG
states that do not restore, raise :class:`CheckpointError` before the model, optimiser or
generators change; its one-line message names the file and the problem. A weights-only load
(``optimizer=None, restore_rng=False``, for evaluation and generation) reads
``model.safetensors`` and ``state.json`` only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from graded._io import atomic_write_text
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

__all__ = ["MODEL_FILE", "OPTIM_FILE", "STATE_FILE", "TEMP_DIR", "load_checkpoint",
           "read_checkpoint_state", "read_rng_state", "save_checkpoint"]

# the temporary folder a checkpoint is assembled in (save_checkpoint), left by a killed writer
TEMP_DIR = re.compile(r"^\.step_\d{9}\..+\.tmp$")
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
        _move_into_place(tmp, directory)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        error = _write_error(directory, tmp, exc)
        if error is None:
            raise
        raise error from exc
    return directory


def _move_into_place(tmp: Path, directory: Path) -> None:
    """Rename the complete folder ``tmp`` to ``directory``; a ``directory`` there already is
    moved aside first (under a temporary name the next rotation removes) and removed after, or
    put back if the rename fails."""
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


def load_checkpoint(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint folder into ``model`` (and ``optimizer``); return its JSON state.

    Only safetensors and JSON are read: no pickle, so an untrusted checkpoint cannot run code.
    With ``optimizer=None, restore_rng=False`` (a weights-only load) ``optimizer.safetensors`` is
    neither needed nor read. Every problem raises :class:`CheckpointError` naming the file.
    """
    directory = Path(directory)
    meta = read_checkpoint_state(directory)
    sums = meta.get("sha256") if isinstance(meta.get("sha256"), dict) else {}
    if optimizer is None and not restore_rng:
        load_model_state(model, directory / MODEL_FILE, sha256=sums.get(MODEL_FILE))
        return meta
    path = directory / OPTIM_FILE
    if not path.is_file():
        raise checkpoint_error(path, "missing; it holds the optimizer and RNG state a resume "
                                     "needs (a weights-only load, restore_rng=False, needs "
                                     "only model.safetensors and state.json)")
    # everything that can be checked is, before the model, optimiser or RNG changes
    tensors, _ = read_tensors(path, sums.get(OPTIM_FILE))
    rng = _rng_part(directory, tensors, meta)
    optimizer_state = None if optimizer is None else optimizer_state_for(
        optimizer, tensors, meta.get("optimizer"), path=path, state_path=directory / STATE_FILE)
    load_model_state(model, directory / MODEL_FILE, sha256=sums.get(MODEL_FILE))
    if optimizer is not None:
        optimizer.load_state_dict(optimizer_state)
    if restore_rng:
        restore_rng_state(*rng)
    return meta
