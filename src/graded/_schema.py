"""The one config system: pydantic v2 models on a strict base, with errors that name the value.

Every configuration of the library (:class:`graded.TransformerConfig`,
:class:`graded.morphic.MorphicConfig`, :class:`graded.search.patternboost.PatternBoostConfig`,
the run-config sections of :mod:`graded.config` and :class:`graded.train.options.TrainOptions`)
is a :class:`Strict` model: unknown keys are errors, assignments are validated, a ``bool``
field takes True or False only, a number field no bool, and a ``float`` field no NaN or ±inf.
This module imports pydantic only, so every layer of the library can use it.

:class:`ConfigModel` adds the serialisation API of the model configs (``to_dict``,
``from_dict``, ``to_json``, ``from_json``, ``replace``, ``validate``) and turns pydantic's
errors into one :class:`ValueError` whose lines read ``Owner.field=value is invalid: expected
...``. Validators say what a value should be by raising :class:`Invalid`; the choices they check
come from the module that owns them (:func:`choice`).
"""

from __future__ import annotations

import difflib
import json
import types as _types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from typing_extensions import Self

__all__ = [
    "ConfigModel",
    "ConfigValueError",
    "Invalid",
    "Strict",
    "allowed_keys",
    "check_keys",
    "choice",
    "closest_key",
    "is_int",
    "is_number",
    "not_a_key",
    "positive_int",
    "satisfies",
    "scalar_of_its_type",
    "unknown_key_message",
]


class Strict(BaseModel):
    """Base for every config: unknown keys are errors, assignments are validated, and the
    plain scalar fields take their own type only (:func:`scalar_of_its_type`): a ``bool``
    field True or False (not 1, nor "yes"), an ``int`` or ``float`` field no bool, and a
    ``float`` field no NaN or ±inf (pydantic's lax mode takes all of these)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _scalar_of_its_type(cls, value: Any, info: ValidationInfo) -> Any:
        return scalar_of_its_type(cls, value, info)


def scalar_of_its_type(model: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """``value`` for the field ``info.field_name`` of ``model``, refused (:class:`Invalid`)
    where lax validation would convert it: anything but True or False (or None, where the
    field may be None) for a field of type ``bool``, where ``1``, ``"yes"`` and ``"off"`` were
    read as booleans; a boolean for a number field (of type ``int`` or ``float``, optionally
    None), where ``true`` was read as 1. It runs after the subclasses' own checks (which may
    read ``false`` as null first: :func:`graded.train.options.takes_false_for_null`)."""
    field = model.model_fields.get(info.field_name or "")
    if field is None:
        return value
    annotation = field.annotation
    union = get_origin(annotation) in (Union, _types.UnionType)
    types = set(get_args(annotation)) if union else {annotation}
    optional = type(None) in types
    types.discard(type(None))
    if types == {bool}:
        if isinstance(value, bool) or (optional and value is None):
            return value
        raise _refused(("None or " if optional else "") + "True or False", value)
    if isinstance(value, bool) and types and types <= {int, float}:
        raise _refused(f"a number, not a boolean{' (or None)' if optional else ''}", value)
    return value


def _refused(expected: str, value: Any) -> Invalid:
    """:class:`Invalid` whose text also names the value (``got 1; expected True or False``),
    for the error formatters that print a validator's text as it is."""
    error = Invalid(expected)
    error.args = (f"got {value!r}; expected {expected}",)
    return error


class Invalid(ValueError):
    """Raised by a validator: ``expected`` says what is allowed. A check across fields names the
    ``field`` (and its ``value``, ``...`` to leave it out) it blames; a field validator leaves
    both to the caller."""

    _unset: Any = object()

    def __init__(self, expected: str, field: str | None = None, value: Any = _unset) -> None:
        super().__init__(expected)
        self.expected, self.field, self.value = expected, field, value

    def name(self, field: str) -> str:
        """The dotted name of the field blamed, under ``field`` (where the validator ran)."""
        return ".".join(p for p in (field, self.field) if p)

    def message(self, owner: str, field: str, value: Any) -> str:
        name = self.name(field)
        shown = value if self.value is Invalid._unset else self.value
        where = f"{owner}.{name}" + ("" if shown is ... else f"={shown!r}")
        return f"{where} is invalid: expected {self.expected}"


