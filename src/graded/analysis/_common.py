"""Shared plumbing of the diagnostics: running a model, eval mode, saving PNG figures."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from graded import plotting
from graded._precision import at_least_float32
from graded.plotting import pyplot

__all__ = ["INPUT_PADDING", "LOW_PRECISION", "OUTPUT_PADDING", "Inputs", "check_distributions",
           "eval_mode",
           "input_length", "padding_argument", "pyplot", "real_rows", "real_tokens", "run_model",
           "same_draw", "save_figure", "widened"]

# What a diagnostic feeds the model: one tensor (token ids or features), or a tuple of
# positional arguments (e.g. ``(src_ids, tgt_ids)`` for a seq2seq model).
Inputs = Tensor | tuple[Any, ...]


def check_materialised(model: nn.Module) -> None:
    """Raise ``ValueError`` naming the first parameter or buffer of ``model`` on the meta
    device: it has a shape but no values, so no diagnostic of it means anything."""
    name = next((n for n, t in [*model.named_parameters(), *model.named_buffers()]
                 if t.is_meta), None)
    if name is not None:
        raise ValueError(f"{type(model).__name__}'s {name!r} is on the meta device (a shape, no "
                         "values): materialise the model (to_empty() and load its weights) "
                         "before running a diagnostic")


#: The random state every forward pass of :func:`run_model` starts from inside
#: :func:`same_draw`: torch's CPU generator state and (device index, state) of CUDA devices.
_DRAW: contextvars.ContextVar[tuple[Tensor, list[tuple[int, Tensor]]] | None] = (
    contextvars.ContextVar("graded_analysis_draw", default=None))


@contextlib.contextmanager
def same_draw(model: nn.Module) -> Iterator[None]:
    """Inside the block, every forward pass of :func:`run_model` starts from the random state
    the block started in (torch's CPU generator, and the generators of the CUDA devices
    ``model`` is on), which is restored when the block ends.

    A backend that draws at every call (``lsh`` without a ``seed``: fresh rotations each
    forward pass, as in the Reformer) gives each pass another attention; the diagnostics of
    one report then each measure a different draw (the maps of one pass, the ranks of
    another). With every pass on the same draw they all measure the one the first pass
    made, and the caller's random state is left as it was."""
    devices = sorted({t.device.index or 0 for t in [*model.parameters(), *model.buffers()]
                      if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        token = _DRAW.set((torch.get_rng_state(),
                           [(d, torch.cuda.get_rng_state(d)) for d in devices]))
        try:
            yield
        finally:
            _DRAW.reset(token)


def run_model(model: nn.Module, inputs: Inputs, **kwargs: Any) -> Any:
    """``model(inputs)`` for a tensor, ``model(*inputs)`` for a tuple (of a model with values:
    :func:`check_materialised`); inside :func:`same_draw`, from the block's random state."""
    check_materialised(model)
    draw = _DRAW.get()
    if draw is not None:
        cpu, cuda = draw
        torch.set_rng_state(cpu)
        for device, state in cuda:
            torch.cuda.set_rng_state(state, device)
    if isinstance(inputs, Tensor):
        return model(inputs, **kwargs)
    if isinstance(inputs, tuple):
        return model(*inputs, **kwargs)
    raise TypeError(
        f"inputs must be a tensor or a tuple of model arguments, got {type(inputs).__name__}"
    )


def padding_argument(model: nn.Module, inputs: Inputs, model_kwargs: dict[str, Any],
                     names: Sequence[str]) -> Tensor | None:
    """The first of the arguments ``names`` (e.g. ``key_padding_mask``) that ``model``'s call on
    ``inputs`` and ``model_kwargs`` (:func:`run_model`) gives a tensor, by keyword or by
    position; None when none is given or the forward has no signature to read."""
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    try:
        bound = inspect.signature(model.forward).bind_partial(*args, **model_kwargs)
    except (TypeError, ValueError):
        return None
    return next((bound.arguments[n] for n in names
                 if isinstance(bound.arguments.get(n), Tensor)), None)


#: The padding of a model's input tokens and of its output rows: an LM's or encoder's
#: ``key_padding_mask`` for both; a seq2seq model's source and target padding.
INPUT_PADDING = ("key_padding_mask", "src_key_padding_mask")
OUTPUT_PADDING = ("key_padding_mask", "tgt_key_padding_mask")


def real_rows(mask: Tensor | None, shape: Sequence[int]) -> Tensor | None:
    """(B, T) True at the real rows of a (B, T, ...) tensor of ``shape`` under a padding
    ``mask`` (True = padding); None without a mask of that (B, T), or without padding."""
    if (mask is None or len(shape) < 3 or tuple(mask.shape) != tuple(shape[:2])
            or not bool(mask.bool().any())):
        return None
    return ~mask.bool()


def real_tokens(model: nn.Module, inputs: Inputs, model_kwargs: dict[str, Any],
                x: Tensor) -> Tensor | None:
    """(B, T) True at the real tokens of the input token vectors ``x`` (B, T, d) when the
    model's call gives its ``key_padding_mask`` (a seq2seq model: ``src_key_padding_mask``),
    by keyword or by position, a (B, T) mask with some padding (True); None otherwise. The
    diagnostics that perturb or read the token vectors then use the real tokens only, so a
    sequence's numbers do not depend on the padding of its batch."""
    return real_rows(padding_argument(model, inputs, model_kwargs, INPUT_PADDING), x.shape)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Evaluation mode (no dropout) for the duration of a diagnostic; restores each
    submodule's own mode afterwards (a model in training mode with a frozen submodule in eval
    mode keeps that submodule in eval mode)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        model.train(modes[0][1])  # the model's own train() first, then any mixed submodule
        for m, training in modes:
            if m.training != training:
                m.training = training


#: Floating dtypes too coarse for the diagnostics' sums and finite differences.
LOW_PRECISION = (torch.float16, torch.bfloat16)


def widened(x: Tensor) -> Tensor:
    """``x`` in float32 when it is a float16/bfloat16 tensor, otherwise unchanged: sums over
    many attention weights and products over layers are computed at least in float32."""
    return x.to(at_least_float32(x.dtype))


def save_figure(fig: Any, out_dir: str | Path, filename: str) -> Path:
    """Save ``fig`` as ``out_dir/filename`` (a PNG), close it and return the path."""
    if not filename.endswith(".png"):
        raise ValueError(f"plots are PNG files: filename must end in '.png', got {filename!r}")
    return plotting.save_figure(fig, Path(out_dir) / filename, dpi=80)


def check_weights(weights: Tensor, name: str = "weights", *, min_dim: int = 1) -> None:
    """Attention weights (or distributions) must be a floating tensor with the keys (the
    distribution's support) in the last dimension and at least ``min_dim`` dimensions."""
    if not isinstance(weights, Tensor) or not weights.is_floating_point():
        got = weights.dtype if isinstance(weights, Tensor) else type(weights).__name__
        raise TypeError(f"{name} must be a floating tensor, got {got}")
    if weights.dim() < min_dim:
        expected = "(..., queries, keys)" if min_dim >= 2 else "(..., keys)"
        raise ValueError(
            f"{name} must have shape {expected}, got shape {tuple(weights.shape)}"
        )


def check_distributions(weights: Tensor, name: str = "weights") -> None:
    """Each row (last dimension) of ``weights`` must be a probability distribution, summing to
    1, or all zero (a query whose keys are all masked), within a tolerance of the dtype
    (1e-2 for float16/bfloat16, 1e-4 otherwise): the entropy and the Jensen–Shannon divergence
    of a row that sums to anything else are not the quantities they name (JS of unnormalised
    rows exceeds ln 2). The values must already be finite and non-negative."""
    if weights.numel() == 0 or torch.compiler.is_compiling():
        return
    tol = 1e-2 if weights.dtype in LOW_PRECISION else 1e-4
    sums = widened(weights.detach()).sum(dim=-1)
    bad = ((sums - 1).abs() > tol) & (sums.abs() > tol)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        where = f" at index {first}" if first else ""
        raise ValueError(f"{name} must be distributions along the last dimension (each row "
                         f"summing to 1, or 0 for a fully masked row), got a row summing to "
                         f"{float(sums[first]):.6g}{where}")


def to_float64(x: Tensor) -> Tensor:
    """Detached float64 copy used by the spectral diagnostics (SVDs want the precision)."""
    return x.detach().to(torch.float64)


def input_lengths(inputs: Inputs) -> list[int]:
    """The length of each (batch, length, ...) tensor among the inputs (source and target of a
    seq2seq model), in order."""
    xs = [inputs] if isinstance(inputs, Tensor) else [x for x in inputs if isinstance(x, Tensor)]
    lengths = [int(x.shape[1]) for x in xs if x.dim() >= 2]
    if not lengths:
        raise ValueError(f"inputs hold no (batch, length, ...) tensor; got tensors of shape "
                         f"{[tuple(x.shape) for x in xs]}")
    return lengths


def check_not_empty(inputs: Inputs, caller: str) -> None:
    """ValueError naming the shape of an input tensor (batch, length, ...) with no sequence or
    no position: every mean of the diagnostics would be over nothing (NaN), and their report
    would blame padding."""
    input_lengths(inputs)  # at least one (batch, length, ...) tensor
    xs = [inputs] if isinstance(inputs, Tensor) else [x for x in inputs if isinstance(x, Tensor)]
    empty = next((tuple(x.shape) for x in xs if x.dim() >= 2 and 0 in x.shape[:2]), None)
    if empty is not None:
        raise ValueError(f"{caller} needs at least one sequence of at least one position, got "
                         f"an input of shape {empty} (batch, length, ...)")


def input_length(inputs: Inputs) -> int:
    """The longest sequence among the inputs (source and target of a seq2seq model)."""
    return max(input_lengths(inputs))



def short_names(keys: Sequence[str]) -> list[str]:
    """Plot labels for diagnostics keys: 'decoder.stack.blocks.1.self_attn.attn#1' ->
    'blocks.1.self_attn#1' (the ``#n`` of a repeated call, :func:`call_keys`, is kept). Keys
    whose short forms would coincide (the encoder's and decoder's block 0) keep their full
    names."""
    short = [_short_name(k) for k in keys]
    return [s if short.count(s) == 1 else k for s, k in zip(short, keys, strict=True)]


def _short_name(key: str) -> str:
    name, hash_, n = key.partition("#")
    parts = name.split(".")
    if "blocks" in parts:
        i = parts.index("blocks")
        parts = parts[i : i + 3]
    return (".".join(p for p in parts if p != "attn") or name) + hash_ + n
