"""Admission for the stand-in (Pods, ConfigMaps, Secrets): validation (422) and defaults.

Only what a real API server would reject for the fields openforge sends is validated; the
defaults are the ones typed clients need to deserialize the object back (schema-complete).
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from datetime import UTC, datetime, timedelta
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


def now(offset_s: float = 0.0) -> str:
    """An RFC 3339 timestamp, `offset_s` from the wall clock (tests move the stand-in's clock)."""
    return (datetime.now(UTC) + timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    for v in spec.get("volumes") or []:
        if not v.get("name") or not _DNS_LABEL.match(v["name"]):
            causes.append(f"spec.volumes.name: Invalid value: {v.get('name')!r}")
        if not any(k in v for k in ("emptyDir", "secret", "configMap")):
            causes.append(f"spec.volumes[{v.get('name')}]: the stand-in supports emptyDir, "
                          "secret and configMap volumes")
    names: set[str] = set()
    for section in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(section) or []):
            _admit_container(c, f"spec.{section}[{i}]", section == "initContainers", volumes,
                             causes)
            if c.get("name") in names:
                causes.append(f"spec.{section}[{i}].name: Duplicate value: {c.get('name')!r}")
            names.add(c.get("name"))
    if causes:
        raise Invalid("Pod", meta.get("name", ""), causes)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now()
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return pod


def _admit_container(c: Obj, where: str, init: bool, volumes: set[Any],
                     causes: list[str]) -> None:
    if not c.get("name") or not _DNS_LABEL.match(c["name"]):
        causes.append(f"{where}.name: Invalid value: {c.get('name')!r}")
    if not c.get("image"):
        causes.append(f"{where}.image: Required value")
    policy = c.get("restartPolicy")
    if policy is not None and (not init or policy != "Always"):
        causes.append(f"{where}.restartPolicy: Unsupported value: {policy!r}: supported "
                      "values: \"Always\" (init containers only)")
    if init and c.get("startupProbe") and policy != "Always":
        causes.append(f"{where}.startupProbe: Forbidden: may not be set for init containers "
                      "without restartPolicy=Always")
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
    for mount in c.get("volumeMounts") or []:
        if mount.get("name") not in volumes:
            causes.append(f"{where}.volumeMounts.name: Not found: {mount.get('name')!r}")
        if not str(mount.get("mountPath", "")).startswith("/"):
            causes.append(f"{where}.volumeMounts.mountPath: Invalid value: "
                          f"{mount.get('mountPath')!r}: must be an absolute path")
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    tag = c.get("image", "").rsplit("/", 1)[-1]
    c.setdefault("imagePullPolicy", "Always" if ":" not in tag or tag.endswith(":latest")
                 else "IfNotPresent")
    c.setdefault("resources", {})


def _admit(obj: Obj, kind: str, namespace: str, checks: Any = None) -> Obj:
    """Defaults and metadata checks every object gets; `checks(obj, causes)` adds its own."""
    obj.setdefault("apiVersion", "v1")
    obj.setdefault("kind", kind)
    meta = obj.setdefault("metadata", {})
    meta["namespace"] = namespace
    causes: list[str] = []
    _check_meta(meta, causes)
    if checks is not None:
        checks(obj, causes)
    if causes:
        raise Invalid(kind, meta.get("name", ""), causes)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now()
    return obj


def admit_secret(secret: Obj, namespace: str) -> Obj:
    """A Secret: `data` values must be base64; `stringData` is merged into `data`."""
    secret.setdefault("type", "Opaque")
    return _admit(secret, "Secret", namespace, _check_secret_data)


def _check_secret_data(secret: Obj, causes: list[str]) -> None:
    data = secret.setdefault("data", {}) or {}
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError):
            causes.append(f"data[{key}]: Invalid value: illegal base64 data")
    for key, value in (secret.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    secret["data"] = data
    if sum(len(v) for v in data.values()) > 1024 * 1024:
        causes.append("data: Too long: must have at most 1048576 bytes")


def node_object(name: str, labels: dict[str, str], cpu: float, memory: float) -> Obj:
    """A Ready Node as a kubelet registers it."""
    stamp = now()
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "namespace": "", "labels": dict(labels),
                         "uid": str(uuid.uuid4()), "creationTimestamp": stamp},
            "spec": {},
            "status": {"capacity": {"cpu": str(cpu), "memory": str(int(memory)), "pods": "110"},
                       "allocatable": {"cpu": str(cpu), "memory": str(int(memory)),
                                       "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True",
                                       "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status",
                                       "lastHeartbeatTime": stamp,
                                       "lastTransitionTime": stamp}],
                       "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": name}],
                       "nodeInfo": {"kubeletVersion": "v1.37.0-openforge-standin",
                                    "operatingSystem": "linux", "architecture": "amd64",
                                    "containerRuntimeVersion": "standin://1", "kernelVersion": "",
                                    "osImage": "", "kubeProxyVersion": "", "bootID": "",
                                    "machineID": "", "systemUUID": ""}}}


def admit_configmap(cm: Obj, namespace: str) -> Obj:
    return _admit(cm, "ConfigMap", namespace)


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
