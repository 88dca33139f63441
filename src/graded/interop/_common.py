"""What the converters share: loading a Hugging Face model from memory or a local folder with
every weight, the activation names, and the checks that an export computes what our model
computes (every architecture field expressible, exact attention, an ungraded model)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from graded._schema import ConfigValueError
from graded.transformer import TransformerConfig, TransformerLM
from graded.transformer.config import FOLLOWS


def _load(model_or_path: Any, cls_name: str, model_type: str, **init: Any) -> Any:
    """A Hugging Face model object as given, or loaded from a local folder that holds a
    ``model_type`` checkpoint with all of its weights."""
    import transformers

    cls = getattr(transformers, cls_name)
    if isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path)
        if not path.is_dir():
            raise FileNotFoundError(
                f"{path} is not a local checkpoint folder of a {cls_name}; nothing is "
                f"downloaded: pass a model object (e.g. transformers.{cls_name}."
                f"from_pretrained({str(model_or_path)!r})) or a folder it was saved to")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{path} has no config.json; expected a folder written by "
                                    f"{cls_name}.save_pretrained")
        try:
            found = json.loads(config_file.read_text()).get("model_type")
        except (json.JSONDecodeError, AttributeError) as error:
            raise ValueError(f"{config_file} is not a JSON object; expected the config of a "
                             f"{cls_name}") from error
        if found != model_type:
            raise ValueError(f"{path} holds a checkpoint of model_type={found!r}; expected "
                             f"model_type={model_type!r} (a {cls_name})")
        try:
            model, info = cls.from_pretrained(str(path), local_files_only=True,
                                              output_loading_info=True, **init)
        except RuntimeError as error:  # weights whose shapes contradict config.json
            raise ValueError(f"the weights in {path} do not fit its config.json: "
                             f"{error}") from error
        if info["missing_keys"]:
            raise ValueError(f"the checkpoint in {path} lacks weights of a {cls_name}: "
                             f"{sorted(info['missing_keys'])}; expected all of them (they would "
                             "be initialised at random)")
        return model
    if not isinstance(model_or_path, cls):
        raise TypeError(f"expected a transformers.{cls_name} or a folder holding one, got "
                        f"{type(model_or_path).__name__}")
    return model_or_path


def _dtype(model: Any) -> torch.dtype:
    return next(model.parameters()).dtype


def _hf_model(cls: Any, config: Any, dtype: torch.dtype, **init: Any) -> Any:
    """A Hugging Face model of ``cls`` built in ``dtype`` as ``from_pretrained`` builds it (its
    ``_from_config``): what it computes in float32 whatever the dtype stays so. Casting a float32
    model (``.to(dtype)``) would cast those buffers too: LLaMA's rotary frequencies ω rounded to
    bfloat16 put the angle at position p off by up to p·ω·2⁻⁹ (0.2 radian at p = 2047 in the
    tests' model), and the model computed otherwise than once saved and loaded."""
    return cls._from_config(config, dtype=dtype, **init)


def _tied(src: dict[str, Tensor], embedding: str) -> bool:
    """Whether the output layer a model computes with holds its token embedding. A model whose
    config ties them may still not (an output layer replaced after loading); its weights
    decide."""
    head = src.get("lm_head.weight")
    return head is None or torch.equal(head, src[embedding])


def _config_of(hf: Any, names: dict[str, str], **fields: Any) -> TransformerConfig:
    """``TransformerConfig(**fields)`` for the Hugging Face config ``hf``. A value our config
    refuses (a ``layer_norm_epsilon`` of 0, ...) is named as the option of ``hf`` it came from
    (``names``: our field -> theirs) as well as ours."""
    try:
        return TransformerConfig(**fields)
    except ConfigValueError as error:
        ours = next((f for f in error.fields if f in names), None)
        if ours is None:
            raise
        raise ValueError(f"{type(hf).__name__}.{names[ours]}={fields[ours]!r} is not mapped: "
                         f"{error}") from error


# Hugging Face's activation names -> ours, for the ones computed by the same formula
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                "relu": "relu", "silu": "silu", "swish": "silu"}
_ACTIVATION_OF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


