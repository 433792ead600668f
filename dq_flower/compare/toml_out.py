"""Writing presets back as TOML (``dq-flower tune`` saves the tuned preset this way)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["toml_value", "preset_toml"]

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    return key if _BARE.fullmatch(key) else json.dumps(key)


def toml_value(value: Any) -> str:
    """One TOML value (strings quoted, lists and mappings inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(str(k))} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if value is None:
        raise ValueError("TOML has no null value")
    if hasattr(value, "item"):  # numpy scalars
        return toml_value(value.item())
    raise ValueError(f"cannot write {type(value).__name__} as TOML")


def preset_toml(fields: Mapping[str, Any], tables: Mapping[str, Mapping[str, Mapping]],
                header: str = "") -> str:
    """A preset file: ``header`` comments, top-level ``fields``, then the tables.

    ``None`` fields are left out; ``tables`` maps ``section -> label -> table``, written as
    ``[section.label]`` (label ``""``: ``[section]``).
    """
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{_key(k)} = {toml_value(v)}" for k, v in fields.items() if v is not None]
    for section, entries in tables.items():
        for label, table in entries.items():
            if not table and label:
                continue
            name = _key(section) + (f".{_key(label)}" if label else "")
            lines += ["", f"[{name}]"]
            lines += [f"{_key(str(k))} = {toml_value(v)}" for k, v in table.items()
                      if v is not None]
    return "\n".join(lines) + "\n"
