"""Pod and ConfigMap admission for the stand-in: validation (422) and API-server defaults.

Only what a real API server would reject for the fields openforge sends is validated; the
defaults are the ones typed clients need to deserialize the object back (schema-complete).
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+)?$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
MAX_TERMINATION_MESSAGE = 4096


class Invalid(Exception):
    """The object fails validation: the server answers 422 with these causes."""

    def __init__(self, kind: str, name: str, causes: list[str]) -> None:
        super().__init__(f'{kind} "{name}" is invalid: ' + ", ".join(causes))
        self.causes = causes


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def quantity(text: str | int | float) -> float:
    """A resource quantity as a number ('500m' -> 0.5, '1Gi' -> 2**30)."""
    text = str(text)
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(text)
    suffix = m.group(3) or ""
    if suffix[:1] in ("e", "E"):
        return float(text)
    return float(text[: len(text) - len(suffix)]) * _SUFFIX[suffix]


def _check_meta(meta: Obj, causes: list[str]) -> None:
    name = meta.get("name", "")
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        causes.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain "
                      "must consist of lower case alphanumeric characters, '-' or '.'")
    for key, value in (meta.get("labels") or {}).items():
        short = key.rsplit("/", 1)[-1]
        if not _LABEL_NAME.match(short) or len(short) > 63:
            causes.append(f"metadata.labels: Invalid value: {key!r}: name part must be valid")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(f"metadata.labels: Invalid value: {value!r}: a valid label must be an "
                          "empty string or consist of alphanumeric characters, '-', '_' or '.', "
                          "and must be no more than 63 characters")


def admit_pod(pod: Obj, namespace: str) -> Obj:
    """Validate a Pod and fill the defaults the API server adds; raises Invalid."""
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    meta = pod.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
    meta["namespace"] = namespace
    causes: list[str] = []
    _check_meta(meta, causes)
    spec = pod.setdefault("spec", {})
    containers = spec.get("containers") or []
    if not containers:
        causes.append("spec.containers: Required value")
    if spec.setdefault("restartPolicy", "Always") not in ("Always", "OnFailure", "Never"):
        causes.append(f"spec.restartPolicy: Unsupported value: {spec['restartPolicy']!r}")
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline < 1):
        causes.append("spec.activeDeadlineSeconds: Invalid value: must be between 1 and 2147483647")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for i, c in enumerate(containers):
        where = f"spec.containers[{i}]"
        if not c.get("name") or not _DNS_LABEL.match(c["name"]):
            causes.append(f"{where}.name: Invalid value: {c.get('name')!r}")
        if not c.get("image"):
            causes.append(f"{where}.image: Required value")
        for section in ("requests", "limits"):
            for res, value in ((c.get("resources") or {}).get(section) or {}).items():
                try:
                    quantity(value)
                except ValueError:
                    causes.append(f"{where}.resources.{section}[{res}]: Invalid value: {value!r}: "
                                  "quantities must match the regular expression "
                                  "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
        for env in c.get("env") or []:
            if not env.get("name"):
                causes.append(f"{where}.env.name: Required value")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        tag = c.get("image", "").rsplit("/", 1)[-1]
        c.setdefault("imagePullPolicy", "Always" if ":" not in tag or tag.endswith(":latest")
                     else "IfNotPresent")
        c.setdefault("resources", {})
    if causes:
        raise Invalid("Pod", meta.get("name", ""), causes)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now()
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return pod


def admit_configmap(cm: Obj, namespace: str) -> Obj:
    cm.setdefault("apiVersion", "v1")
    cm.setdefault("kind", "ConfigMap")
    meta = cm.setdefault("metadata", {})
    meta["namespace"] = namespace
    causes: list[str] = []
    _check_meta(meta, causes)
    if causes:
        raise Invalid("ConfigMap", meta.get("name", ""), causes)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now()
    return cm


def status_object(code: int, reason: str, message: str, name: str = "", kind: str = "",
                  causes: list[str] | None = None, retry_after: int | None = None) -> Obj:
    """A `kind: Status` failure body, as every API error is."""
    details: Obj = {}
    if name:
        details["name"] = name
    if kind:
        details["kind"] = kind
    if causes:
        details["causes"] = [{"message": c} for c in causes]
    if retry_after is not None:
        details["retryAfterSeconds"] = retry_after
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details, "code": code}
