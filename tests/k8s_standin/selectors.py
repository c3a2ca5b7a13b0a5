"""Label and field selectors, parsed the way the API server does (`k8s.io/apimachinery/pkg/labels`).

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a` (exists), `!a`.
Field selectors on Pods: `metadata.name`, `metadata.namespace`, `status.phase`,
`spec.nodeName`, `spec.restartPolicy` with `=`, `==`, `!=`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Predicate = Callable[[dict[str, str]], bool]


class SelectorError(ValueError):
    """A selector the API server would reject with 400."""


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside `( )`."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


_SET = re.compile(r"^([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)$")
_EQ = re.compile(r"^([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)$")
_EXISTS = re.compile(r"^(!?)([A-Za-z0-9_./-]+)$")


def parse_label_selector(text: str | None) -> Predicate:
    """A predicate over a labels dict; raises SelectorError on syntax the server rejects."""
    if not text:
        return lambda labels: True
    checks: list[Predicate] = []
    for term in _split_top_level(text):
        if m := _SET.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                checks.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                checks.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif m := _EQ.match(term):
            key, op, value = m.groups()
            if op == "!=":
                checks.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                checks.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif m := _EXISTS.match(term):
            neg, key = m.groups()
            if neg:
                checks.append(lambda lb, k=key: k not in lb)
            else:
                checks.append(lambda lb, k=key: k in lb)
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")
    return lambda labels: all(check(labels) for check in checks)


_POD_FIELDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "metadata.name": lambda o: o["metadata"].get("name", ""),
    "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
    "status.phase": lambda o: o.get("status", {}).get("phase", ""),
    "spec.nodeName": lambda o: o.get("spec", {}).get("nodeName", "") or "",
    "spec.restartPolicy": lambda o: o.get("spec", {}).get("restartPolicy", ""),
}
_GENERIC_FIELDS = {k: v for k, v in _POD_FIELDS.items() if k.startswith("metadata.")}


def parse_field_selector(text: str | None, kind: str = "Pod") -> Callable[[dict[str, Any]], bool]:
    """A predicate over a whole object; unknown fields are rejected like the real server does."""
    if not text:
        return lambda obj: True
    fields = _POD_FIELDS if kind == "Pod" else _GENERIC_FIELDS
    checks: list[Callable[[dict[str, Any]], bool]] = []
    for term in _split_top_level(text):
        m = _EQ.match(term)
        if not m:
            raise SelectorError(f"invalid field selector: {term!r}")
        key, op, value = m.groups()
        if key not in fields:
            raise SelectorError(f'field label not supported: {key}')
        get = fields[key]
        if op == "!=":
            checks.append(lambda o, g=get, v=value: g(o) != v)
        else:
            checks.append(lambda o, g=get, v=value: g(o) == v)
    return lambda obj: all(check(obj) for check in checks)
