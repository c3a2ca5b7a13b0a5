"""The stand-in scheduler + kubelet: runs each Pod's container command as a local process.

Scheduling: one node with labels and allocatable cpu / memory; a Pod whose nodeSelector or
requests do not fit stays Pending with `PodScheduled=False, reason Unschedulable`.
Image pull: the image is otherwise ignored, except that one containing `does-not-exist`
fails with ErrImagePull then ImagePullBackOff, and one with upper-case letters in its
repository is an InvalidImageName.
Running: the container's `command + args` with its env (`value` and `fieldRef`), stdout and
stderr into the Pod log, a per-Pod directory as cwd/TMPDIR/HOME, and the termination message
file at a per-Pod path (env values naming `terminationMessagePath` are pointed at it, since a
local process cannot write /dev/termination-log). Exit -> Succeeded / Failed with exitCode,
reason and message (FallbackToLogsOnError honoured); `activeDeadlineSeconds` -> SIGTERM, grace,
SIGKILL, `Failed / DeadlineExceeded`; graceful deletion -> the same, then the object goes;
a force-deleted Pod's processes are killed at once. A marker variable in every container
process's environment plays the cgroup: whatever carries it dies with the Pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from openforge.executors.process import die_with_parent, kill_tree

from .apiserver import ApiServer, _error
from .objects import MAX_TERMINATION_MESSAGE, now, quantity
from .store import Event

Obj = dict[str, Any]
MARKER_ENV = "OPENFORGE_SANDBOX_ID"
MARKER_PREFIX = "k8s-standin-"
NODE_NAME = "standin-node"
_TERMINAL = ("Succeeded", "Failed")


@dataclass
class Node:
    """The one node pods are scheduled on."""

    name: str = NODE_NAME
    labels: dict[str, str] = field(default_factory=lambda: {
        "kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64"})
    cpu: float = 64.0
    memory: float = 256 * 2**30
    runtime_classes: tuple[str, ...] = ("gvisor", "kata")


@dataclass
class Container:
    """A running (or finished) container process of one Pod."""

    uid: str
    namespace: str
    name: str
    directory: Path
    proc: asyncio.subprocess.Process | None = None
    started_at: str = ""
    killing: asyncio.Task[None] | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    deadline: asyncio.TimerHandle | None = None
    waiting_reason: str = "ContainerCreating"
    deadline_exceeded: bool = False
    removed: bool = False

    @property
    def marker(self) -> str:
        return MARKER_PREFIX + self.uid

    @property
    def log_path(self) -> Path:
        return self.directory / "container.log"

    @property
    def message_path(self) -> Path:
        return self.directory / "termination-log"


class Kubelet:
    """Schedules and runs Pods from the API server's store."""

    def __init__(self, api: ApiServer, root: Path, node: Node | None = None,
                 image_env: dict[str, str] | None = None) -> None:
        self.api = api
        self.store = api.store
        self.root = root
        self.node = node or Node()
        self.image_env = image_env or {}
        self.containers: dict[str, Container] = {}
        self.live_pods = 0
        self.max_live_pods = 0
        self.started = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        api.kubelet = self
        self.store.listeners.append(self._on_event)

    # -- events --------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _on_event(self, event: Event) -> None:
        if event.kind != "Pod":
            return
        meta = event.obj["metadata"]
        uid = meta["uid"]
        if event.type == "ADDED":
            self.live_pods += 1
            self.max_live_pods = max(self.max_live_pods, self.live_pods)
            self._spawn(self._admit(uid, meta["namespace"], meta["name"]))
        elif event.type == "DELETED":
            self.live_pods -= 1
            container = self.containers.get(uid)
            if container is not None:
                container.removed = True
                self._spawn(self._stop(container, grace=0.5, then_remove=False))
        elif meta.get("deletionTimestamp") and not (event.old or {}).get(
                "metadata", {}).get("deletionTimestamp"):
            container = self.containers.get(uid)
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            if container is not None:
                self._spawn(self._stop(container, grace=grace, then_remove=True))

    def _current(self, container: Container) -> Obj | None:
        pod = self.store.get("Pod", container.namespace, container.name)
        if pod is None or pod["metadata"]["uid"] != container.uid:
            return None
        return pod

    def _update(self, container: Container, status: Obj, spec: Obj | None = None) -> None:
        pod = self._current(container)
        if pod is None:
            return
        pod["status"].update(status)
        if spec:
            pod["spec"].update(spec)
        self.store.put("Pod", pod)

    # -- scheduling and start ------------------------------------------------------------------

    def _unfit(self, pod: Obj) -> str | None:
        spec = pod["spec"]
        for key, value in (spec.get("nodeSelector") or {}).items():
            if self.node.labels.get(key) != value:
                return "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
        rc = spec.get("runtimeClassName")
        if rc and rc not in self.node.runtime_classes:
            return f'0/1 nodes are available: runtimeclass "{rc}" not found.'
        cpu = memory = 0.0
        for c in spec["containers"]:
            resources = c.get("resources") or {}
            wanted = resources.get("requests") or resources.get("limits") or {}
            cpu += quantity(wanted.get("cpu", 0))
            memory += quantity(wanted.get("memory", 0))
        if cpu > self.node.cpu:
            return "0/1 nodes are available: 1 Insufficient cpu."
        if memory > self.node.memory:
            return "0/1 nodes are available: 1 Insufficient memory."
        return None

    @staticmethod
    def _waiting(c: Obj, reason: str, message: str = "") -> Obj:
        state: Obj = {"reason": reason}
        if message:
            state["message"] = message
        return {"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                "restartCount": 0, "started": False, "state": {"waiting": state}, "lastState": {}}

    async def _admit(self, uid: str, namespace: str, name: str) -> None:
        pod = self.store.get("Pod", namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        directory = self.root / uid
        container = Container(uid=uid, namespace=namespace, name=name, directory=directory)
        unfit = self._unfit(pod)
        if unfit:
            self.containers[uid] = container
            self._update(container, {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": unfit, "lastTransitionTime": now()}]})
            return
        c = pod["spec"]["containers"][0]
        (directory / "tmp").mkdir(parents=True, exist_ok=True)
        (directory / "home").mkdir(exist_ok=True)
        self.containers[uid] = container
        started = now()
        self._update(container, {
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
                {"type": "Initialized", "status": "True", "lastTransitionTime": started},
                {"type": "ContainersReady", "status": "False", "lastTransitionTime": started},
                {"type": "Ready", "status": "False", "lastTransitionTime": started}],
            "startTime": started, "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "containerStatuses": [self._waiting(c, "ContainerCreating")]},
            spec={"nodeName": self.node.name})
        deadline = pod["spec"].get("activeDeadlineSeconds")
        if deadline:
            container.deadline = asyncio.get_running_loop().call_later(
                deadline, lambda: self._spawn(self._deadline(container)))
        image = c["image"]
        repository = image.split("@")[0].rsplit(":", 1)[0] if "/" in image or ":" in image else image
        if repository != repository.lower():
            container.waiting_reason = "InvalidImageName"
            self._update(container, {"containerStatuses": [self._waiting(
                c, "InvalidImageName", f'Failed to apply default image tag "{image}": couldn\'t '
                "parse image name: invalid reference format: repository name must be lowercase")]})
            return
        if "does-not-exist" in image:
            container.waiting_reason = "ErrImagePull"
            self._update(container, {"containerStatuses": [self._waiting(
                c, "ErrImagePull", f'rpc error: code = NotFound desc = failed to pull and unpack '
                f'image "{image}": not found')]})
            await asyncio.sleep(0.3)
            container.waiting_reason = "ImagePullBackOff"
            self._update(container, {"containerStatuses": [self._waiting(
                c, "ImagePullBackOff", f'Back-off pulling image "{image}"')]})
            return
        await self._start(container, pod, c)

    def _env(self, container: Container, pod: Obj, c: Obj) -> dict[str, str] | str:
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOSTNAME": container.name,
               "HOME": str(container.directory / "home"), "TMPDIR": str(container.directory / "tmp"),
               "LANG": "C.UTF-8", MARKER_ENV: container.marker}
        env.update(self.image_env)
        meta = pod["metadata"]
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "metadata.uid": meta["uid"], "spec.nodeName": self.node.name,
                  "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
        for item in c.get("env") or []:
            if "value" in item:
                value = str(item["value"])
            elif (ref := (item.get("valueFrom") or {}).get("fieldRef")) is not None:
                path = ref.get("fieldPath", "")
                if m := re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path):
                    value = (meta.get(m.group(1)) or {}).get(m.group(2), "")
                elif path in fields:
                    value = fields[path]
                else:
                    return f"unsupported fieldRef {path!r}"
            elif item.get("valueFrom"):
                return f"env {item['name']}: only value and fieldRef are supported by the stand-in"
            else:
                value = ""
            if value == c.get("terminationMessagePath"):
                value = str(container.message_path)
            env[item["name"]] = value
        return env

    async def _start(self, container: Container, pod: Obj, c: Obj) -> None:
        argv = list(c.get("command") or []) + list(c.get("args") or [])
        env = self._env(container, pod, c)
        if isinstance(env, str) or not argv:
            reason = "CreateContainerConfigError" if isinstance(env, str) else "CreateContainerError"
            container.waiting_reason = reason
            self._update(container, {"containerStatuses": [self._waiting(
                c, reason, env if isinstance(env, str) else "no command specified")]})
            return
        if self._current(container) is None or container.removed:
            return
        try:
            with open(container.log_path, "wb") as log:
                container.proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log,
                    stderr=asyncio.subprocess.STDOUT, cwd=str(container.directory), env=env,
                    start_new_session=True, preexec_fn=die_with_parent())
        except OSError as exc:
            self._finish(container, c, 128, "StartError", f"failed to start: {exc}")
            return
        self.started += 1
        container.started_at = now()
        cid = "containerd://" + uuid.uuid4().hex
        ready = {"type": "Ready", "status": "True", "lastTransitionTime": container.started_at}
        pod_now = self._current(container)
        if pod_now is not None:
            conditions = [x for x in pod_now["status"].get("conditions", [])
                          if x["type"] not in ("Ready", "ContainersReady")]
            conditions += [ready, {**ready, "type": "ContainersReady"}]
            self._update(container, {"phase": "Running", "conditions": conditions,
                                     "containerStatuses": [{
                "name": c["name"], "image": c["image"], "imageID": f"{c['image']}@sha256:{'0' * 64}",
                "containerID": cid, "ready": True, "restartCount": 0, "started": True,
                "state": {"running": {"startedAt": container.started_at}}, "lastState": {}}]})
        if container.removed:  # force-deleted while starting
            self._spawn(self._stop(container, grace=0.5, then_remove=False))
        code = await container.proc.wait()
        # The container's cgroup goes with its main process: so do stragglers it left.
        await asyncio.to_thread(kill_tree, container.proc.pid, container.proc.pid,
                                container.marker, 0.5)
        exit_code = 128 - code if code < 0 else code  # killed by signal N -> 128 + N
        self._finish(container, c, exit_code, "Completed" if exit_code == 0 else "Error", None,
                     container_id=cid)

    def _finish(self, container: Container, c: Obj, exit_code: int, reason: str,
                message: str | None, container_id: str = "") -> None:
        if container.deadline is not None:
            container.deadline.cancel()
        if message is None:
            message = ""
            if container.message_path.exists():
                message = container.message_path.read_bytes()[:MAX_TERMINATION_MESSAGE].decode(
                    errors="replace")
            if not message and exit_code != 0 and c.get("terminationMessagePolicy") == \
                    "FallbackToLogsOnError" and container.log_path.exists():
                lines = container.log_path.read_bytes().splitlines()[-80:]
                message = b"\n".join(lines)[-2048:].decode(errors="replace")
        terminated: Obj = {"exitCode": exit_code, "reason": reason,
                           "startedAt": container.started_at or now(), "finishedAt": now()}
        if container_id:
            terminated["containerID"] = container_id
        if message:
            terminated["message"] = message
        status: Obj = {"phase": "Succeeded" if exit_code == 0 else "Failed",
                       "containerStatuses": [{
                           "name": c["name"], "image": c["image"],
                           "imageID": f"{c['image']}@sha256:{'0' * 64}",
                           "containerID": container_id or "", "ready": False, "restartCount": 0,
                           "started": False, "state": {"terminated": terminated},
                           "lastState": {}}]}
        if container.deadline_exceeded:
            status.update(phase="Failed", reason="DeadlineExceeded",
                          message="Pod was active on the node longer than the specified deadline")
        pod = self._current(container)
        if pod is not None:
            status["conditions"] = [
                {**x, "status": "False"} if x["type"] in ("Ready", "ContainersReady") else x
                for x in pod["status"].get("conditions", [])]
        self._update(container, status)
        container.exited.set()

    # -- stopping ------------------------------------------------------------------------------

    async def _kill(self, container: Container, grace: float) -> None:
        """SIGTERM the container's process group, SIGKILL after `grace`; `_start` then sweeps
        the stragglers. Signals, not psutil waits: asyncio must be the one to reap the child."""
        proc = container.proc
        if proc is None or container.exited.is_set():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(container.exited.wait()), max(grace, 0.1))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await container.exited.wait()

    async def _deadline(self, container: Container) -> None:
        pod = self._current(container)
        if pod is None or pod["status"].get("phase") in _TERMINAL:
            return
        container.deadline_exceeded = True
        if container.proc is None:  # never started (image pull): fail it as is
            c = pod["spec"]["containers"][0]
            self._update(container, {
                "phase": "Failed", "reason": "DeadlineExceeded",
                "message": "Pod was active on the node longer than the specified deadline",
                "containerStatuses": [self._waiting(c, container.waiting_reason)]})
            return
        await self._kill(container, float(pod["spec"].get("terminationGracePeriodSeconds", 30)))

    async def _stop(self, container: Container, grace: float, then_remove: bool) -> None:
        try:
            await self._kill(container, grace)
        finally:
            if then_remove:
                pod = self._current(container)
                if pod is not None:
                    self.store.remove("Pod", container.namespace, container.name)
            if container.removed or then_remove:
                self.containers.pop(container.uid, None)
                if container.deadline is not None:
                    container.deadline.cancel()
                shutil.rmtree(container.directory, ignore_errors=True)

    async def shutdown(self) -> None:
        """Kill every container process (the stand-in is stopping)."""
        for container in list(self.containers.values()):
            if container.deadline is not None:
                container.deadline.cancel()
            await self._kill(container, 0.2)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- logs ----------------------------------------------------------------------------------

    async def serve_log(self, request: web.Request, pod: Obj) -> web.StreamResponse:
        """`GET pods/{name}/log`: tailLines, limitBytes, follow; 400 while waiting to start."""
        container = self.containers.get(pod["metadata"]["uid"])
        c = pod["spec"]["containers"][0]
        name = request.query.get("container", c["name"])
        if name != c["name"]:
            return _error(400, "BadRequest", f'container {name} is not valid for pod '
                          f'{pod["metadata"]["name"]}')
        if container is None or container.proc is None:
            reason = container.waiting_reason if container else "ContainerCreating"
            return _error(400, "BadRequest", f'container "{name}" in pod '
                          f'"{pod["metadata"]["name"]}" is waiting to start: {reason}')
        follow = request.query.get("follow") in ("1", "t", "T", "true", "True", "TRUE")
        if not follow:
            return web.Response(body=self._read_log(container, request.query),
                                content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        offset = 0
        while True:
            data = container.log_path.read_bytes() if container.log_path.exists() else b""
            if len(data) > offset:
                await response.write(data[offset:])
                offset = len(data)
            if container.exited.is_set() or container.removed:
                break
            await asyncio.sleep(0.1)
        await response.write_eof()
        return response

    @staticmethod
    def _read_log(container: Container, query: Any) -> bytes:
        data = container.log_path.read_bytes() if container.log_path.exists() else b""
        if query.get("tailLines"):
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(query["tailLines"]):]) if int(query["tailLines"]) else b""
        if query.get("limitBytes"):
            data = data[: int(query["limitBytes"])]
        return data


def python_command() -> list[str]:
    """This interpreter running the in-sandbox entry point (what the stand-in's pods run)."""
    return [sys.executable, "-m", "openforge.rollout"]
