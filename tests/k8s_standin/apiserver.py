"""The stand-in Kubernetes API server: the core/v1 REST API the executor uses, over real HTTP.

Served by aiohttp on 127.0.0.1: discovery (`/version`, `/api`, `/api/v1`, `/apis`), Pods
(create / get / list / watch / delete / deletecollection / patch / status / log), ConfigMaps
and Secrets (the same verbs but log), Nodes (cluster-scoped: get / list / watch / patch /
delete), label and field selectors, resourceVersion-based watch with 410 on versions older
than the history, dryRun, bearer-token auth, `kind: Status` errors, the upstream
graceful-deletion rules, owner-reference garbage collection across kinds, a pod-count
ResourceQuota (403 "exceeded quota") and fault injection (`inject`: chosen calls fail with
any status and message: 409 / 429 / 5xx, admission webhook or policy refusals).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .objects import Invalid, admit_configmap, admit_pod, admit_secret, now, status_object
from .selectors import SelectorError, parse_field_selector, parse_label_selector
from .store import Event, ObjectStore, TooOld

if TYPE_CHECKING:
    from .kubelet import Kubelet

Obj = dict[str, Any]
VERSION = {"major": "1", "minor": "37", "gitVersion": "v1.37.0-openforge-standin",
           "gitCommit": "0000000", "gitTreeState": "clean", "buildDate": "2026-11-30T00:00:00Z",
           "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64"}
_RESOURCES = {"pods": "Pod", "configmaps": "ConfigMap", "secrets": "Secret", "nodes": "Node"}
_ADMIT = {"pods": admit_pod, "configmaps": admit_configmap, "secrets": admit_secret}
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


@dataclass
class Fault:
    """Answer the next `count` calls of `verb` on `resource` with `status` (and `message`)."""

    verb: str
    resource: str
    status: int
    count: int = 1
    retry_after: int | None = None
    message: str = ""
    reason: str = ""


def go_bool(value: str | None, name: str) -> bool:
    """Go's strconv.ParseBool, which the API server uses for query booleans."""
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise web.HTTPBadRequest(text=json.dumps(status_object(
        400, "BadRequest", f"invalid boolean value {value!r} for {name}")),
        content_type="application/json")


def _error(code: int, reason: str, message: str, **kw: Any) -> web.Response:
    headers = {}
    if kw.get("retry_after") is not None:
        headers["Retry-After"] = str(kw["retry_after"])
    return web.json_response(status_object(code, reason, message, **kw), status=code,
                             headers=headers)


_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 410: "Expired",
            422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 504: "Timeout"}


