"""Validated options of one training run (the ``train`` section of a run config).

Pydantic v2 models on the library's strict base (:class:`graded._schema.Strict`): an unknown
key or an impossible value is rejected when the options are built, before any work starts.
:mod:`graded.config` composes these into the full run config;
:class:`graded.train.trainer.Trainer` consumes them.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, ValidationInfo, field_validator, model_validator

from graded._schema import Strict  # the shared strict base; importable here as before
from graded.evaluation.metrics import HIGHER_IS_BETTER
from graded.train.distributed import check_device_name

__all__ = ["EarlyStopping", "Strict", "TrainOptions", "monitor_mode_of", "number_not_bool",
           "takes_false_for_null"]


def monitor_mode_of(metric: str) -> Literal["min", "max"] | None:
    """Whether a better ``metric`` is smaller (``loss``, ``perplexity``, errors) or larger
    (accuracies, R²); None for a name the evaluation metrics do not know."""
    if metric in ("loss", "perplexity"):
        return "min"
    higher = HIGHER_IS_BETTER.get(metric)
    return None if higher is None else "max" if higher else "min"


def takes_false_for_null(annotation: Any) -> bool:
    """Whether a key of type ``annotation`` reads ``false`` as null (off): it may be null and
    takes no booleans. TOML has no null, so this is how a TOML file (and ``--set``, and YAML
    alike) switches such a key off, e.g. ``clip_norm = false``; a key that takes booleans
    keeps ``false`` as false (docs/training.md, "Keys that can be off")."""
    types = get_args(annotation)
    return type(None) in types and bool not in types


def number_not_bool(model: type[Strict], value: Any, info: ValidationInfo) -> Any:
    """``value`` of the field ``info.field_name`` of ``model``, refused when it is a boolean
    given for a number (lax validation reads ``steps: true`` as 1 step, ``lr: true`` as 1.0);
    ``false`` for a key that can be off is null (:func:`takes_false_for_null`)."""
    annotation = model.model_fields[info.field_name].annotation
    if value is False and takes_false_for_null(annotation):
        return None
    types = (annotation, *get_args(annotation))
    if isinstance(value, bool) and bool not in types and (int in types or float in types):
        off = ", or false or null for off" if type(None) in types else ""
        raise ValueError(f"got {value!r}; expected a number, not a boolean{off}")
    return value


class EarlyStopping(Strict):
    """Stop when the monitored evaluation metric has not improved for ``patience`` evaluations.

    ``min_delta`` decides only which evaluations count as improvements here; the best
    checkpoint is the best monitored value, strictly (:mod:`graded.train.stopping`)."""

    patience: int = Field(5, ge=1, description="evaluations without improvement before stopping")
    min_delta: float = Field(0.0, ge=0.0, allow_inf_nan=False,
                             description="an evaluation counts as an improvement for the "
                             "patience when it beats the last one that counted by more than "
                             "this (the best checkpoint ignores it)")

    @field_validator("*", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return number_not_bool(cls, value, info)


class TrainOptions(Strict):
    """Optimiser, schedule, batching, evaluation, checkpoint and logging options."""

    steps: int = Field(1000, ge=1, description="optimizer steps in total")
    batch_size: int = Field(64, ge=1, description="global batch size (all ranks, all micro-steps)")
    grad_accum: int = Field(1, ge=1, description="micro-batches accumulated per optimizer step")
    lr: float = Field(1e-3, gt=0.0, allow_inf_nan=False, description="peak learning rate")
    grade_lr: float | None = Field(
        None, gt=0.0, allow_inf_nan=False,
        description="learning rate of the grade parameters (recipes bound it)"
    )
    weight_decay: float = Field(0.01, ge=0.0, allow_inf_nan=False)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = Field(1e-8, gt=0.0, allow_inf_nan=False)
    schedule: Literal["constant", "cosine", "inverse_sqrt"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="cosine floor as a fraction")
    clip_norm: float | None = Field(1.0, gt=0.0, description="max gradient norm; null or "
                                   "false = off")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    eval_every: int = Field(100, ge=1, description="evaluate every N steps (and at the end)")
    eval_batch_size: int = Field(256, ge=1)
    log_every: int = Field(10, ge=1, description="log training scalars every N steps")
    checkpoint_every: int | None = Field(
        None, ge=1, description="checkpoint every N steps; null = at evaluations and the end"
    )
    keep_last: int = Field(3, ge=1, description="checkpoints kept besides the best")
    monitor: str = Field("loss", description="evaluation metric that picks the best checkpoint: "
                         "loss or a metric the run's evaluation reports")
    monitor_mode: Literal["min", "max"] = Field(
        "min", description="whether a smaller or a larger monitor is better (default: min "
        "for loss, perplexity, mse and mae, max for accuracies and r2)")
    early_stopping: EarlyStopping | None = None
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N'")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="autocast dtype of the training forward passes (fp16 adds a "
        "gradient scaler); parameters, optimizer state and evaluation stay fp32")
    compile: bool = Field(False, description="torch.compile the module the training step calls")
    progress: bool = Field(True, description="show a progress bar")
    tensorboard: bool = Field(True, description="write TensorBoard event files")

    @field_validator("*", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return number_not_bool(cls, value, info)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        """Only the names :func:`graded.train.distributed.resolve_device` takes: ``cpu:N`` (a
        CPU index torch ignores) or ``mps`` are refused when the config is read."""
        return check_device_name(value)

    @model_validator(mode="before")
    @classmethod
    def _monitor_mode(cls, data: Any) -> Any:
        """``monitor_mode`` left out (or null) follows ``monitor``: a run monitoring accuracy
        keeps its most accurate checkpoint, not its least."""
        if isinstance(data, dict) and data.get("monitor_mode") is None:
            mode = monitor_mode_of(data.get("monitor", "loss"))
            data = {**data, "monitor_mode": mode or "min"}
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainOptions:
        if self.warmup_steps >= self.steps and self.schedule != "constant":
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be smaller than steps ({self.steps}); "
                "lower train.warmup_steps or raise train.steps"
            )
        if self.min_lr_ratio and self.schedule != "cosine":
            raise ValueError(
                f"min_lr_ratio ({self.min_lr_ratio}) is the floor of the cosine schedule; "
                f"schedule {self.schedule!r} has none (expected min_lr_ratio 0, or schedule "
                "'cosine')"
            )
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be divisible by grad_accum "
                f"({self.grad_accum})"
            )
        for b in self.betas:
            if not 0.0 <= b < 1.0:
                raise ValueError(f"betas must lie in [0, 1), got {self.betas}")
        return self
