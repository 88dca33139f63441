"""Configuration of a PatternBoost run (003 §3.3) and of its two baselines.

A :class:`graded._schema.ConfigModel` like every config of the library: unknown keys are errors,
assignments are validated, and errors read ``PatternBoostConfig.<field>=<value> is invalid:
expected ...``. Problems come from the registry :data:`.problems.PROBLEMS`; the ``model`` keys
are :class:`graded.TransformerConfig` fields.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from graded._schema import (
    ConfigModel,
    Invalid,
    choice,
    is_int,
    is_number,
    not_a_key,
    positive_int,
    satisfies,
)
from graded.checks import SEED_RANGE

__all__ = ["MODES", "RESUMABLE_CHANGES", "PatternBoostConfig"]

MODES = ("patternboost", "local-only", "global-only")

# Fields a resumed run may change: they decide when to stop or how to run, not what is computed.
RESUMABLE_CHANGES = ("rounds", "time_limit_s", "stop_at", "max_local_search_calls", "workers",
                     "progress")
# Fields only a run that builds the transformer reads: training and sampling.
_MODEL_RUN_FIELDS = ("model", "train_steps", "batch_size", "lr", "weight_decay", "temperature",
                     "top_k")
# TransformerConfig fields the problem decides (see .model.build_model).
_DERIVED_MODEL_FIELDS = ("vocab_size", "max_len", "pad_id")


def _default_model() -> dict[str, Any]:
    return {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 256}


def _problems() -> list[str]:
    from .problems import PROBLEMS  # read when validating: problems may be registered later

    return sorted(PROBLEMS)


def _model_fields(v: Any) -> Any:
    from graded.transformer.config import TransformerConfig

    if not isinstance(v, dict):
        raise Invalid("a dict of TransformerConfig fields")
    allowed = set(TransformerConfig.model_fields) - set(_DERIVED_MODEL_FIELDS)
    unknown = sorted(set(v) - allowed)
    if unknown:
        raise Invalid(f"TransformerConfig fields other than {list(_DERIVED_MODEL_FIELDS)} (set "
                      f"by the problem); unknown: {unknown}")
    return v


Positive = Annotated[int, positive_int()]
AtLeastZero = Annotated[int, satisfies(lambda v: is_int(v) and v >= 0, "an integer >= 0")]
# finite: lr=inf passed as "positive" and surfaced as a NaN probability tensor in sampling
PositiveNumber = Annotated[float, satisfies(lambda v: is_number(v) and 0 < v < math.inf,
                                            "a finite positive number")]


class PatternBoostConfig(ConfigModel):
    """Every setting of a run; saved as config.json in the run folder.

    mode: "patternboost" (local search + transformer, 003 §3.3), "local-only" (each round runs
        `samples` local searches from the empty object: the same number of local-search calls
        per round as PatternBoost's repairs), or "global-only" (the transformer's samples enter
        the database as decoded, with no repair; only the initial dataset uses local search).
    initial: local searches from the empty object that build the first database (step 1).
    keep: K, the best distinct objects the transformer trains on each round (step 2).
    database_size: how many distinct objects the database keeps (the best ones).
    samples: sequences sampled per round (step 3); each valid one is repaired (step 4).
    train_steps, batch_size, lr, weight_decay: training per round; the model carries over from
        round to round, the optimiser is new each round.
    model: `TransformerConfig` fields for the LM (vocab and length are set from the problem).
    temperature, top_k: sampling; top_k None samples from the whole distribution.
    workers: processes for local search (0 or 1: in this process).
    chunk_size: local searches per task; the seeds depend on it, not on `workers`.
    time_limit_s, stop_at, max_local_search_calls: stop after the first round that reaches any
        of them (wall seconds, a score, a count of local-search calls).
    """

    problem: Annotated[str, choice(_problems)] = "triangle-free"
    n: Positive = 20
    problem_options: dict[str, Any] = Field(default_factory=dict)
    mode: Annotated[Literal[MODES], choice(MODES)] = "patternboost"
    rounds: AtLeastZero = 20
    initial: Positive = 2000
    keep: Positive = 500
    database_size: Positive = 5000
    samples: Positive = 1000
    train_steps: Positive = 300
    batch_size: Positive = 64
    lr: PositiveNumber = 5e-4
    weight_decay: Annotated[float, satisfies(lambda v: is_number(v) and 0 <= v < math.inf,
                                             "a finite number >= 0")] = 0.01
    model: Annotated[dict[str, Any], BeforeValidator(_model_fields)] = Field(
        default_factory=_default_model)
    temperature: PositiveNumber = 1.0
    top_k: Annotated[int | None, positive_int(optional=True)] = None
    workers: AtLeastZero = 1
    chunk_size: Positive = 64
    # numpy's SeedSequence (the local-search chunks) takes no negative entropy, and
    # torch.manual_seed (the model's initialisation) nothing from 2**64 on
    seed: Annotated[int, satisfies(lambda v: is_int(v) and 0 <= v <= SEED_RANGE[1],
                                   "an integer >= 0 and < 2**64")] = 0
    time_limit_s: Annotated[float | None, satisfies(
        lambda v: is_number(v) and v > 0, "a positive number of seconds", optional=True)] = None
    stop_at: Annotated[float | None, satisfies(
        lambda v: is_number(v) and math.isfinite(v), "a finite score", optional=True)] = None
    max_local_search_calls: Annotated[int | None, positive_int(optional=True)] = None
    progress: bool = True

    @model_validator(mode="after")
    def _database_holds_keep(self) -> PatternBoostConfig:
        if self.database_size < self.keep:
            raise Invalid(f"at least keep={self.keep}", "database_size", self.database_size)
        return self

    @model_validator(mode="after")
    def _options_fit_the_problem(self) -> PatternBoostConfig:
        # checked here, before a run folder is written, not as a TypeError inside the run
        from .problems import PROBLEMS, SIZE_ARGUMENT, problem_arguments

        accepted = problem_arguments(PROBLEMS[self.problem])
        if accepted is not None:
            accepted.discard(SIZE_ARGUMENT.get(self.problem, "n"))  # set by `n`
            for key in self.problem_options:
                if key not in accepted:
                    error = not_a_key(key, accepted, f"options of problem {self.problem!r}")
                    raise Invalid(error.expected, "problem_options", self.problem_options)
        return self

    def check_runnable(self) -> None:
        """The problem's own checks of `n` and `problem_options` (vertices, matrix side, bits
        per token, pattern) and the model's (heads dividing the width, ...), as a ValueError
        naming the field and value. `run_patternboost` calls it before it writes the run folder
        (these used to fail inside the run, the model only after round 0). Not a validator: a
        config may be built field by field (`problem` first, then an `n` that fits it)."""
        from .problems import problem_from_size

        try:
            problem = problem_from_size(self.problem, self.n, **self.problem_options)
        except ValueError as err:
            try:  # blame the size if the problem refuses it with its default options too
                problem_from_size(self.problem, self.n)
            except ValueError:
                field, value = "n", self.n
            else:
                field, value = "problem_options", self.problem_options
            raise ValueError(f"PatternBoostConfig.{field}={value!r} is invalid: expected a value "
                             f"that problem {self.problem!r} accepts: {err}") from None
        if self.builds_model:
            from .model import transformer_config

            try:
                transformer_config(problem.vocab_size, problem.max_length, self.model)
            except ValueError as err:
                raise ValueError(f"PatternBoostConfig.model={self.model!r} is invalid: expected "
                                 f"TransformerConfig fields that fit together: {err}") from None

    @property
    def builds_model(self) -> bool:
        """Whether the run builds the transformer: every mode but "local-only", whose rounds
        are local searches only."""
        return self.mode != "local-only"

    def differs_from(self, other: PatternBoostConfig) -> list[str]:
        """Names of the fields, other than RESUMABLE_CHANGES, whose values differ, as
        :meth:`resume_differences` compares them."""
        names = [key.split(".")[0] for key in self.resume_differences(other)]
        return list(dict.fromkeys(names))

    def resume_differences(self, saved: PatternBoostConfig) -> dict[str, tuple[Any, Any]]:
        """``{name: (value in saved, value here)}`` of the fields, other than
        RESUMABLE_CHANGES, that make this config another run than `saved`.

        `problem_options` are compared as the problem they build (its `params()`), so an option
        spelled out at its default (`bits_per_token=4`, `pattern="312"` or `(3, 1, 2)`) is the
        same run as the option left out. `model` is compared as the model it builds (every
        TransformerConfig field, defaults filled in: :func:`.model.model_settings`), so
        `dropout: 0.0` or `d_ff: 256` with `d_model: 64` written out is the same run as the
        option left out; a model option that differs is named ``model.<option>``. Two
        local-only runs build no model, so neither `model` nor the fields that train and
        sample it (`train_steps`, `lr`, `top_k`, ...) are compared."""
        mine, theirs = self.to_dict(), saved.to_dict()
        if self.problem == saved.problem:
            mine["problem_options"] = self._problem_params()
            theirs["problem_options"] = saved._problem_params()
        builds = self.builds_model or saved.builds_model
        unread = ("model",) if builds else _MODEL_RUN_FIELDS
        changed = {k: (getattr(saved, k), getattr(self, k)) for k in mine
                   if k not in RESUMABLE_CHANGES and k not in unread and mine[k] != theirs[k]}
        if not builds:
            return changed
        model, saved_model = self._model_settings(), saved._model_settings()
        if model is None or saved_model is None:  # a model that is not built: as given
            model, saved_model = self.model, saved.model
        missing = "(not set)"
        for key in [*saved_model, *(k for k in model if k not in saved_model)]:
            before, after = saved_model.get(key, missing), model.get(key, missing)
            if before != after:
                changed[f"model.{key}"] = (before, after)
        return changed

    def _problem_params(self) -> dict[str, Any]:
        """The built problem's `params()` less its size (the field `n`), or the options as
        given where the problem is not built."""
        from .problems import SIZE_ARGUMENT, problem_from_size

        try:
            params = problem_from_size(self.problem, self.n, **self.problem_options).params()
        except (TypeError, ValueError):
            return dict(self.problem_options)
        params.pop(SIZE_ARGUMENT.get(self.problem, "n"), None)
        return params

    def _model_settings(self) -> dict[str, Any] | None:
        """The model's settings (:func:`.model.model_settings`); None where the problem or the
        model is not built."""
        from .model import model_settings
        from .problems import problem_from_size

        try:
            problem = problem_from_size(self.problem, self.n, **self.problem_options)
            return model_settings(problem.vocab_size, problem.max_length, self.model)
        except (TypeError, ValueError):
            return None
