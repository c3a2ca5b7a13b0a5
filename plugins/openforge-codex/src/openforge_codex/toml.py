"""A minimal TOML writer for Codex's config.toml (the standard library only reads TOML)."""

from __future__ import annotations

import math
from typing import Any


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML cannot hold {value}")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _string(text: str) -> str:
    """A TOML basic string. Not JSON: TOML forbids \\u escapes of surrogate halves, so
    characters beyond the BMP are written as they are (the file is UTF-8)."""
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else _string(key)


def dumps(data: dict[str, Any]) -> str:
    """`data` as TOML: scalars and lists first, then one `[table]` per nested dict."""
    lines: list[str] = []
    _table(data, [], lines)
    return "\n".join(lines).strip() + "\n"


def _table(data: dict[str, Any], path: list[str], lines: list[str]) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for key, value in data.items():
        if key not in tables and value is not None:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in tables.items():
        sub = [*path, key]
        scalars = any(not isinstance(v, dict) for v in value.values())
        if scalars or not value:
            lines.append("")
            lines.append("[" + ".".join(_key(k) for k in sub) + "]")
        _table(value, sub, lines)
