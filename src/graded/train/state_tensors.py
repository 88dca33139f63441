"""Model, optimiser and RNG state as safetensors and JSON, read back with every problem named.

The tensor half of a checkpoint (:mod:`graded.train.checkpoint` assembles the folder). A tensor
registered under several names (tied embeddings, grades shared by several stages) is stored once
and its other names are listed in the file's metadata. Reading never unpickles; it checks a
file's SHA-256 when one is recorded, and checks names and shapes against the model or optimiser
before changing it: every problem is a :class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes
from safetensors.torch import save_file


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and the problem."""


def checkpoint_error(path: str | os.PathLike[str], problem: str) -> CheckpointError:
    return CheckpointError(f"checkpoint file {path}: {problem}")


def _first(names: list[str], n: int = 3) -> str:
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_tensors(path: Path, sha256: str | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor and the metadata of a safetensors file, checked against ``sha256``."""
    if not path.is_file():
        raise checkpoint_error(path, "missing")
    try:
        with safe_open(str(path), framework="pt") as fh:
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
            metadata = fh.metadata() or {}
        if sha256 is not None and sha256_of(path) != sha256:
            raise checkpoint_error(
                path, "corrupt (its SHA-256 differs from the one state.json records)")
    except (SafetensorError, OSError) as exc:
        raise checkpoint_error(path, f"truncated, corrupt or unreadable ({exc})") from None
    return tensors, metadata


def jsonable(value: Any) -> Any:
    """Convert tuples, numpy scalars and 0-d tensors to plain JSON types (TypeError otherwise)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} value {value!r} in a JSON checkpoint")


# --------------------------------------------------------------------------- model state


def save_model_state(model: torch.nn.Module, path: str | os.PathLike[str]) -> None:
    """Save ``model.state_dict()`` with shared tensors stored once (aliases in the metadata).

    Tensors are grouped by identity (same storage, offset, shape and stride); the first name of
    each group is stored, the others map to it. Copies are saved, so no two stored tensors share
    memory (which safetensors refuses).
    """
    state = model.state_dict()
    empty = [name for name, t in state.items() if t.is_meta]
    if empty:
        raise ValueError(f"cannot save the model's {_first(empty)}: on the meta device, they "
                         "hold no values (materialise the model first, e.g. "
                         "model.to_empty(device=...) and load or initialise its weights)")
    canonical: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
               t.dtype, t.device)
        if t.numel() and key in canonical:
            aliases[name] = canonical[key]
            continue
        canonical[key] = name
        tensors[name] = t.detach().to("cpu", copy=True).contiguous()
    save_file(tensors, str(path), metadata={"aliases": json.dumps(aliases)})


def load_model_state(
    model: torch.nn.Module, path: str | os.PathLike[str], *, sha256: str | None = None
) -> None:
    """Load a file written by :func:`save_model_state` into ``model``; names, shapes (and the
    checksum when given) are checked before the model changes (:class:`CheckpointError`)."""
    path = Path(path)
    tensors, metadata = read_tensors(path, sha256)
    try:
        aliases = json.loads(metadata.get("aliases", "{}"))
        for alias, name in aliases.items():
            tensors[alias] = tensors[name]
    except (ValueError, KeyError, AttributeError) as exc:
        raise checkpoint_error(path, f"corrupt alias metadata ({exc!r})") from None
    expected = model.state_dict()
    empty = [k for k, v in expected.items() if v.is_meta]
    if empty:  # load_state_dict would copy into them as a no-op, with a warning only
        raise checkpoint_error(path, f"cannot load into the model's {_first(empty)}: on the "
                                     "meta device, they have no storage; materialise the model "
                                     "first (model.to_empty(device=...))")
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    shapes = [f"{k} is {tuple(tensors[k].shape)} in the file, {tuple(v.shape)} in the model"
              for k, v in expected.items() if k in tensors and tensors[k].shape != v.shape]
    problems = ([f"missing {_first(missing)}"] if missing else []) + (
        [f"unexpected {_first(unexpected)}"] if unexpected else []) + shapes[:3]
    if problems:
        raise checkpoint_error(path, "does not fit the model: " + "; ".join(problems))
    model.load_state_dict(tensors, strict=True)