def closest_key(key: str, allowed: Iterable[str]) -> str | None:
    """The allowed key ``key`` most likely stands for: the one that differs in case only, else
    the closest in spelling, case aside (``LR`` and ``Batch_Sise`` find ``lr`` and
    ``batch_size``); None when none is close."""
    by_lower: dict[str, str] = {}
    for name in sorted(allowed):
        by_lower.setdefault(str(name).lower(), str(name))
    close = difflib.get_close_matches(str(key).lower(), by_lower, n=1)
    return by_lower[close[0]] if close else None


def _did_you_mean(key: str, allowed: Iterable[str]) -> str:
    close = closest_key(key, allowed)
    return f" (did you mean {close!r}?)" if close is not None else ""


def not_a_key(key: str, allowed: Iterable[str], what: str) -> Invalid:
    """The error for an unknown ``key`` among ``what`` (e.g. "options of an 'ffn' block")."""
    allowed = sorted(allowed)
    hint = _did_you_mean(key, allowed)
    return Invalid(f"{what}, not {key!r}{hint}; allowed keys: {', '.join(allowed)}")


def unknown_key_message(where: str, key: str, allowed: Iterable[str], *,
                        name_key: bool = False) -> str:
    """``where: unknown key (did you mean 'x'?); allowed keys: ...``; ``name_key`` puts the
    key itself after "unknown key"."""
    allowed = sorted(allowed)
    hint = _did_you_mean(key, allowed)
    named = f" {key!r}" if name_key else ""
    return f"{where}: unknown key{named}{hint}; allowed keys: {', '.join(allowed)}"


def allowed_keys(model: type[BaseModel], loc: Iterable[Any]) -> list[str]:
    """The keys allowed at ``loc`` (a pydantic error location, list indices included) inside
    ``model``: the fields of the model found there, or [] if none is."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or str(part).isdigit():
            continue
        field = current.model_fields.get(part) if hasattr(current, "model_fields") else None
        if field is None:
            return []
        ann = field.annotation
        nested = [ann, *getattr(ann, "__args__", ())]
        nested += [a for c in nested for a in getattr(c, "__args__", ())]  # list[Model] | None
        current = next((c for c in nested if isinstance(c, type) and issubclass(c, BaseModel)),
                       None)
        if current is None:
            return []
    return sorted(current.model_fields)


def check_keys(owner: str, data: Mapping[str, Any], known: Iterable[str]) -> None:
    """Raise ValueError naming the keys of ``data`` outside ``known``, and the known ones."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{owner}.from_dict expects a dict, got {type(data).__name__}")
    known = sorted(known)
    unknown = sorted(set(data) - set(known))
    if unknown:
        close = [m for k in unknown if (m := closest_key(k, known)) is not None]
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"unknown {owner} key(s) {unknown}{hint}; known keys are {known}")