class ApiServer:
    """Routes and admission; the kubelet is attached after construction."""

    def __init__(self, token: str, history: int = 5000) -> None:
        self.token = token
        self.store = ObjectStore(history=history)
        self.kubelet: Kubelet | None = None
        self.calls: Counter[str] = Counter()
        self.faults: list[Fault] = []
        self.watch_connections = 0
        # Open watches by "resource?labelSelector", and the most ever open at once.
        self.open_watches: Counter[str] = Counter()
        self.max_open_watches: Counter[str] = Counter()
        # The lists and watches served, by "resource?labelSelector", in the order they came.
        self.reads: defaultdict[str, list[str]] = defaultdict(list)
        self.pod_quota: int | None = None  # a ResourceQuota of `pods: N` per namespace
        self.deletions: list[tuple[float, str, str, int | None]] = []  # (when, kind, name, grace)
        self.store.listeners.append(self._collect_garbage)

    # -- wiring --------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        r = app.router
        for path in ("/version", "/version/"):
            r.add_get(path, lambda req: web.json_response(VERSION))
        r.add_get("/api", self._api_versions)
        r.add_get("/api/", self._api_versions)
        r.add_get("/api/v1", self._api_resources)
        r.add_get("/apis", lambda req: web.json_response(
            {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}))
        for res in ("pods", "configmaps", "secrets"):
            r.add_get(f"/api/v1/{res}", self._list_or_watch)
            r.add_get(f"/api/v1/namespaces/{{ns}}/{res}", self._list_or_watch)
            r.add_post(f"/api/v1/namespaces/{{ns}}/{res}", self._create)
            r.add_delete(f"/api/v1/namespaces/{{ns}}/{res}", self._delete_collection)
            r.add_get(f"/api/v1/namespaces/{{ns}}/{res}/{{name}}", self._get)
            r.add_delete(f"/api/v1/namespaces/{{ns}}/{res}/{{name}}", self._delete)
            r.add_patch(f"/api/v1/namespaces/{{ns}}/{res}/{{name}}", self._patch)
        r.add_get("/api/v1/nodes", self._list_or_watch)
        r.add_get("/api/v1/nodes/{name}", self._get)
        r.add_patch("/api/v1/nodes/{name}", self._patch)
        r.add_patch("/api/v1/nodes/{name}/status", self._patch)
        r.add_delete("/api/v1/nodes/{name}", self._delete)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}/status", self._get)
        r.add_patch("/api/v1/namespaces/{ns}/pods/{name}/status", self._patch)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self._log)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(401, "Unauthorized", "Unauthorized")
        return await handler(request)  # type: ignore[no-any-return]

    def inject(self, fault: Fault) -> None:
        self.faults.append(fault)

    def _fault(self, verb: str, resource: str) -> web.Response | None:
        self.calls[f"{verb} {resource}"] += 1
        for fault in self.faults:
            if fault.verb == verb and fault.resource == resource and fault.count > 0:
                fault.count -= 1
                return _error(fault.status, fault.reason or _REASONS.get(fault.status, "InternalError"),
                              fault.message or f"injected fault: {verb} {resource} -> {fault.status}",
                              retry_after=fault.retry_after)
        return None

    @staticmethod
    def _resource(request: web.Request) -> str:
        parts = request.path.split("/")
        return parts[5] if parts[3] == "namespaces" else parts[3]

    # -- discovery -----------------------------------------------------------------------------

    async def _api_versions(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                  "serverAddressByClientCIDRs": [
                                      {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})

    async def _api_resources(self, request: web.Request) -> web.Response:
        def res(name: str, kind: str, verbs: list[str], ns: bool = True) -> Obj:
            return {"name": name, "singularName": "", "namespaced": ns, "kind": kind, "verbs": verbs}

        crud = ["create", "delete", "deletecollection", "get", "list", "patch", "watch"]
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            res("pods", "Pod", crud), res("pods/status", "Pod", ["get", "patch"]),
            res("pods/log", "Pod", ["get"]), res("configmaps", "ConfigMap", crud),
            res("secrets", "Secret", crud),
            res("nodes", "Node", ["delete", "get", "list", "patch", "watch"], ns=False),
            res("nodes/status", "Node", ["get", "patch"], ns=False)]})

    # -- reads ---------------------------------------------------------------------------------

    async def _get(self, request: web.Request) -> web.Response:
        res = self._resource(request)
        if (fault := self._fault("get", res)) is not None:
            return fault
        ns, name = request.match_info.get("ns", ""), request.match_info["name"]
        obj = self.store.get(_RESOURCES[res], ns, name)
        if obj is None:
            return _error(404, "NotFound", f'{res} "{name}" not found', name=name, kind=res)
        return web.json_response(obj)

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        res = self._resource(request)
        kind = _RESOURCES[res]
        ns = request.match_info.get("ns")
        q = request.query
        watch = go_bool(q.get("watch"), "watch")
        if (fault := self._fault("watch" if watch else "list", res)) is not None:
            return fault
        try:
            labels = parse_label_selector(q.get("labelSelector"))
            fields = parse_field_selector(q.get("fieldSelector"), kind)
        except SelectorError as exc:
            return _error(400, "BadRequest", str(exc))

        def matches(obj: Obj) -> bool:
            return labels(obj["metadata"].get("labels") or {}) and fields(obj)

        key = f"{res}?{q.get('labelSelector') or ''}"
        self.reads[key].append("watch" if watch else "list")
        if watch:
            return await self._watch(request, kind, ns, matches, key)
        items = [o for o in self.store.list(kind, ns) if matches(o)]
        return web.json_response({"kind": f"{kind}List", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self.store.rv)},
                                  "items": items})

    async def _watch(self, request: web.Request, kind: str, ns: str | None,
                     matches: Any, key: str) -> web.StreamResponse:
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            watcher = self.store.watch(kind, ns, matches, request.query.get("resourceVersion"))
        except TooOld as exc:
            self.calls["watch expired (410)"] += 1
            err = status_object(410, "Expired", f"too old resource version: {exc} "
                                f"({self.store.compacted_rv})")
            await response.write((json.dumps({"type": "ERROR", "object": err}) + "\n").encode())
            await response.write_eof()
            return response
        self.watch_connections += 1
        self.open_watches[key] += 1
        self.max_open_watches[key] = max(self.max_open_watches[key], self.open_watches[key])
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        try:
            while (left := end - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), min(left, 1.0))
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        break
                    continue
                if event is None:  # the server is stopping
                    break
                line = json.dumps({"type": event.type, "object": event.obj}) + "\n"
                await response.write(line.encode())
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.watch_connections -= 1
            self.open_watches[key] -= 1
            self.store.unwatch(watcher)
        return response

    async def _log(self, request: web.Request) -> web.StreamResponse:
        if (fault := self._fault("get", "pods/log")) is not None:
            return fault
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.store.get("Pod", ns, name)
        if pod is None:
            return _error(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        assert self.kubelet is not None
        return await self.kubelet.serve_log(request, pod)

    # -- writes --------------------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.Response:
        res = self._resource(request)
        if (fault := self._fault("create", res)) is not None:
            return fault
        ns = request.match_info["ns"]
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "BadRequest", "the request body is not valid JSON")
        try:
            obj = _ADMIT[res](body, ns)
        except Invalid as exc:
            return _error(422, "Invalid", str(exc), causes=exc.causes, kind=res,
                          name=body.get("metadata", {}).get("name", ""))
        name = obj["metadata"]["name"]
        if self.store.get(_RESOURCES[res], ns, name) is not None:
            return _error(409, "AlreadyExists", f'{res} "{name}" already exists', name=name, kind=res)
        if res == "pods" and self.pod_quota is not None:
            used = sum(p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
                       for p in self.store.list("Pod", ns))
            if used >= self.pod_quota:
                return _error(403, "Forbidden", f'pods "{name}" is forbidden: exceeded quota: '
                              f"standin-quota, requested: pods=1, used: pods={used}, "
                              f"limited: pods={self.pod_quota}", name=name, kind=res)
        if request.query.get("dryRun") == "All":
            return web.json_response(obj, status=201)
        self.store.put(_RESOURCES[res], obj)
        return web.json_response(obj, status=201)

    async def _patch(self, request: web.Request) -> web.Response:
        res = self._resource(request)
        if (fault := self._fault("patch", res)) is not None:
            return fault
        ns, name = request.match_info.get("ns", ""), request.match_info["name"]
        obj = self.store.get(_RESOURCES[res], ns, name)
        if obj is None:
            return _error(404, "NotFound", f'{res} "{name}" not found', name=name, kind=res)
        patch = await request.json()
        merged = _merge(obj, patch)  # obj: a copy
        # Identity fields cannot be patched.
        merged["metadata"]["uid"] = obj["metadata"]["uid"]
        merged["metadata"]["name"] = name
        return web.json_response(self.store.put(_RESOURCES[res], merged))

    @staticmethod
    def _delete_options(request: web.Request, body: Obj) -> tuple[int | None, str]:
        grace = request.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        policy = request.query.get("propagationPolicy", body.get("propagationPolicy") or "Background")
        return (int(grace) if grace is not None else None), policy

    async def _body(self, request: web.Request) -> Obj:
        if not request.can_read_body:
            return {}
        try:
            body = await request.json()
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    async def _delete(self, request: web.Request) -> web.Response:
        res = self._resource(request)
        if (fault := self._fault("delete", res)) is not None:
            return fault
        ns, name = request.match_info.get("ns", ""), request.match_info["name"]
        grace, policy = self._delete_options(request, await self._body(request))
        obj = self.delete(_RESOURCES[res], ns, name, grace, policy)
        if obj is None:
            return _error(404, "NotFound", f'{res} "{name}" not found', name=name, kind=res)
        return web.json_response(obj)

    async def _delete_collection(self, request: web.Request) -> web.Response:
        res = self._resource(request)
        if (fault := self._fault("deletecollection", res)) is not None:
            return fault
        ns = request.match_info["ns"]
        kind = _RESOURCES[res]
        try:
            labels = parse_label_selector(request.query.get("labelSelector"))
            fields = parse_field_selector(request.query.get("fieldSelector"), kind)
        except SelectorError as exc:
            return _error(400, "BadRequest", str(exc))
        grace, policy = self._delete_options(request, await self._body(request))
        deleted = []
        for obj in self.store.list(kind, ns):
            if labels(obj["metadata"].get("labels") or {}) and fields(obj):
                gone = self.delete(kind, ns, obj["metadata"]["name"], grace, policy)
                if gone is not None:
                    deleted.append(gone)
        return web.json_response({"kind": f"{kind}List", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self.store.rv)},
                                  "items": deleted})

    def delete(self, kind: str, ns: str, name: str, grace: int | None,
               policy: str = "Background") -> Obj | None:
        """Delete by the upstream rules: a Pod that is unscheduled, terminated, or deleted with
        grace 0 goes at once; a running one gets a deletionTimestamp and the kubelet finishes it."""
        obj = self.store.peek(kind, ns, name)
        if obj is None:
            return None
        self.deletions.append((asyncio.get_running_loop().time(), kind, name, grace))
        if kind != "Pod" or policy == "Orphan":
            uid = obj["metadata"]["uid"]
            if policy == "Orphan":  # dependents lose this owner instead of being collected
                for dep in list(self.store.dependents.get(uid, ())):
                    dependent = self.store.get(*dep)
                    if dependent is not None:
                        dependent["metadata"]["ownerReferences"] = [
                            r for r in dependent["metadata"]["ownerReferences"]
                            if r.get("uid") != uid] or None
                        self.store.put(dep[0], dependent)
            if kind != "Pod":
                return self.store.remove(kind, ns, name)
        spec, status = obj["spec"], obj.get("status", {})
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", 30))
        if grace == 0 or not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return self.store.remove(kind, ns, name)
        current = obj["metadata"].get("deletionGracePeriodSeconds")
        if current is None or grace < current:
            obj = {**obj, "metadata": {**obj["metadata"], "deletionTimestamp": now(),
                                       "deletionGracePeriodSeconds": grace}}
            self.store.put(kind, obj)
        return obj

    def _collect_garbage(self, event: Event) -> None:
        """The garbage collector: once every owner of an object is gone, it is deleted (in the
        background; Pods with their own grace period), whatever its kind. An object created
        with owners that no longer exist goes the same way."""
        ns = event.obj["metadata"].get("namespace", "")
        uid = event.obj["metadata"]["uid"]
        if event.type == "ADDED" and event.obj["metadata"].get("ownerReferences"):
            key = (event.kind, ns, event.obj["metadata"]["name"])

            def orphan() -> None:
                obj = self.store.peek(*key)
                refs = (obj or {}).get("metadata", {}).get("ownerReferences") or []
                if obj is not None and refs and not any(self._exists(ns, r) for r in refs):
                    self.delete(key[0], ns, key[2], None)

            asyncio.get_running_loop().call_soon(orphan)
            return
        if event.type != "DELETED":
            return

        def sweep() -> None:
            for kind, dep_ns, name in list(self.store.dependents.get(uid, ())):
                obj = self.store.peek(kind, dep_ns, name)
                refs = (obj or {}).get("metadata", {}).get("ownerReferences") or []
                if obj is not None and not any(self._exists(ns, ref) for ref in refs):
                    self.delete(kind, dep_ns, name, None)

        asyncio.get_running_loop().call_soon(sweep)

    def _exists(self, ns: str, ref: Obj) -> bool:
        owner = self.store.peek(ref.get("kind", ""), ns, ref.get("name", ""))
        return owner is not None and owner["metadata"]["uid"] == ref.get("uid")


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what strategic merge does for the fields patched here)."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value)
    return target