# --------------------------------------------------------------------------- optimiser state


def optimizer_to_flat(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict]:
    """Split ``optimizer.state_dict()`` into tensors (for safetensors) and a JSON-able rest."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, pstate in state_dict["state"].items():
        for key, value in pstate.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = jsonable(value)
    rest = {"param_groups": jsonable(state_dict["param_groups"]), "scalars": scalars}
    return tensors, rest


def optimizer_from_flat(tensors: dict[str, torch.Tensor], rest: dict) -> dict[str, Any]:
    """Inverse of :func:`optimizer_to_flat`: a state dict for ``optimizer.load_state_dict``."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    for pid, extra in rest["scalars"].items():
        state.setdefault(int(pid), {}).update(extra)
    groups = []
    for group in rest["param_groups"]:
        group = dict(group)
        if "betas" in group and isinstance(group["betas"], list):
            group["betas"] = tuple(group["betas"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


# --------------------------------------------------------------------------- RNG state


def capture_rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The CPU (and CUDA) torch generators as uint8 tensors; Python and NumPy state as JSON."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, st in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = st
    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    rest = {
        "python": [version, list(internal), gauss],
        "numpy": [np_name, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
    }
    return tensors, rest


RngState = tuple[dict[str, torch.Tensor], dict[str, Any]]


def restore_rng_state(tensors: dict[str, torch.Tensor], rest: dict[str, Any],
                      rank: int = 0) -> None:
    """Inverse of :func:`capture_rng_state`: the state stored for ``rank`` in a checkpoint of
    every rank's state (:func:`ranked_rng_state`), rank 0's where it holds none for ``rank``."""
    tensors, rest = rank_rng_state(tensors, rest, rank)
    torch.set_rng_state(tensors["rng.torch"])
    cuda = sorted(k for k in tensors if k.startswith("rng.cuda."))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    version, internal, gauss = rest["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = rest["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def check_rng_state(tensors: dict[str, torch.Tensor], rest: dict[str, Any], *, path: Path,
                    state_path: Path) -> None:
    """Check every rank's RNG state (tensors from ``path``, the rest from ``state_path``) by
    restoring it into new generators, so that :func:`restore_rng_state` cannot fail half-way
    (the global generators are not touched; CUDA states are checked by the CUDA runtime)."""
    ranks = [0, *(int(r) for r in (rest.get("ranks") or {}) if str(r).isdigit())]
    for rank in ranks:
        own, own_rest = rank_rng_state(tensors, rest, rank)
        where = f"RNG state{f' of rank {rank}' if rank else ''}"
        try:
            torch.Generator().set_state(own["rng.torch"])
        except (KeyError, TypeError, RuntimeError) as exc:
            raise checkpoint_error(path, f"{where}: not a torch generator state "
                                         f"({' '.join(str(exc).split())})") from None
        try:
            version, internal, gauss = own_rest["python"]
            random.Random().setstate((version, tuple(internal), gauss))
            name, keys, pos, has_gauss, cached = own_rest["numpy"]
            np.random.RandomState().set_state(
                (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
            raise checkpoint_error(state_path, f"{where}: corrupt Python or NumPy generator "
                                               f"state ({exc!r})") from None


def ranked_rng_state(states: Sequence[RngState]) -> RngState:
    """Every rank's RNG state (``states[r]`` of rank r, each from :func:`capture_rng_state`)
    as one checkpoint's tensors and JSON: rank 0's under the names a one-process checkpoint
    uses (``rng.torch``, ``rng.cuda.<i>``; ``python``, ``numpy``), rank r's tensors as
    ``rng.rank<r>.torch``, ... (copies: safetensors stores no two tensors that share memory)
    and its JSON under ``ranks`` → ``"<r>"``."""
    tensors, rest = dict(states[0][0]), dict(states[0][1])
    if len(states) > 1:
        rest["ranks"] = {}
        for rank, (own, own_rest) in enumerate(states[1:], start=1):
            tensors.update({f"rng.rank{rank}.{k.removeprefix('rng.')}": v.clone()
                            for k, v in own.items()})
            rest["ranks"][str(rank)] = own_rest
    return tensors, rest


def rank_rng_state(tensors: dict[str, torch.Tensor], rest: dict[str, Any],
                   rank: int) -> RngState:
    """The RNG state :func:`ranked_rng_state` stored for ``rank``; rank 0's where it stored
    none for it (a run resumed on more processes than saved it: the new ranks start as every
    rank of a fresh run does, alike)."""
    own = (rest.get("ranks") or {}).get(str(rank)) if rank else None
    if own is None:
        return ({k: v for k, v in tensors.items() if not k.startswith("rng.rank")},
                {k: v for k, v in rest.items() if k != "ranks"})
    prefix = f"rng.rank{rank}."
    return {f"rng.{k.removeprefix(prefix)}": v for k, v in tensors.items()
            if k.startswith(prefix)}, own


def rng_state_to_bytes(state: RngState) -> bytes:
    """One RNG state as the bytes of a safetensors file (its JSON part as the uint8 tensor
    ``rng.json``), to send to another rank: no pickle."""
    tensors, rest = state
    text = bytearray(json.dumps(rest).encode("utf-8"))
    return save_bytes({**tensors, "rng.json": torch.frombuffer(text, dtype=torch.uint8)})


def rng_state_from_bytes(data: bytes) -> RngState:
    """Inverse of :func:`rng_state_to_bytes`."""
    tensors = load_bytes(data)
    rest = json.loads(bytes(tensors.pop("rng.json").numpy()).decode("utf-8"))
    return tensors, rest


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                         rest: Any, *, path: Path, state_path: Path) -> None:
    """Load the optimiser state (tensors from ``path``, the rest from ``state_path``) after
    checking it fits ``optimizer`` (:func:`optimizer_state_for`)."""
    optimizer.load_state_dict(optimizer_state_for(optimizer, tensors, rest, path=path,
                                                  state_path=state_path))


def optimizer_state_for(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                        rest: Any, *, path: Path, state_path: Path) -> dict[str, Any]:
    """The state dict for ``optimizer.load_state_dict`` of the tensors of ``path`` and the
    rest of ``state_path``, checked to fit ``optimizer``: parameter groups, their sizes, the
    state tensors' shapes (:class:`CheckpointError` otherwise; ``optimizer`` is not changed)."""
    if not isinstance(rest, dict):
        raise checkpoint_error(state_path, "holds no optimizer state (saved without one)")
    try:
        state = optimizer_from_flat({k: v for k, v in tensors.items() if k.startswith("state.")},
                                    rest)
        saved = [len(g["params"]) for g in state["param_groups"]]
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise checkpoint_error(state_path, f"corrupt optimizer state ({exc!r})") from None
    have = [len(g["params"]) for g in optimizer.param_groups]
    if saved != have:
        raise checkpoint_error(path, f"optimizer state for parameter groups of sizes {saved} "
                                     f"does not fit the optimizer's {have}")
    params = {pid: p for g, og in zip(state["param_groups"], optimizer.param_groups)
              for pid, p in zip(g["params"], og["params"])}
    for pid, pstate in state["state"].items():
        for key, value in pstate.items():
            shape = tuple(params[pid].shape) if pid in params else None
            if isinstance(value, torch.Tensor) and value.dim() and tuple(value.shape) != shape:
                raise checkpoint_error(path, f"optimizer state state.{pid}.{key} is "
                                             f"{tuple(value.shape)}, its parameter is {shape}")
    return state