def _activation(hf: Any, field: str) -> str:
    """Our activation for the Hugging Face config field ``field`` of ``hf``; ValueError naming
    the field and its value when the formula is not one of ours."""
    name = getattr(hf, field)
    if name not in _ACTIVATIONS:
        raise ValueError(f"{type(hf).__name__}.{field}={name!r} is not mapped; expected one of "
                         f"{sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]



# Fields that do not change what an ungraded model computes in eval mode: regularisation,
# initialisation, padding, seq2seq-only fields, and the grading fields (the model is ungraded).
_GRADING_FIELDS = frozenset(
    name for name in TransformerConfig.model_fields
    if name.startswith(("grade_", "grading_", "token_grad"))
    or name in ("learnable_grades", "grades_per_head", "fold_grading", "input_grades"))
_NOT_FUNCTION = _GRADING_FIELDS | {
    "dropout", "attn_dropout", "init_std", "pad_id", "attn_backend", "attn_backend_options",
    "attn_backend_cycle", "cross_attn_backend", "cross_attn_backend_options", "n_decoder_layers"}
# attention backends that compute softmax(Q Kᵀ / √d) V exactly, as Hugging Face's models do
_EXACT_BACKENDS = ("full", "explicit", "chunked")


def _architecture(c: TransformerConfig) -> dict[str, Any]:
    """The fields that fix what an ungraded ``c`` computes, with their defaults resolved."""
    fields = {name: getattr(c, name) for name in TransformerConfig.model_fields
              if name not in _NOT_FUNCTION}
    fields.update({name: c.resolved(name) for name in FOLLOWS if name in fields},
                  rope_base=c.rope_base if c.positional == "rope" else None)
    del fields["bias"]  # an LM's biases are the three switches above
    return fields


def _same_function(c: TransformerConfig, expected: TransformerConfig, caller: str,
                   reference: str, unused: tuple[str, ...] = (), *,
                   cross_attention: bool = False) -> None:
    """Refuse an export whose Hugging Face model would compute something other than ``c``;
    ``unused`` fields do not act in the model exported. The attention, and with
    ``cross_attention`` the cross-attention too, must be exact with scores scaled by
    1/√head_dim (a backend's ``scale`` option unset or that value)."""
    sides = [("attn_backend", c.attn_backend, c.attn_backend_options)]
    if cross_attention:
        sides.append(("cross_attn_backend", c.cross_attn_backend, c.cross_attn_backend_options))
    for field, backend, options in sides:
        if backend not in _EXACT_BACKENDS:
            raise ValueError(f"{caller}: TransformerConfig.{field}={backend!r} is not exact "
                             f"attention; expected one of {_EXACT_BACKENDS}")
        scale, default = options.get("scale"), c.head_dim ** -0.5
        if scale is not None and not math.isclose(scale, default, rel_tol=1e-12):
            raise ValueError(f"{caller}: TransformerConfig.{field}_options scale={scale!r} "
                             f"scales the scores otherwise than {reference}; expected it unset "
                             f"or 1/sqrt(head_dim) = {default!r}")
    if c.attn_backend_cycle:
        raise ValueError(f"{caller}: TransformerConfig.attn_backend_cycle="
                         f"{c.attn_backend_cycle!r} gives layers backends of their own, which "
                         "a Hugging Face model cannot express; expected an empty cycle (every "
                         f"layer on one of {_EXACT_BACKENDS})")
    ours, theirs = _architecture(c), _architecture(expected)
    for name in unused:
        del ours[name], theirs[name]
    differ = [f"{name}={ours[name]!r} (expected {theirs[name]!r})" for name in ours
              if ours[name] != theirs[name]]
    if differ:
        raise ValueError(f"{caller}: {reference} cannot express TransformerConfig."
                         f"{', '.join(differ)}")


def _ungraded(model: nn.Module, cls: type[nn.Module] = TransformerLM) -> TransformerConfig:
    if not isinstance(model, cls):
        raise TypeError(f"expected a {cls.__name__}, got {type(model).__name__}")
    if model.config.grading is not None:
        raise ValueError(f"TransformerConfig.grading={model.config.grading!r}: a graded model "
                         "has no Hugging Face counterpart; expected an ungraded model (export "
                         "it before graft_grading)")
    return model.config


def _only_buffers(hf: Any, missing: list[str], unexpected: list[str]) -> None:
    """Keys a Hugging Face model may lack in a state dict are its non-parameter buffers."""
    params = {n for n, _ in hf.named_parameters()}
    if unexpected or any(k in params for k in missing):
        raise ValueError(f"weights do not fit the Hugging Face model: missing "
                         f"{[k for k in missing if k in params]}, unexpected {unexpected}")
