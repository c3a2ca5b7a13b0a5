"""A small TOML writer for ZeroClaw's config: nested tables of strings, numbers, booleans
and lists of those (all ZeroClaw's config needs). Strings are written as TOML basic
strings; JSON string escapes are a subset of TOML's, so `json.dumps` quotes them."""

from __future__ import annotations

import json
import math
import re
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML cannot hold {value!r} here")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def dumps(data: dict[str, Any]) -> str:
    """`data` as a TOML document; None values are left out."""
    lines: list[str] = []

    def table(path: list[str], body: dict[str, Any]) -> None:
        scalars = [(k, v) for k, v in body.items() if v is not None and not isinstance(v, dict)]
        tables = [(k, v) for k, v in body.items() if isinstance(v, dict)]
        if path and (scalars or not tables):
            lines.append("")
            lines.append("[" + ".".join(_key(p) for p in path) + "]")
        for k, v in scalars:
            lines.append(f"{_key(k)} = {_value(v)}")
        for k, v in tables:
            table([*path, k], v)

    table([], data)
    return "\n".join(lines).lstrip("\n") + "\n"