def is_int(v: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def satisfies(ok: Callable[[Any], bool], expected: str, *, optional: bool = False
              ) -> BeforeValidator:
    """A field check, run on the raw value: ``ok(value)`` or, if ``optional``, None; otherwise
    :class:`Invalid` with ``expected`` (prefixed by "None or ")."""

    def check(v: Any) -> Any:
        if (optional and v is None) or ok(v):
            return v
        raise Invalid(("None or " if optional else "") + expected)

    return BeforeValidator(check)


def positive_int(optional: bool = False) -> BeforeValidator:
    """A field check: a positive integer (not a bool, not a float), or None if ``optional``."""
    return satisfies(lambda v: is_int(v) and v > 0, "a positive integer", optional=optional)


def choice(options: Iterable[Any] | Callable[[], Iterable[Any]], *, optional: bool = False,
           what: str | None = None) -> BeforeValidator:
    """A field check: one of ``options``, a tuple or a function returning the current ones
    (for registries that grow, e.g. attention backends). ``what`` replaces the default
    description ``one of (...)``. A bool is one of them only if listed (True == 1 would
    otherwise take it for 1)."""

    def check(v: Any) -> Any:
        allowed = tuple(options() if callable(options) else options)
        listed = v in allowed and (not isinstance(v, bool) or any(a is v for a in allowed))
        if (optional and v is None) or listed:
            return v
        raise Invalid(what or f"one of {allowed}" + (" or None" if optional else ""))

    return BeforeValidator(check)


class ConfigValueError(ValueError):
    """A config refused: its message has one line per problem (:func:`error_lines`);
    ``fields`` are the dotted names of the fields blamed, in the order of the lines."""

    def __init__(self, message: str, fields: tuple[str, ...]) -> None:
        super().__init__(message)
        self.fields = fields


def refused_fields(model: type[BaseModel], err: ValidationError) -> list[tuple[str, str]]:
    """(field, line) per error of ``err``, raised while validating ``model``: the dotted name
    of the field blamed and its ``Owner.field=value is invalid: expected ...`` line."""
    owner, out = model.__name__, []
    for e in err.errors():
        loc = [str(p) for p in e["loc"] if not str(p).startswith(("function-", "json-"))]
        field = ".".join(loc)
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, Invalid):
            out.append((cause.name(field), cause.message(owner, field, e["input"])))
        elif e["type"] == "extra_forbidden":
            where = ".".join([owner, *loc[:-1]])
            out.append((field, unknown_key_message(where, loc[-1],
                                                   allowed_keys(model, e["loc"][:-1]),
                                                   name_key=True)))
        elif e["type"] == "missing":
            out.append((field, f"{owner}.{field}: required key is missing"))
        else:
            expected = e["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
            out.append((field, f"{owner}.{field}={e['input']!r} is invalid: expected {expected}"))
    return out


def error_lines(model: type[BaseModel], err: ValidationError) -> list[str]:
    """One ``Owner.field=value is invalid: expected ...`` line per error of ``err``, raised
    while validating ``model`` (:func:`refused_fields`)."""
    return [line for _, line in refused_fields(model, err)]


def _config_error(model: type[BaseModel], err: ValidationError) -> ConfigValueError:
    refused = refused_fields(model, err)
    return ConfigValueError("\n".join(line for _, line in refused),
                            tuple(field for field, _ in refused))


class ConfigModel(Strict):
    """A serialisable model config: keyword constructor, dict/JSON round trips, ``replace``.

    Construction and assignment raise a :class:`ConfigValueError` (a ValueError) naming the
    field, the bad value and what is allowed (one line per problem), its ``fields`` the fields
    blamed."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _config_error(type(self), exc) from None

    def __setattr__(self, name: str, value: Any) -> None:
        old = self.__dict__.get(name)
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            if name in type(self).model_fields:  # a failed check across fields keeps the old
                self.__dict__[name] = old
            raise _config_error(type(self), exc) from None

    def validate(self) -> None:  # type: ignore[override]
        """Check the config again (it is checked when built and on every assignment)."""
        type(self).from_dict(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="python")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build from a dict; unknown keys raise, naming them and the known ones."""
        check_keys(cls.__name__, data, cls.model_fields)
        return cls(**data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.model_dump(mode="json"), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed (validated). A field this config left out (not in
        ``model_fields_set``, still at its default) stays left out of the copy, so that a check
        that tells a field left out from one given (``grading`` of
        :class:`graded.TransformerConfig`) reads the copy as it read this config."""
        fields = type(self).model_fields
        kept = {name: value for name, value in self.to_dict().items()
                if name in self.model_fields_set
                or getattr(self, name) != fields[name].get_default(call_default_factory=True)}
        return type(self).from_dict({**kept, **changes})
