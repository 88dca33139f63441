"""Config files: YAML and TOML read into a mapping, ``--set`` overrides applied to it, and
the YAML a run folder keeps.

YAML is read with YAML 1.1 safe loading, except that ``1e-3`` is a float, a number YAML 1.1
and 1.2 read differently (``010``, ``1:30``) and a key given twice in a mapping are errors
(:mod:`graded._io`); override values are parsed with the same scalar rules (``true`` is a
bool, ``null`` None). A file or override that does not parse is a
:class:`~graded.config.sections.ConfigError` saying what and where.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import tomllib
import yaml
from pydantic import BaseModel

from graded._io import YAML_AMBIGUOUS_NUMBER, YAML_FLOAT, YAML_NUMBER_START, dump_yaml
from graded.config.sections import ConfigError, RunConfig

__all__ = ["SHORTHANDS", "apply_overrides", "dump_config", "parse_yaml", "read_config_file"]


class _Loader(yaml.SafeLoader):
    """YAML 1.1 safe loading, except that ``1e-3`` and ``-.5`` are floats (YAML 1.1 needs
    ``1.0e-3`` and ``-0.5``) and that ``010`` and ``1:30``, which YAML 1.1 and 1.2 read
    differently, are refused (:mod:`graded._io`)."""


_AMBIGUOUS_TAG = "tag:graded:ambiguous-number"
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", YAML_FLOAT, YAML_NUMBER_START)
for _first in YAML_NUMBER_START:  # before YAML 1.1's own int resolver, which reads 010 as 8
    _Loader.yaml_implicit_resolvers[_first].insert(0, (_AMBIGUOUS_TAG, YAML_AMBIGUOUS_NUMBER))


def _ambiguous_number(loader: _Loader, node: yaml.ScalarNode) -> Any:
    """Refuse a number YAML 1.1 and YAML 1.2 read differently, naming both readings."""
    text = node.value
    digits = text.replace("_", "")
    if ":" in text:
        as_11 = yaml.SafeLoader.construct_yaml_float(loader, node) if "." in text \
            else yaml.SafeLoader.construct_yaml_int(loader, node)
        readings = f"YAML 1.1 reads it as {as_11!r} (base 60), YAML 1.2 as text"
        fix = repr(as_11)
    else:
        as_12 = int(digits, 10)
        octal = all(c in "01234567" for c in digits.lstrip("+-"))
        as_11 = f"{int(digits, 8)!r} (octal)" if octal else "text"
        readings = f"YAML 1.1 reads it as {as_11}, YAML 1.2 as {as_12!r}"
        fix = " or ".join(dict.fromkeys(map(repr, (as_12, *([int(digits, 8)] if octal else [])))))
    raise yaml.constructor.ConstructorError(
        None, None, f"{text} is ambiguous: {readings}; write {fix}, or quote it ('{text}') "
        "for text", node.start_mark)


_Loader.add_constructor(_AMBIGUOUS_TAG, _ambiguous_number)


def _mapping_without_duplicates(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    """A mapping whose keys are all different: YAML loaders keep the last of two equal keys, so
    a second ``train:`` section would silently replace the first, keys and all."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor`: keys given beside it override the merged ones, by design
        key = loader.construct_object(key_node, deep=True)
        if (isinstance(key, bool) or key is None) and isinstance(key_node, yaml.ScalarNode) \
                and key_node.style is None:
            # `on:`, `yes:`, `off:`, `null:`: YAML 1.1 reads these names as True, False, None,
            # which no config key is; the message would otherwise name True, not what was typed
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {key_node.value!r} is read by YAML as {key!r}, not as the "
                f"name {key_node.value!r}; quote it ('{key_node.value}') to use it as a name",
                key_node.start_mark)
        if not isinstance(key, str | int | float | bool):
            continue  # an unhashable key fails in construct_mapping, as in plain YAML
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {key!r} is given twice (the second would silently "
                "replace the first)", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                        _mapping_without_duplicates)


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` with ``1e-3``-style floats, refusing a key given twice in a mapping."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no objects


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a ``.yaml``/``.yml`` or ``.toml`` file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line, byte = exc.object[:exc.start].count(b"\n") + 1, exc.object[exc.start]
        raise ConfigError(f"config file {path} is not UTF-8 text: byte 0x{byte:02x} at line "
                          f"{line} (position {exc.start}); save it as UTF-8") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            data = parse_yaml(text)
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"config file {path}: expected a .yaml, .yml or .toml file")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} does not parse: {_parse_error(exc)}") from None
    if data is None:  # YAML with nothing but comments and blank lines
        raise ConfigError(f"config file {path} is empty; expected a run config (task:, "
                          "model:, train:, ...)")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top, got {data!r}")
    return data


def _parse_error(exc: Exception) -> str:
    """A YAML or TOML parse error in one line: the problem and where."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    return f"{context + ': ' if context else ''}{problem} ({where})"


# Sections a config may give as a bare string, and the key that string stands for.
SHORTHANDS = {"recipe": "name"}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides (YAML scalar rules) to a copy of ``data``; a section in
    its shorthand (``recipe: auto``) is expanded (``{name: auto}``) to set a key inside it,
    and a section that is off (``early_stopping: null``, as every ``config.yaml`` without it
    reads, or ``false``, as TOML writes it) is started empty to set a key inside it. An item
    of a list is named by its index (``model.morphic.layers.1.router.rank=4``).

    A key is given one value: a key given twice with two values, or a section given after a
    key inside it (which it would replace), is refused naming both overrides, as a key given
    twice in a file is, rather than the last one silently winning."""
    data = copy.deepcopy(data)
    given: dict[tuple[str, ...], tuple[str, Any]] = {}  # key -> the override and its value
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. train.lr=3e-4")
        try:
            value = parse_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: value does not parse: {_parse_error(exc)}"
                              ) from None
        node: Any = data
        parts = key.strip().split(".")
        if "" in parts:
            raise ConfigError(f"--set {item!r}: the key {key.strip()!r} has an empty part; "
                              "expected names joined by single dots, e.g. train.lr=3e-4")
        _refuse_second_value(given, tuple(parts), item, value)
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                nxt = node[_list_index(item, parts[:i], part, node)]
                _refuse_index_of_no_list(item, parts, i, nxt, True, value)
            else:
                _refuse_index_of_no_list(item, parts, i, node.get(part), part in node, value)
                nxt = node.setdefault(part, {})
                if nxt is None or nxt is False:  # a section that is off (null, or false)
                    nxt = node[part] = {}
                if node is data and part in SHORTHANDS and isinstance(nxt, str):
                    nxt = node[part] = {SHORTHANDS[part]: nxt}
            if not isinstance(nxt, dict | list):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"--set {item!r}: {where} is {nxt!r}, not a section")
            node = nxt
        if isinstance(node, list):
            node[_list_index(item, parts[:-1], parts[-1], node)] = value
        else:
            node[parts[-1]] = value
    return data


def _refuse_second_value(given: dict[tuple[str, ...], tuple[str, Any]],
                         parts: tuple[str, ...], item: str, value: Any) -> None:
    """Record the override ``item`` of the key ``parts``; ConfigError when an earlier one
    gave that key another value, or set a key inside it (this one would replace it)."""
    key = ".".join(parts)
    for earlier, (other, other_value) in given.items():
        if earlier == parts and repr(other_value) != repr(value):
            raise ConfigError(f"--set {other!r} and --set {item!r} give {key} two values; "
                              "give it once")
        if earlier[:len(parts)] == parts and earlier != parts:
            raise ConfigError(f"--set {item!r} replaces the section {key}, which "
                              f"--set {other!r} set a key of before; give the section first, "
                              "then the keys inside it")
    given[parts] = (item, value)


def _refuse_index_of_no_list(item: str, parts: list[str], i: int, held: Any, present: bool,
                             value: Any) -> None:
    """ConfigError when the part after ``parts[i]`` is an index (digits) but the key
    ``parts[: i + 1]`` holds no list to index (``held``: its value, if ``present``):
    ``train.betas.0=0.8`` with ``betas`` absent made ``{'0': 0.8}``, which the config then
    refused as a bad ``betas`` or, in a free-form section (``task.options``), kept. A mapping
    that holds that very key (``{'0': ...}``, as a file may give it) is indexed by name."""
    index = parts[i + 1]
    if not index.isdigit() or isinstance(held, list) \
            or (isinstance(held, dict) and index in held):
        return
    where = ".".join(parts[: i + 1])
    for name in reversed(parts[i + 2:]):  # the item the key inside it names
        value = {name: value}
    whole = f"--set {where}={_example_list(parts[: i + 1], int(index), value)}"
    if isinstance(held, dict):
        keys = f" (keys: {', '.join(map(str, held))})" if held else " without keys"
        raise ConfigError(f"--set {item!r}: {where} is a section{keys}, not a list, so it has "
                          f"no item {index}; expected a key of it, or a list given whole: "
                          f"{whole}")
    got = (f"is {held!r}, not a list, so it has no item {index}" if present
           else f"is not in the config: there is no list to set item {index} of")
    raise ConfigError(f"--set {item!r}: {where} {got}; give the whole list, e.g. {whole}")


def _example_list(parts: list[str], index: int, value: Any) -> str:
    """The list ``--set KEY=[...]`` could give, in the override's own syntax: the key's default
    with item ``index`` set to ``value`` when the run config's schema gives one that long
    (``train.betas`` → ``[0.8, 0.98]``), else ``value`` in place among ``...``."""
    model: Any = RunConfig
    default: Any = None
    for part in parts:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            default = None
            break
        default = field.get_default(call_default_factory=True)
        model = type(default) if isinstance(default, BaseModel) else field.annotation
    shown = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    shown = shown.removesuffix("...").strip()  # a plain scalar's document end marker
    if isinstance(default, list | tuple) and index < len(default):
        items = [shown if k == index else str(v) for k, v in enumerate(default)]
    else:
        items = ["..."] * index + [shown, "..."]
    return f"[{', '.join(items)}]"


def _list_index(item: str, where: list[str], part: str, items: list[Any]) -> int:
    """The index ``part`` names in the list ``items`` (at the dotted key ``where``)."""
    if not part.isdigit() or int(part) >= len(items):
        expected = f"an index 0 to {len(items) - 1}" if items else "no index: it is empty"
        raise ConfigError(f"--set {item!r}: {'.'.join(where)} is a list of {len(items)} "
                          f"item(s); expected {expected}, got {part!r}")
    return int(part)


def dump_config(cfg: RunConfig) -> str:
    """The config as YAML that :func:`parse_yaml` reads back as it was (a run name such as
    ``1e3`` is quoted: plain, it would read back as the float 1000.0)."""
    return dump_yaml(cfg.model_dump(mode="json"))
