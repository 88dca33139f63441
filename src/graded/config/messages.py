"""What the config says to a person: every key with its default, choices and description (the
listing of ``graded train --help``), and the messages of a config that does not validate, one
line per problem naming the key, the value and what is allowed.
"""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError

from graded._schema import allowed_keys, unknown_key_message
from graded.config.sections import TASK_DERIVED, ModelSection, RunConfig

__all__ = ["describe_schema", "format_errors"]

# Keys whose default follows another key (a validator fills them in), shown as such.
_DERIVED_DEFAULTS = {("train", "monitor_mode"): "follows monitor"}


def _registered_choices(section: str, name: str) -> tuple[str, ...]:
    """Choices a string field takes from a registry rather than a ``Literal``."""
    if section != "model":
        return ()
    if name in ("attn_backend", "cross_attn_backend"):
        from graded.attention.backends import available_backends

        return tuple(available_backends())
    if name == "grade_init":
        from graded.transformer.graded import GRADE_INITS

        return GRADE_INITS
    return ()


def _choices(annotation: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` (or an optional ``Literal``, with ``null``) allows; () else."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    args = get_args(annotation)
    literal = next((a for a in args if get_origin(a) is Literal), None)
    if literal is None:
        return ()
    return (*get_args(literal), *(("null",) if type(None) in args else ()))


def _describe_field(name: str, field: Any, prefix: str, section: str) -> str:
    default = _DERIVED_DEFAULTS.get((section, name))
    if default is None:
        default = "required" if field.is_required() else repr(
            field.get_default(call_default_factory=True))
    choices = _choices(field.annotation) or _registered_choices(section, name)
    each = "each " if get_origin(field.annotation) is list else ""
    allowed = f"; {each}one of {', '.join(map(str, choices))}" if choices else ""
    desc = f" - {field.description}" if field.description else ""
    return f"  {prefix}{name} (default {default}{allowed}){desc}"


def describe_schema() -> str:
    """Every config key with its default, its allowed values and its description (for
    ``graded train --help``), the model section's :class:`TransformerConfig` fields included."""
    from graded.transformer.config import TransformerConfig

    out = ["config keys (YAML or TOML; unknown keys are errors):"]

    def walk(model: type[BaseModel], prefix: str, section: str) -> None:
        for name, field in model.model_fields.items():
            ann = field.annotation
            sub = next((c for c in (ann, *getattr(ann, "__args__", ()))
                        if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if sub is not None:
                optional = " (optional; null or false = off)" if field.default is None else ""
                out.append(f"  {prefix}{name}:{optional}")
                walk(sub, prefix + "  ", name if not prefix else section)
                if sub is ModelSection:
                    out.append(f"  {prefix}  (transformer architecture) any "
                               "graded.TransformerConfig field but "
                               + ", ".join(TASK_DERIVED) + " (set by the task):")
                    for key, tfield in TransformerConfig.model_fields.items():
                        if key not in TASK_DERIVED:
                            out.append(_describe_field(key, tfield, prefix + "    ", "model"))
                continue
            out.append(_describe_field(name, field, prefix, section))

    walk(RunConfig, "", "")
    return "\n".join(out)


def format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        loc = tuple(e["loc"])
        where = ".".join(str(p) for p in loc) or "<top level>"
        if e["type"] == "extra_forbidden":
            lines.append("  " + unknown_key_message(where, str(loc[-1]),
                                                    allowed_keys(RunConfig, loc[:-1])))
        elif e["type"] == "missing" and loc and isinstance(loc[-1], int):
            # a fixed-length list (e.g. betas) given too few values
            parent = ".".join(str(p) for p in loc[:-1])
            lines.append(f"  {parent}: got {e['input']!r}; expected more values (no value at "
                         f"position {loc[-1]})")
        elif e["type"] == "missing":
            lines.append(f"  {where}: required key is missing")
        elif e["type"] == "value_error":  # our validators' messages name key and value
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  {msg}" if msg.startswith(f"{where}.") else f"  {where}: {msg}")
        elif e["type"] == "string_type" and isinstance(e["input"], bool | int | float):
            lines.append(f"  {where}: {_not_text(where, e['input'])}")
        else:
            lines.append(f"  {where}: got {e['input']!r}; {e['msg']}")
    return "\n".join(lines)


def _not_text(where: str, value: bool | float) -> str:
    """The refusal of a number or boolean where text is expected: YAML or TOML read an
    unquoted ``2024`` (or YAML's ``yes``) so, and quoting it gives the text."""
    kind = "a boolean" if isinstance(value, bool) else "a number"
    text = str(value) if type(value) is int else "..."
    return (f"got {value!r} ({kind}: the value is not quoted); expected text: quote it, "
            f"e.g. --set \"{where}='{text}'\"")
