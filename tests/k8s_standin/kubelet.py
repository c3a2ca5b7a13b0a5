"""The stand-in scheduler + kubelet: runs each Pod's containers the way a kubelet orders them.

Scheduling: onto the first Ready node whose labels match the nodeSelector and whose
allocatable cpu / memory fit; otherwise Pending with `PodScheduled=False, Unschedulable`.
Volumes: emptyDir, secret and configMap; a Pod waits in ContainerCreating until the Secrets
it mounts exist (as a kubelet retries the mount). An emptyDir's `sizeLimit` is enforced as
the kubelet's eviction manager does (pkg/kubelet/eviction, `emptyDirLimitEviction`): every
`eviction_interval_s` while the Pod is active, a volume using more than its limit (blocks
in use, as `du` counts them) evicts the Pod: its containers killed at once, `Failed /
Evicted` with the kubelet's message `Usage of EmptyDir volume "NAME" exceeds the limit
"LIMIT". `, and no DisruptionTarget condition (the kubelet sets one only for node pressure).
Images: `command` / `args` override the image's ENTRYPOINT / CMD (`Image`); an image
containing `does-not-exist` fails to pull for good (ErrImagePull, then ImagePullBackOff);
`pull_faults` make the next pulls of an image fail with a transient registry error first;
an image with upper-case letters in its repository is an InvalidImageName.
Order: init containers one by one; a native sidecar (`restartPolicy: Always`) is started,
its exec startup probe run every `periodSeconds`, and the next container starts once it
passes (the sidecar keeps running and is restarted if it exits); a regular init container
must exit 0 or the Pod fails (`restartPolicy: Never`); then the main containers; when they
have ended, the sidecars get SIGTERM. Every container has its own log and its own
termination-message file (env values naming its `terminationMessagePath`, and paths under
a volume's mountPath, are mapped to where they live here); a volume whose mountPath is a
folder of the image (this machine's, see `runtime.image_paths`) is mounted there for real,
read-only when `readOnly`, where containers are isolated.
Ending: exit codes, `Completed` / `Error` / `OOMKilled`; `activeDeadlineSeconds` (counted
from the Pod's start, and re-read when a live Pod's is changed) -> SIGTERM, grace, SIGKILL,
`Failed / DeadlineExceeded`; graceful deletion -> the same, then the object
goes; force deletion -> killed at once.
What a real cluster also does, on request (`StandIn` knobs): partition a node (its kubelet
stops reporting and acting; processes keep running), lose it (Ready=Unknown), remove it
(the pod garbage collector deletes its Pods), evict a Pod (node pressure), OOM-kill a
container, preempt a Pod, set a Pod's phase to Unknown.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import secrets
import shutil
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from .apiserver import ApiServer, _error
from .objects import MAX_TERMINATION_MESSAGE, node_object, now, quantity
from .runtime import (
    MARKER_ENV,
    MARKER_PREFIX,
    Behaviour,
    Handle,
    Launch,
    ProcessRuntime,
    SimContainer,
    SimHandle,
)
from .store import Event

Obj = dict[str, Any]
NODE_NAME = "standin-node"
_TERMINAL = ("Succeeded", "Failed")
_DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


@dataclass
class Node:
    """A node of the stand-in cluster."""

    name: str = NODE_NAME
    labels: dict[str, str] = field(default_factory=dict)
    cpu: float = 64.0
    memory: float = 256 * 2**30
    runtime_classes: tuple[str, ...] = ("gvisor", "kata")

    def __post_init__(self) -> None:
        self.labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", **self.labels}


@dataclass
class Image:
    """What an image contributes when a container does not say: ENTRYPOINT, CMD, env."""

    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Box:
    """One container of one Pod run, with its status as the kubelet reports it."""

    spec: Obj
    init: bool
    directory: Path
    handle: Handle | None = None
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    last_state: Obj = field(default_factory=dict)
    restarts: int = 0
    started: bool = False  # startup probe passed (or none)
    container_id: str = ""
    oom: bool = False

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        return self.init and self.spec.get("restartPolicy") == "Always"

    @property
    def log_path(self) -> Path:
        return self.directory / "container.log"

    @property
    def message_path(self) -> Path:
        return self.directory / "termination-log"

    def status(self) -> Obj:
        image = self.spec["image"]
        running = "running" in self.state
        return {"name": self.name, "image": image,
                "imageID": f"{image}@sha256:{'0' * 64}" if self.container_id else "",
                "containerID": self.container_id, "restartCount": self.restarts,
                "started": running and self.started,
                "ready": running and self.started, "state": self.state,
                "lastState": self.last_state}


@dataclass
class PodRun:
    """What the kubelet holds for one Pod it runs."""

    uid: str
    namespace: str
    name: str
    directory: Path
    boxes: dict[str, Box] = field(default_factory=dict)
    node: str = ""
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    start_time: str = ""
    active_since: float = 0.0  # loop time the Pod was bound: its deadline counts from then
    scheduled: Obj | None = None  # the PodScheduled condition
    extra_conditions: list[Obj] = field(default_factory=list)
    volumes: dict[str, Path] = field(default_factory=dict)
    sim_volumes: dict[str, dict[str, bytes]] = field(default_factory=dict)
    lifecycle: asyncio.Task[None] | None = None
    ending: asyncio.Task[None] | None = None
    deadline: asyncio.TimerHandle | None = None
    removed: bool = False  # the object is gone from the API
    winding_down: bool = False  # the sidecars are being stopped: do not restart them
    publishing: bool = False  # a status update is due this turn of the loop
    counted_out: bool = False  # no longer counted in `live_pods`
    frozen: bool = False  # nothing more is reported (phase Unknown)
    pending_end: str = ""  # what a partitioned kubelet will do once it is back

    @property
    def marker(self) -> str:
        return MARKER_PREFIX + self.uid


class Kubelet:
    """Schedules and runs Pods from the API server's store, on one or more nodes."""

    def __init__(self, api: ApiServer, root: Path, nodes: list[Node] | None = None,
                 image_env: dict[str, str] | None = None, images: dict[str, Image] | None = None,
                 isolate: bool | None = None, simulate: Behaviour | None = None) -> None:
        self.api = api
        self.store = api.store
        self.root = root
        self.nodes = {n.name: n for n in (nodes or [Node()])}
        self.image_env = image_env or {}
        self.images = images or {}
        self.simulate = simulate
        self.runtime = None if simulate else ProcessRuntime(isolate, self.image_env)
        self.pull_faults: dict[str, list[str]] = {}
        self.pull_backoff_s = 0.3
        self.eviction_interval_s = 0.2  # a kubelet's housekeeping interval (10 s by default)
        self.pulled: set[tuple[str, str]] = set()  # (node, image) already on the node
        self.partitioned: set[str] = set()
        self.clock_offset_s = 0.0
        self.runs: dict[str, PodRun] = {}
        self.live_pods = 0  # Pods not yet ended (containers may run), and the most at once
        self.max_live_pods = 0
        self.started = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        api.kubelet = self
        self.store.listeners.append(self._on_event)

    @property
    def isolated(self) -> bool:
        return self.runtime is not None and self.runtime.isolated

    def register_nodes(self) -> None:
        for node in self.nodes.values():
            self.store.put("Node", node_object(node.name, node.labels, node.cpu, node.memory))

    def now(self) -> str:
        return now(self.clock_offset_s)

    # -- events --------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _on_event(self, event: Event) -> None:
        if event.kind != "Pod":
            return
        meta = event.obj["metadata"]
        uid = meta["uid"]
        if event.type == "ADDED":
            self.live_pods += 1
            self.max_live_pods = max(self.max_live_pods, self.live_pods)
            run = PodRun(uid, meta["namespace"], meta["name"],
                         self.root / "pods" / uid)
            self.runs[uid] = run
            run.lifecycle = self._spawn(self._lifecycle(run))
            return
        run = self.runs.get(uid)
        if run is None:
            return
        if event.type == "DELETED":
            self._ended(run)
            run.removed = True
            if run.node in self.partitioned:
                run.pending_end = "gone"  # a cut-off kubelet never hears of it
            else:
                self._end(run, grace=0.0, remove=False, release=True)
        elif meta.get("deletionTimestamp") and not (event.old or {}).get(
                "metadata", {}).get("deletionTimestamp"):
            if run.node in self.partitioned:
                run.pending_end = "delete"
            else:
                self._end(run, grace=float(meta.get("deletionGracePeriodSeconds") or 0),
                          remove=True)
        elif run.node and run.node not in self.partitioned and \
                _deadline_of(event.obj) != _deadline_of(event.old):
            self._arm_deadline(run, event.obj["spec"])  # changed on a live Pod (kubectl patch)

    # -- reporting -----------------------------------------------------------------------------

    def _current(self, run: PodRun) -> Obj | None:
        """The Pod as stored (to read: see `ObjectStore.peek`), None once it is gone."""
        pod = self.store.peek("Pod", run.namespace, run.name)
        if pod is None or pod["metadata"]["uid"] != run.uid:
            return None
        return pod

    def _publish(self, run: PodRun, spec: Obj | None = None) -> None:
        """Report the Pod's status: changes made in one turn of the loop go out as one
        update, as a kubelet's status manager merges them (a binding goes at once)."""
        if spec is not None:
            self._flush(run, spec)
        elif not run.publishing:
            run.publishing = True
            asyncio.get_running_loop().call_soon(self._flush, run)

    def _flush(self, run: PodRun, spec: Obj | None = None) -> None:
        """Write the Pod's status as this kubelet sees it (unless it is cut off)."""
        run.publishing = False
        if run.removed or run.frozen or run.node in self.partitioned:
            return
        pod = self._current(run)
        if pod is None:
            return
        stamp = self.now()
        inits = [b for b in run.boxes.values() if b.init]
        mains = [b for b in run.boxes.values() if not b.init]
        initialized = bool(run.boxes) and all(
            b.started if b.sidecar else b.state.get("terminated", {}).get("exitCode") == 0
            for b in inits)
        ready = bool(mains) and all("running" in b.state for b in mains)
        conditions = [run.scheduled] if run.scheduled else []
        if run.node:
            conditions += [
                {"type": "Initialized", "status": "True" if initialized else "False",
                 "lastTransitionTime": stamp},
                {"type": "ContainersReady", "status": "True" if ready else "False",
                 "lastTransitionTime": stamp},
                {"type": "Ready", "status": "True" if ready else "False",
                 "lastTransitionTime": stamp}]
        status: Obj = {"phase": run.phase, "conditions": conditions + run.extra_conditions,
                       "qosClass": "Burstable"}
        if run.node:
            status.update(hostIP="127.0.0.1", podIP="127.0.0.1", podIPs=[{"ip": "127.0.0.1"}],
                          startTime=run.start_time)
        if inits:
            status["initContainerStatuses"] = [b.status() for b in inits]
        if mains:
            status["containerStatuses"] = [b.status() for b in mains]
        if run.reason:
            status.update(reason=run.reason, message=run.message)
        self.store.put("Pod", {**pod, "metadata": dict(pod["metadata"]), "status": status,
                               "spec": {**pod["spec"], **spec} if spec else pod["spec"]})

    # -- the life of a Pod ---------------------------------------------------------------------

    async def _lifecycle(self, run: PodRun) -> None:
        pod = self._current(run)
        if pod is None:
            return
        spec = pod["spec"]
        node = await self._schedule(run, pod)
        if node is None:
            return
        run.node = node.name
        run.start_time = self.now()
        run.active_since = asyncio.get_running_loop().time()
        run.scheduled = {"type": "PodScheduled", "status": "True",
                         "lastTransitionTime": run.start_time}
        for c in spec.get("initContainers") or []:
            run.boxes[c["name"]] = Box(c, True, run.directory / f"c-{secrets.token_hex(6)}")
        for c in spec["containers"]:
            run.boxes[c["name"]] = Box(c, False, run.directory / f"c-{secrets.token_hex(6)}")
        self._publish(run, spec={"nodeName": node.name})
        self._arm_deadline(run, spec)
        while not self._mount(run, spec):  # a kubelet retries the mount until the Secret exists
            await asyncio.sleep(0.1)
        if self.runtime is not None:
            self._spawn(self._enforce_size_limits(run, spec))
        for box in run.boxes.values():
            if box.init:
                if not await self._run_init(run, box):
                    return
        for box in run.boxes.values():
            if not box.init:
                if not await self._pull(run, box):
                    return
                await self._start(run, box)
        run.phase = "Running"
        self._publish(run)
        codes = await asyncio.gather(*(self._wait(run, b) for b in run.boxes.values()
                                       if not b.init))
        await self._stop_sidecars(run, spec)
        run.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        self._finish(run)

    async def _schedule(self, run: PodRun, pod: Obj) -> Node | None:
        while True:
            reasons: list[str] = []
            for node in self.nodes.values():
                why = self._unfit(node, pod)
                if not why:
                    return node
                reasons.append(why)
            counts = sorted(Counter(reasons).items())
            unfit = f"0/{len(self.nodes)} nodes are available: " + \
                ", ".join(f"{n} {why}" for why, n in counts) + "."
            if run.scheduled is None or run.scheduled.get("message") != unfit:
                run.scheduled = {"type": "PodScheduled", "status": "False",
                                 "reason": "Unschedulable", "message": unfit,
                                 "lastTransitionTime": self.now()}
                self._publish(run)
            await asyncio.sleep(0.5)
            pod = self._current(run) or {}
            if not pod:
                return None

    def _unfit(self, node: Node, pod: Obj) -> str:
        spec = pod["spec"]
        obj = self.store.peek("Node", "", node.name)
        ready = obj is not None and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in obj["status"].get("conditions", []))
        if not ready:
            return "node(s) had untolerated taint {node.kubernetes.io/unreachable: }"
        for key, value in (spec.get("nodeSelector") or {}).items():
            if node.labels.get(key) != value:
                return "node(s) didn't match Pod's node affinity/selector"
        rc = spec.get("runtimeClassName")
        if rc and rc not in node.runtime_classes:
            return f'node(s) without runtimeclass "{rc}"'
        cpu = memory = 0.0
        for c in (spec.get("initContainers") or []) + spec["containers"]:
            resources = c.get("resources") or {}
            wanted = resources.get("requests") or resources.get("limits") or {}
            cpu += quantity(wanted.get("cpu", 0))
            memory += quantity(wanted.get("memory", 0))
        if cpu > node.cpu:
            return "Insufficient cpu"
        if memory > node.memory:
            return "Insufficient memory"
        return ""

    def _mount(self, run: PodRun, spec: Obj) -> bool:
        """Lay out the Pod's volumes; False while a Secret or ConfigMap it needs is missing."""
        contents: dict[str, dict[str, bytes] | None] = {}
        for volume in spec.get("volumes") or []:
            source = volume.get("secret") or volume.get("configMap")
            if source is None:
                contents[volume["name"]] = None  # emptyDir
                continue
            kind = "Secret" if "secret" in volume else "ConfigMap"
            name = source.get("secretName") or source.get("name")
            obj = self.store.get(kind, run.namespace, name)
            if obj is None:
                if source.get("optional"):
                    contents[volume["name"]] = {}
                    continue
                return False
            data = {k: base64.b64decode(v) if kind == "Secret" else str(v).encode()
                    for k, v in (obj.get("data") or {}).items()}
            items = source.get("items")
            contents[volume["name"]] = {i["path"]: data[i["key"]] for i in items
                                        if i["key"] in data} if items else data
        if self.simulate:
            run.sim_volumes = {k: v or {} for k, v in contents.items()}
            return True
        run.directory.mkdir(parents=True, exist_ok=True)
        for name, files in contents.items():
            path = run.directory / f"v-{secrets.token_hex(6)}"
            path.mkdir()
            path.chmod(0o777)  # as an emptyDir is
            for file, data in (files or {}).items():
                (path / file).write_bytes(data)
                mode = next((v.get("secret") or v.get("configMap") or {}).get("defaultMode", 0o644)
                            for v in spec["volumes"] if v["name"] == name)
                (path / file).chmod(mode)
            run.volumes[name] = path
        for box in run.boxes.values():
            (box.directory / "tmp").mkdir(parents=True)
            (box.directory / "home").mkdir()
        return True

    async def _run_init(self, run: PodRun, box: Box) -> bool:
        """One init container to its end (or, a sidecar, until started); False: Pod over."""
        if not await self._pull(run, box):
            return False
        await self._start(run, box)
        if box.sidecar:
            self._spawn(self._keep_sidecar(run, box))
            await self._until_started(run, box)
            return True
        code = await self._wait(run, box)
        if code == 0:
            return True
        spec = (self._current(run) or {}).get("spec") or {}
        await self._stop_sidecars(run, spec)
        run.phase = "Failed"
        self._finish(run)
        return False

    async def _until_started(self, run: PodRun, box: Box) -> None:
        probe = (box.spec.get("startupProbe") or {})
        command = (probe.get("exec") or {}).get("command")
        if not command:
            box.started = True
            self._publish(run)
            return
        period = float(probe.get("periodSeconds") or 10)
        failures, threshold = 0, int(probe.get("failureThreshold") or 3)
        while True:
            if await self._probe(run, box, command):
                box.started = True
                self._publish(run)
                return
            failures += 1
            if failures >= threshold and box.handle is not None:
                failures = 0
                box.handle.kill()  # the kubelet restarts a sidecar that never starts
            await asyncio.sleep(period)

    async def _probe(self, run: PodRun, box: Box, command: list[str]) -> bool:
        if isinstance(box.handle, SimHandle):
            return box.handle.ready()
        assert self.runtime is not None
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        return await self.runtime.probe([self._map(run, box, a) for a in command], env)

    async def _keep_sidecar(self, run: PodRun, box: Box) -> None:
        """A sidecar that exits while the Pod runs is started again."""
        while box.handle is not None:
            await self._wait(run, box)
            if run.winding_down or run.ending is not None or run.removed:
                return
            box.restarts += 1
            box.last_state, box.started = box.state, False
            await self._start(run, box)
            self._spawn(self._until_started(run, box))

    async def _stop_sidecars(self, run: PodRun, spec: Obj) -> None:
        run.winding_down = True
        grace = float(spec.get("terminationGracePeriodSeconds", 30))
        for box in reversed([b for b in run.boxes.values() if b.sidecar]):
            if box.handle is not None:
                await box.handle.stop(grace)
                await self._wait(run, box)

    async def _enforce_size_limits(self, run: PodRun, spec: Obj) -> None:
        """Evict the Pod once one of its emptyDir volumes uses more than its `sizeLimit`."""
        limits = {v["name"]: v["emptyDir"]["sizeLimit"] for v in spec.get("volumes") or []
                  if (v.get("emptyDir") or {}).get("sizeLimit")
                  and quantity(v["emptyDir"]["sizeLimit"]) > 0}
        while limits and run.phase not in _TERMINAL and run.ending is None and not run.removed:
            await asyncio.sleep(self.eviction_interval_s)
            if run.node in self.partitioned:
                continue  # a cut-off kubelet is not heard of (its evictions neither)
            for name, limit in limits.items():
                if await asyncio.to_thread(_used_bytes, run.volumes[name]) > quantity(limit):
                    self._end(run, grace=0.0, remove=False, reason="Evicted",
                              message=f'Usage of EmptyDir volume "{name}" exceeds the limit '
                                      f'"{limit}". ')
                    return

    # -- images and containers -----------------------------------------------------------------

    async def _pull(self, run: PodRun, box: Box) -> bool:
        """Pull the image (once per node); False when it never can be (ErrImagePull forever)."""
        image = box.spec["image"]
        repository = image.split("@")[0].rsplit(":", 1)[0] if "/" in image or ":" in image \
            else image
        if repository != repository.lower():
            self._waiting(run, box, "InvalidImageName", f'Failed to apply default image tag '
                          f'"{image}": couldn\'t parse image name: invalid reference format: '
                          "repository name must be lowercase")
            return False
        backoff = self.pull_backoff_s
        while (run.node, image) not in self.pulled or box.spec.get("imagePullPolicy") == "Always":
            faults = self.pull_faults.get(image) or []
            if "does-not-exist" in image:
                error = (f'rpc error: code = NotFound desc = failed to pull and unpack image '
                         f'"{image}": failed to resolve reference "{image}": {image}: not found')
            elif faults:
                error = faults.pop(0)
            else:
                self.pulled.add((run.node, image))
                break
            self._waiting(run, box, "ErrImagePull", error)
            await asyncio.sleep(backoff / 2)
            self._waiting(run, box, "ImagePullBackOff",
                          f'Back-off pulling image "{image}": ErrImagePull: {error}')
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
        return True

    def _waiting(self, run: PodRun, box: Box, reason: str, message: str) -> None:
        box.state = {"waiting": {"reason": reason, "message": message}}
        self._publish(run)

    def _image(self, image: str) -> Image:
        return self.images.get(image) or self.images.get(image.split("@")[0]) or Image()

    def _mounts(self, run: PodRun, box: Box) -> list[tuple[str, Path]]:
        """The volumes whose paths are mapped: (mountPath, where it lives here)."""
        mounts = [(m["mountPath"].rstrip("/") or "/", run.volumes[m["name"]])
                  for m in box.spec.get("volumeMounts") or []
                  if m["name"] in run.volumes and not self._over_image(m)]
        return sorted(mounts, key=lambda m: -len(m[0]))

    def _over_image(self, mount: Obj) -> bool:
        """Whether a volumeMount covers a folder of the image (mounted there for real)."""
        return os.path.isabs(mount["mountPath"]) and os.path.isdir(mount["mountPath"])

    def _real_mounts(self, run: PodRun, box: Box) -> list[tuple[str, Path, bool]]:
        """The volumes mounted over folders of the image: (mountPath, here, read-only)."""
        return [(m["mountPath"], run.volumes[m["name"]], bool(m.get("readOnly")))
                for m in box.spec.get("volumeMounts") or []
                if m["name"] in run.volumes and self._over_image(m)]

    def _map(self, run: PodRun, box: Box, value: str) -> str:
        """A path as the container names it -> where it lives here."""
        if value == box.spec.get("terminationMessagePath"):
            return str(box.message_path)
        for mount_path, host in self._mounts(run, box):
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(host) + value[len(mount_path):]
        return value

    def _env(self, run: PodRun, box: Box, pod: Obj) -> dict[str, str] | str:
        image = self._image(box.spec["image"])
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOSTNAME": run.name,
               "HOME": str(box.directory / "home"), "TMPDIR": str(box.directory / "tmp"),
               "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", MARKER_ENV: run.marker}
        env.update(self.image_env)
        env.update(image.env)
        meta = pod["metadata"]
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "metadata.uid": meta["uid"], "spec.nodeName": run.node,
                  "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
        for item in box.spec.get("env") or []:
            source = item.get("valueFrom") or {}
            if "value" in item:
                value = str(item["value"])
            elif (ref := source.get("fieldRef")) is not None:
                path = ref.get("fieldPath", "")
                if m := re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path):
                    value = (meta.get(m.group(1)) or {}).get(m.group(2), "")
                elif path in fields:
                    value = fields[path]
                else:
                    return f"unsupported fieldRef {path!r}"
            elif (ref := source.get("secretKeyRef")) is not None:
                secret = self.store.get("Secret", run.namespace, ref.get("name", ""))
                if secret is None or ref.get("key") not in (secret.get("data") or {}):
                    return f'secret "{ref.get("name")}" not found'
                value = base64.b64decode(secret["data"][ref["key"]]).decode()
            elif source:
                return f"env {item['name']}: the stand-in supports value, fieldRef, secretKeyRef"
            else:
                value = ""
            env[item["name"]] = self._map(run, box, value)
        return env

    async def _start(self, run: PodRun, box: Box) -> None:
        pod = self._current(run)
        if pod is None or run.ending is not None or run.removed:
            return
        image = self._image(box.spec["image"])
        command = box.spec.get("command") or image.entrypoint
        args = box.spec.get("args") or ([] if box.spec.get("command") else image.cmd)
        argv = [self._map(run, box, a) for a in list(command) + list(args)]
        env = self._env(run, box, pod)
        if isinstance(env, str) or not argv:
            reason = "CreateContainerConfigError" if isinstance(env, str) else \
                "CreateContainerError"
            self._waiting(run, box, reason, env if isinstance(env, str) else
                          "no command specified")
            box.handle = None
            return
        if self.simulate is not None:
            sim = self.simulate(pod, box.name, run.sim_volumes)  # to read only
            box.handle = SimHandle(sim if isinstance(sim, SimContainer) else SimContainer())
        else:
            assert self.runtime is not None
            writable = [*(host for _, host in self._mounts(run, box)), box.directory]
            box.message_path.write_bytes(b"")  # a restarted container starts with none
            log = (box.spec.get("terminationMessagePath") or "/dev/termination-log",
                   box.message_path)
            try:
                box.handle = await self.runtime.start(Launch(
                    argv, env, box.directory, box.log_path, run.marker, writable, log,
                    self._real_mounts(run, box)))
            except OSError as exc:
                self._waiting(run, box, "RunContainerError", f"failed to start: {exc}")
                box.handle = None
                return
        self.started += 1
        box.container_id = "containerd://" + uuid.uuid4().hex
        box.started = not box.sidecar or not box.spec.get("startupProbe")
        box.state = {"running": {"startedAt": self.now()}}
        self._publish(run)
        if run.ending is not None or run.removed:  # deleted while starting
            box.handle.kill()

    async def _wait(self, run: PodRun, box: Box) -> int:
        """The container's exit code, once; records its terminated state."""
        if box.handle is None:
            await asyncio.Event().wait()  # never started (config error): until the Pod ends
        assert box.handle is not None
        handle = box.handle
        code = await handle.wait()
        if "terminated" in box.state and box.handle is handle:
            return code
        message = ""
        if isinstance(handle, SimHandle):
            message = handle.sim.message if code == handle.sim.exit_code else ""
        elif box.message_path.exists():
            message = box.message_path.read_bytes()[:MAX_TERMINATION_MESSAGE].decode(
                errors="replace")
        if not message and code != 0 and box.spec.get("terminationMessagePolicy") == \
                "FallbackToLogsOnError" and box.log_path.exists():
            lines = box.log_path.read_bytes().splitlines()[-80:]
            message = b"\n".join(lines)[-2048:].decode(errors="replace")
        reason = "OOMKilled" if box.oom else "Completed" if code == 0 else "Error"
        terminated: Obj = {"exitCode": code, "reason": reason,
                           "startedAt": box.state.get("running", {}).get("startedAt", self.now()),
                           "finishedAt": self.now(), "containerID": box.container_id}
        if message:
            terminated["message"] = message
        box.state = {"terminated": terminated}
        self._publish(run)
        return code

    # -- endings -------------------------------------------------------------------------------

    def _finish(self, run: PodRun) -> None:
        if run.deadline is not None:
            run.deadline.cancel()
        self._ended(run)
        self._publish(run)

    def _ended(self, run: PodRun) -> None:
        """The Pod holds no more containers: it no longer counts as alive."""
        if not run.counted_out:
            run.counted_out = True
            self.live_pods -= 1

    def _arm_deadline(self, run: PodRun, spec: Obj) -> None:
        """`activeDeadlineSeconds`, counted from when the Pod was bound to its node."""
        if run.deadline is not None:
            run.deadline.cancel()
            run.deadline = None
        if spec.get("activeDeadlineSeconds"):
            loop = asyncio.get_running_loop()
            left = run.active_since + spec["activeDeadlineSeconds"] - loop.time()
            run.deadline = loop.call_later(max(0.0, left), self._deadline, run)

    def _deadline(self, run: PodRun) -> None:
        pod = self._current(run)
        if pod is None or run.phase in _TERMINAL or run.ending is not None:
            return
        self._end(run, grace=float(pod["spec"].get("terminationGracePeriodSeconds", 30)),
                  remove=False, reason="DeadlineExceeded", message=_DEADLINE_MESSAGE)

    def _end(self, run: PodRun, grace: float, remove: bool, reason: str = "",
             message: str = "", condition: Obj | None = None, release: bool = False) -> None:
        """Stop every container of the Pod (SIGTERM, `grace`, SIGKILL), then report it ended
        with `reason` (or take the object away, for a deletion)."""
        if run.ending is not None and not release:
            return
        if run.lifecycle is not None:
            run.lifecycle.cancel()
        run.ending = self._spawn(self._stop_all(run, grace, remove, reason, message, condition,
                                                release))

    async def _stop_all(self, run: PodRun, grace: float, remove: bool, reason: str,
                        message: str, condition: Obj | None, release: bool) -> None:
        run.winding_down = True
        if run.deadline is not None:
            run.deadline.cancel()
        running = [b for b in run.boxes.values() if b.handle is not None]
        await asyncio.gather(*(b.handle.stop(grace) for b in running if b.handle),
                             return_exceptions=True)
        await asyncio.gather(*(self._wait(run, b) for b in running), return_exceptions=True)
        if reason and run.phase not in _TERMINAL:
            self._ended(run)
            run.phase, run.reason, run.message = "Failed", reason, message
            if condition:
                run.extra_conditions.append(condition)
            for box in run.boxes.values():
                if "waiting" in box.state:
                    box.state = {"waiting": box.state["waiting"]}
        self._flush(run)  # the last status, before the object goes
        if remove and self._current(run) is not None:
            self.store.remove("Pod", run.namespace, run.name)
        if remove or release:
            self.runs.pop(run.uid, None)
            shutil.rmtree(run.directory, ignore_errors=True)

    # -- what a real cluster does to Pods (knobs) ----------------------------------------------

    def _run_of(self, namespace: str, name: str) -> PodRun:
        pod = self.store.get("Pod", namespace, name)
        if pod is None or pod["metadata"]["uid"] not in self.runs:
            raise KeyError(f"no running Pod {namespace}/{name}")
        return self.runs[pod["metadata"]["uid"]]

    def evict(self, namespace: str, name: str, message: str) -> None:
        """Node-pressure eviction: containers killed, `Failed / Evicted`."""
        run = self._run_of(namespace, name)
        self._end(run, grace=0.0, remove=False, reason="Evicted", message=message,
                  condition=self._disruption("TerminationByKubelet", message))

    def oom(self, namespace: str, name: str, container: str) -> None:
        """The kernel's OOM killer ends `container`."""
        box = self._run_of(namespace, name).boxes[container]
        box.oom = True
        if box.handle is not None:
            box.handle.kill()

    def preempt(self, namespace: str, name: str) -> None:
        """The scheduler preempts the Pod: a DisruptionTarget condition, then a graceful delete."""
        run = self._run_of(namespace, name)
        run.extra_conditions.append(self._disruption(
            "PreemptionByScheduler", "standin-scheduler: preempting to accommodate a higher "
            "priority pod"))
        self._publish(run)
        self.api.delete("Pod", namespace, name, None)

    def set_phase_unknown(self, namespace: str, name: str) -> None:
        """What an older node controller reports for a Pod it lost touch with."""
        run = self._run_of(namespace, name)
        pod = self.store.get("Pod", namespace, name)
        assert pod is not None
        pod["status"]["phase"] = "Unknown"
        run.frozen = True
        self.store.put("Pod", pod)

    def partition(self, node: str, ready: str = "Unknown", since_s: float = 0.0) -> None:
        """Cut the node off: its kubelet stops reporting and acting (its processes keep
        running); the node lifecycle controller marks it Ready=`ready` since `since_s` ago."""
        self.partitioned.add(node)
        self._node_ready(node, ready, since_s)

    def reconnect(self, node: str) -> None:
        """The node is back: its kubelet reports again and carries out what it missed."""
        self.partitioned.discard(node)
        self._node_ready(node, "True", 0.0)
        for run in list(self.runs.values()):
            if run.node != node:
                continue
            if run.pending_end == "gone" or run.removed:
                self._end(run, grace=0.0, remove=False, release=True)
            elif run.pending_end == "delete":
                pod = self._current(run) or {"metadata": {}}
                self._end(run, grace=float(pod["metadata"].get("deletionGracePeriodSeconds")
                                           or 0), remove=True)
            else:
                self._publish(run)

    def remove_node(self, node: str) -> None:
        """The node is deleted (its machine is gone): the pod garbage collector marks and
        force-deletes the Pods bound to it; their processes die with the machine."""
        self.api.delete("Node", "", node, None)
        for run in list(self.runs.values()):
            if run.node != node:
                continue
            pod = self.store.get("Pod", run.namespace, run.name) if self._current(run) else None
            if pod is not None:
                pod["status"].setdefault("conditions", []).append(self._disruption(
                    "DeletionByPodGC", "PodGC: node no longer exists"))
                self.store.put("Pod", pod)
                self.store.remove("Pod", run.namespace, run.name)
            self._end(run, grace=0.0, remove=False, release=True)

    def restore_node(self, node: str) -> None:
        """A removed node registers again (a new machine under the old name)."""
        spec = self.nodes[node]
        self.partitioned.discard(node)
        self.store.put("Node", node_object(spec.name, spec.labels, spec.cpu, spec.memory))

    def _node_ready(self, node: str, status: str, since_s: float) -> None:
        obj = self.store.get("Node", "", node)
        if obj is None:
            return
        stamp = now(self.clock_offset_s - since_s)
        reason, message = ("KubeletReady", "kubelet is posting ready status") \
            if status == "True" else ("NodeStatusUnknown", "Kubelet stopped posting node status.")
        obj["status"]["conditions"] = [{"type": "Ready", "status": status, "reason": reason,
                                        "message": message, "lastHeartbeatTime": stamp,
                                        "lastTransitionTime": stamp}]
        self.store.put("Node", obj)

    def _disruption(self, reason: str, message: str) -> Obj:
        return {"type": "DisruptionTarget", "status": "True", "reason": reason,
                "message": message, "lastTransitionTime": self.now()}

    async def shutdown(self) -> None:
        """Kill every container (the stand-in is stopping)."""
        for run in list(self.runs.values()):
            if run.deadline is not None:
                run.deadline.cancel()
            for box in run.boxes.values():
                if box.handle is not None:
                    box.handle.kill()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for run in list(self.runs.values()):
            for box in run.boxes.values():
                if box.handle is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(box.handle.wait(), 5)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- logs ----------------------------------------------------------------------------------

    async def serve_log(self, request: web.Request, pod: Obj) -> web.StreamResponse:
        """`GET pods/{name}/log`: container, tailLines, limitBytes, follow; 400 while waiting."""
        run = self.runs.get(pod["metadata"]["uid"])
        pod_name = pod["metadata"]["name"]
        mains = [c["name"] for c in pod["spec"]["containers"]]
        inits = [c["name"] for c in pod["spec"].get("initContainers") or []]
        name = request.query.get("container") or (mains[0] if len(mains) == 1 else "")
        if not name:
            return _error(400, "BadRequest", f"a container name must be specified for pod "
                          f"{pod_name}, choose one of: {mains} or one of the init "
                          f"containers: {inits}")
        if name not in mains + inits:
            return _error(400, "BadRequest", f"container {name} is not valid for pod {pod_name}")
        box = run.boxes.get(name) if run else None
        if box is None or box.handle is None:
            reason = (box.state.get("waiting") or {}).get("reason", "ContainerCreating") \
                if box else "ContainerCreating"
            return _error(400, "BadRequest", f'container "{name}" in pod "{pod_name}" is '
                          f"waiting to start: {reason}")
        follow = request.query.get("follow") in ("1", "t", "T", "true", "True", "TRUE")
        if not follow:
            return web.Response(body=self._read_log(box, request.query),
                                content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        offset = 0
        while True:
            data = box.log_path.read_bytes() if box.log_path.exists() else b""
            if len(data) > offset:
                await response.write(data[offset:])
                offset = len(data)
            if "terminated" in box.state or (run and run.removed):
                break
            await asyncio.sleep(0.1)
        await response.write_eof()
        return response

    @staticmethod
    def _read_log(box: Box, query: Any) -> bytes:
        data = box.log_path.read_bytes() if box.log_path.exists() else b""
        if query.get("tailLines"):
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(query["tailLines"]):]) if int(query["tailLines"]) else b""
        if query.get("limitBytes"):
            data = data[: int(query["limitBytes"])]
        return data


def _used_bytes(folder: Path) -> int:
    """What a folder's files take on disk, links not followed (as `du`, which the kubelet's
    volume statistics use, counts: a sparse file only for the blocks it has)."""
    used = 0
    for where, dirs, files in os.walk(folder):
        for entry in dirs + files:
            with contextlib.suppress(OSError):
                used += os.lstat(os.path.join(where, entry)).st_blocks * 512
    return used


def _deadline_of(pod: Obj | None) -> Any:
    return ((pod or {}).get("spec") or {}).get("activeDeadlineSeconds")
