"""The stand-in itself, driven by the real client: the fidelity the executor relies on.

Each check here is a behaviour of the real API server or kubelet that a client depends on
(and that an earlier fake got wrong somewhere): Go booleans, `/version/`, schema-complete
status objects, 410 on a too-old watch, the graceful-deletion rules, log 400 while waiting.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("kubernetes_asyncio", reason="pip install 'openforge[kubernetes]'")

from kubernetes_asyncio import client, config, watch  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

from k8s_standin import StandIn, standin_processes  # noqa: E402
from k8s_standin.selectors import SelectorError, parse_field_selector, parse_label_selector  # noqa: E402


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    with StandIn() as k8s:
        yield k8s


@pytest.fixture
async def core(standin: StandIn) -> AsyncIterator[client.CoreV1Api]:
    api_client = await config.new_client_from_config(config_file=str(standin.kubeconfig))
    yield client.CoreV1Api(api_client)
    await api_client.close()


def pod(name: str, script: str = "import time; time.sleep(60)", image: str = "python:3",
        **spec: Any) -> client.V1Pod:
    container = client.V1Container(
        name="main", image=image, command=[sys.executable, "-c", script],
        env=[client.V1EnvVar(name="ME", value_from=client.V1EnvVarSource(
            field_ref=client.V1ObjectFieldSelector(field_path="metadata.name")))],
        termination_message_policy="FallbackToLogsOnError")
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels={"suite": "standin"}),
                        spec=client.V1PodSpec(containers=[container], restart_policy="Never",
                                              termination_grace_period_seconds=1, **spec))


async def until(core: client.CoreV1Api, name: str, check: Any, timeout: float = 20) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = await core.read_namespaced_pod(name, "default")  # typed: must deserialize
        if check(p):
            return p
        await asyncio.sleep(0.05)
    raise AssertionError(f"pod {name} never reached the state")


async def gone(core: client.CoreV1Api, name: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            await core.read_namespaced_pod(name, "default")
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        await asyncio.sleep(0.05)
    raise AssertionError(f"pod {name} still exists")


def test_selectors() -> None:
    match = parse_label_selector("a=1,b!=2,c in (x, y),d notin (z),e,!f")
    assert match({"a": "1", "c": "x", "e": ""})
    assert not match({"a": "1", "b": "2", "c": "x", "e": ""})
    assert not match({"a": "1", "c": "x", "e": "", "f": "1"})
    assert not match({"a": "1", "c": "q", "e": ""})
    assert parse_field_selector("metadata.name=p,status.phase!=Failed")(
        {"metadata": {"name": "p"}, "status": {"phase": "Running"}})
    with pytest.raises(SelectorError):
        parse_field_selector("spec.bogus=1")
    with pytest.raises(SelectorError):
        parse_label_selector("a in x")


def test_http_fidelity(standin: StandIn) -> None:
    auth = {"Authorization": f"Bearer {standin.token}"}
    with httpx.Client(base_url=standin.url, headers=auth) as http:
        assert http.get("/version/").json()["major"] == "1"
        assert http.get("/api/v1").json()["kind"] == "APIResourceList"
        for flag in ("1", "t", "True", "TRUE"):
            r = http.get("/api/v1/namespaces/default/pods",
                         params={"watch": flag, "timeoutSeconds": "1"})
            assert r.status_code == 200
        r = http.get("/api/v1/namespaces/default/pods", params={"watch": "yes"})
        assert r.status_code == 400 and r.json()["kind"] == "Status"
    assert httpx.get(standin.url + "/version").status_code == 401


async def test_lifecycle_env_termination_message_and_logs(core: client.CoreV1Api) -> None:
    script = ("import os; print('hello'); open(os.environ['MSG'], 'w').write('bye ' + "
              "os.environ['ME'])")
    body = pod("life", script)
    body.spec.containers[0].env.append(client.V1EnvVar(name="MSG", value="/dev/termination-log"))
    created = await core.create_namespaced_pod("default", body)
    assert created.status.phase == "Pending" and created.metadata.uid
    done = await until(core, "life", lambda p: p.status.phase == "Succeeded")
    terminated = done.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 0 and terminated.message == "bye life"
    assert (await core.read_namespaced_pod_log("life", "default", tail_lines=5)).strip() == "hello"
    await core.delete_namespaced_pod("life", "default")  # terminated: goes at once
    await gone(core, "life", timeout=1)


async def test_admission_errors(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as bad:
        await core.create_namespaced_pod("default", pod("Bad_Name"))
    assert bad.value.status == 422
    await core.create_namespaced_pod("default", pod("dry"), dry_run="All")
    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_pod("dry", "default")
    assert missing.value.status == 404
    await core.create_namespaced_pod("default", pod("twice", image="x/does-not-exist:1"))
    with pytest.raises(ApiException) as dup:
        await core.create_namespaced_pod("default", pod("twice"))
    assert dup.value.status == 409
    waiting = await until(core, "twice", lambda p: p.status.container_statuses and
                          p.status.container_statuses[0].state.waiting.reason == "ImagePullBackOff")
    assert waiting.status.phase == "Pending"
    with pytest.raises(ApiException) as log:
        await core.read_namespaced_pod_log("twice", "default")
    assert log.value.status == 400 and "waiting to start" in log.value.body
    await core.delete_namespaced_pod("twice", "default", grace_period_seconds=0)


async def test_graceful_and_forced_deletion_kill_the_process(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("graceful"))
    await core.create_namespaced_pod("default", pod("forced"))
    for name in ("graceful", "forced"):
        await until(core, name, lambda p: p.status.phase == "Running")
    assert len(standin_processes()) >= 2
    deleting = await core.delete_namespaced_pod("graceful", "default")
    assert deleting.metadata.deletion_timestamp is not None  # running: the kubelet finishes it
    await core.delete_namespaced_pod("forced", "default", grace_period_seconds=0)
    await gone(core, "forced", timeout=0.5)  # grace 0: the object goes at once
    await gone(core, "graceful")
    deadline = time.monotonic() + 10
    while standin_processes() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert standin_processes() == []


async def test_unschedulable_then_deleted_at_once(core: client.CoreV1Api) -> None:
    body = pod("huge")
    body.spec.containers[0].resources = client.V1ResourceRequirements(requests={"cpu": "5000"})
    await core.create_namespaced_pod("default", body)
    p = await until(core, "huge", lambda p: bool(p.status.conditions))
    assert p.status.conditions[0].reason == "Unschedulable"
    await core.delete_namespaced_pod("huge", "default")  # not scheduled: no grace needed
    await gone(core, "huge", timeout=0.5)


async def test_watch_replays_from_a_version_and_410s_when_too_old(
        standin: StandIn, core: client.CoreV1Api) -> None:
    listed = await core.list_namespaced_pod("default", label_selector="suite=standin")
    rv = listed.metadata.resource_version
    await core.create_namespaced_pod("default", pod("watched", "print('x')"))
    seen = []
    async with watch.Watch().stream(core.list_namespaced_pod, "default",
                                    label_selector="suite=standin", resource_version=rv,
                                    timeout_seconds=5) as stream:
        async for event in stream:
            seen.append((event["type"], event["object"].status.phase))
            if event["object"].status.phase == "Succeeded":
                break
    assert seen[0] == ("ADDED", "Pending") and seen[-1][1] == "Succeeded"
    standin.compact()
    with pytest.raises(ApiException) as expired:
        async with watch.Watch().stream(core.list_namespaced_pod, "default",
                                        resource_version=rv, timeout_seconds=2) as stream:
            async for _ in stream:
                pass
    assert expired.value.status == 410
    await core.delete_collection_namespaced_pod("default", label_selector="suite=standin",
                                                grace_period_seconds=0)
    assert (await core.list_namespaced_pod("default", label_selector="suite=standin")).items == []
