"""Config sources: YAML files read safely, and ``--set KEY=VALUE`` overrides merged into a mapping.

The schema that validates the result lives in ``config.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from reference_trainers.config.errors import ConfigError


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping with the safe loader; ConfigError on any problem, an empty file and a
    duplicate key included."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); expected a YAML config") from None
    try:
        data = safe_load(text)
    except DuplicateKeyError as exc:
        raise ConfigError(f"{path}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or exc
        raise ConfigError(f"{path}: malformed YAML{where}: {' '.join(str(problem).split())}") from None
    if data is None:  # nothing but whitespace and comments: surely not the config the user meant to run
        raise ConfigError(f"{path}: the file is empty; expected a YAML mapping of settings (e.g. 'env: {{id: CartPole-v1}}') "
                          "or a preset (description, config, variants)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names one key twice (YAML forbids it; PyYAML alone would keep the last silently)."""


class _Yaml12Loader(yaml.SafeLoader):
    """Safe loader that reads YAML 1.2 floats (``1e-3`` is a number, not a string) and rejects
    duplicate keys."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            _reject_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)


def _reject_duplicate_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
    """``DuplicateKeyError`` naming the key and both lines if ``node`` writes one scalar key twice.

    Checked before merge keys (``<<: *base``) are flattened: a key written beside a merge
    overrides the merged one, as YAML intends, and is not a duplicate."""
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue  # collection keys are unhashable: the constructor reports them itself
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise DuplicateKeyError(None, None, f"duplicate key {key!r} at lines {first_line[key]} and {line}; "
                                                "accepted: each key once per mapping", key_node.start_mark)
        first_line[key] = line


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


MAX_YAML_DEPTH = 64
MAX_YAML_VALUES = 100_000


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with YAML 1.2 exponent floats; ``yaml.YAMLError`` for a duplicate key
    (``DuplicateKeyError``), a document nested deeper than ``MAX_YAML_DEPTH``, an alias that
    contains itself, or one that expands (aliases followed) to more than ``MAX_YAML_VALUES`` values."""
    try:
        data = yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
    _check_tree(data)
    return data


def _check_tree(data: Any) -> None:
    """Walk the loaded document as later code will (aliases expanded), within depth and size bounds."""
    seen = 0
    open_nodes: set[int] = set()

    def walk(node: Any, depth: int) -> None:
        nonlocal seen
        seen += 1
        if seen > MAX_YAML_VALUES:
            raise yaml.YAMLError(f"more than {MAX_YAML_VALUES:,} values once aliases are expanded")
        if not isinstance(node, (dict, list)):
            return
        if id(node) in open_nodes:
            raise yaml.YAMLError("an alias refers to a collection that contains it")
        if depth >= MAX_YAML_DEPTH:
            raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels")
        open_nodes.add(id(node))
        for child in node.values() if isinstance(node, dict) else node:
            walk(child, depth + 1)
        open_nodes.discard(id(node))

    walk(data, 0)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'optimizations.amp=true'`` -> (['optimizations', 'amp'], True); values are YAML scalars."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. optimizations.amp=true")
    try:
        value = safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    if isinstance(value, (dict, list)) and not raw.strip().startswith(("[", "{")):
        value = raw.strip()  # 'cuda:' or 'a: b' are text, not YAML mappings
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``KEY=VALUE`` set (nested dicts created as needed)."""
    merged = deep_merge({}, data)
    for text in overrides:
        path, value = parse_override(text)
        node = merged
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {text!r}: {part} is a value, not a section")
            node = child
        node[path[-1]] = value
    return merged


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; ``update`` wins; inputs are not modified."""
    out = {k: deep_merge({}, v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in update.items():
        if isinstance(value, dict):
            out[key] = deep_merge(out[key] if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out
