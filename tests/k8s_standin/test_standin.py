"""The stand-in itself, driven by the real client: the fidelity the executor relies on.

Each check here is a behaviour of the real API server or kubelet that a client depends on
(and that an earlier fake got wrong somewhere): Go booleans, `/version/`, schema-complete
status objects, 410 on a too-old watch, the graceful-deletion rules, log 400 while waiting.
Waits are hang guards; "at once" means at the first look, never within a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psutil
import pytest

pytest.importorskip("kubernetes_asyncio", reason="pip install 'openforge[kubernetes]'")

from kubernetes_asyncio import client, config, watch  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

from k8s_standin import StandIn, standin_processes  # noqa: E402
from k8s_standin.selectors import SelectorError, parse_field_selector, parse_label_selector  # noqa: E402

HANG_GUARD_S = 120  # how long a wait may take before the test calls it a hang: never a bound


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


async def until(core: client.CoreV1Api, name: str, check: Any) -> client.V1Pod:
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        p = await core.read_namespaced_pod(name, "default")  # typed: must deserialize
        if check(p):
            return p
        await asyncio.sleep(0.05)
    raise AssertionError(f"pod {name} never reached the state")


async def gone(core: client.CoreV1Api, name: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        try:
            await core.read_namespaced_pod(name, "default")
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        await asyncio.sleep(0.05)
    raise AssertionError(f"pod {name} still exists")


async def gone_at_once(core: client.CoreV1Api, name: str) -> None:
    """The Pod is gone at the first look after its delete (the API server removed it, no
    kubelet involved)."""
    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_pod(name, "default")
    assert missing.value.status == 404


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
    await gone_at_once(core, "life")


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
    await gone_at_once(core, "forced")  # grace 0: the object goes at once
    await gone(core, "graceful")
    deadline = time.monotonic() + HANG_GUARD_S
    while standin_processes() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    left = standin_processes()
    assert left == [], [p.cmdline() for p in left]


async def test_a_shortened_active_deadline_ends_a_running_pod(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("deadline", active_deadline_seconds=600))
    await until(core, "deadline", lambda p: p.status.phase == "Running")
    # activeDeadlineSeconds may be lowered on a live Pod; it counts from the Pod's start.
    await core.patch_namespaced_pod("deadline", "default", {"spec": {"activeDeadlineSeconds": 1}})
    ended = await until(core, "deadline", lambda p: p.status.phase == "Failed")
    assert ended.status.reason == "DeadlineExceeded"
    await core.delete_namespaced_pod("deadline", "default")
    await gone(core, "deadline")


async def test_unschedulable_then_deleted_at_once(core: client.CoreV1Api) -> None:
    body = pod("huge")
    body.spec.containers[0].resources = client.V1ResourceRequirements(requests={"cpu": "5000"})
    await core.create_namespaced_pod("default", body)
    p = await until(core, "huge", lambda p: bool(p.status.conditions))
    assert p.status.conditions[0].reason == "Unschedulable"
    await core.delete_namespaced_pod("huge", "default")  # not scheduled: no grace needed
    await gone_at_once(core, "huge")


async def test_watch_replays_from_a_version_and_410s_when_too_old(
        standin: StandIn, core: client.CoreV1Api) -> None:
    listed = await core.list_namespaced_pod("default", label_selector="suite=standin")
    rv = listed.metadata.resource_version
    await core.create_namespaced_pod("default", pod("watched", "print('x')"))
    seen = []
    async with watch.Watch().stream(core.list_namespaced_pod, "default",
                                    label_selector="suite=standin", resource_version=rv,
                                    timeout_seconds=HANG_GUARD_S) as stream:
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


def _ordered_pod(name: str, entrypoint_image: str = "python:3") -> client.V1Pod:
    """A sidecar that becomes ready after writing a file, an init container that records it
    saw the sidecar's volume, and a main container; each writes its own termination message."""
    def box(cname: str, script: str, mounts: list[str], **kw: Any) -> client.V1Container:
        return client.V1Container(
            name=cname, image=entrypoint_image, args=[sys.executable, "-c", script],
            env=[client.V1EnvVar(name="SHARED", value="/shared"),
                 client.V1EnvVar(name="PRIVATE", value="/private"),
                 client.V1EnvVar(name="MSG", value="/dev/termination-log")],
            volume_mounts=[client.V1VolumeMount(name=m, mount_path=f"/{m}") for m in mounts], **kw)

    sidecar = box("side", "import os, time; open(os.environ['PRIVATE'] + '/p', 'w').write('p'); "
                  "open(os.environ['SHARED'] + '/ready', 'w').write('x'); time.sleep(600)",
                  ["shared", "private"], restart_policy="Always",
                  startup_probe=client.V1Probe(
                      _exec=client.V1ExecAction(command=["test", "-e", "/shared/ready"]),
                      period_seconds=1, failure_threshold=30))
    init = box("init", "import os; seen = os.path.exists(os.environ['SHARED'] + '/ready'); "
               "private = os.path.exists(os.environ['PRIVATE'] + '/p'); "
               "open(os.environ['MSG'], 'w').write(f'init saw ready={seen} private={private}')",
               ["shared"])
    main = box("main", "import os; open(os.environ['MSG'], 'w').write('main ' + "
               "os.environ.get('FROM_ENTRYPOINT', '-'))", ["shared"])
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"suite": "standin"}),
        spec=client.V1PodSpec(restart_policy="Never", init_containers=[sidecar, init],
                              containers=[main], termination_grace_period_seconds=1,
                              volumes=[client.V1Volume(name="shared",
                                                       empty_dir=client.V1EmptyDirVolumeSource()),
                                       client.V1Volume(name="private",
                                                       empty_dir=client.V1EmptyDirVolumeSource())]))


async def test_init_order_sidecar_probe_volumes_and_termination_messages(
        standin: StandIn, core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", _ordered_pod("ordered"))
    done = await until(core, "ordered", lambda p: p.status.phase in ("Succeeded", "Failed"))
    assert done.status.phase == "Succeeded"
    init = {s.name: s for s in done.status.init_container_statuses}
    # The init container started after the sidecar's probe passed; it shares only the
    # volume it mounts (the sidecar's private one is not there for it).
    msg = init["init"].state.terminated.message
    assert msg == "init saw ready=True private=False" if standin.isolated else \
        msg.startswith("init saw ready=True")
    assert done.status.container_statuses[0].state.terminated.message == "main -"
    # The sidecar was stopped once the main container ended; its own message is empty.
    assert init["side"].state.terminated is not None
    await core.delete_namespaced_pod("ordered", "default")
    await gone(core, "ordered")


async def test_an_empty_dir_past_its_size_limit_evicts_the_pod(core: client.CoreV1Api) -> None:
    # As the kubelet's eviction manager does (pkg/kubelet/eviction): a volume that uses more
    # than its sizeLimit evicts its Pod, at once, with the kubelet's own message; another
    # volume within its limit is not named.
    script = ("import os, time; open(os.environ['ROOMY'] + '/f', 'wb').write(b'x' * 2**19); "
              "open(os.environ['SMALL'] + '/f', 'wb').write(b'x' * 2**21); time.sleep(600)")
    body = pod("filled", script, volumes=[
        client.V1Volume(name="roomy", empty_dir=client.V1EmptyDirVolumeSource(size_limit="8Mi")),
        client.V1Volume(name="small", empty_dir=client.V1EmptyDirVolumeSource(size_limit="1Mi"))])
    main = body.spec.containers[0]
    main.env += [client.V1EnvVar(name="ROOMY", value="/roomy"),
                 client.V1EnvVar(name="SMALL", value="/small")]
    main.volume_mounts = [client.V1VolumeMount(name=n, mount_path=f"/{n}")
                          for n in ("roomy", "small")]
    await core.create_namespaced_pod("default", body)
    evicted = await until(core, "filled", lambda p: p.status.phase == "Failed")
    assert evicted.status.reason == "Evicted"
    assert evicted.status.message == 'Usage of EmptyDir volume "small" exceeds the limit "1Mi". '
    # Not a node-pressure eviction: no DisruptionTarget condition.
    assert not [c for c in evicted.status.conditions if c.type == "DisruptionTarget"]
    assert evicted.status.container_statuses[0].state.terminated.exit_code == 137
    await core.delete_namespaced_pod("filled", "default")
    await gone(core, "filled")


async def test_a_secret_owned_pod_waits_for_its_secret_and_goes_with_it(
        core: client.CoreV1Api) -> None:
    script = "import os; open(os.environ['MSG'], 'w').write(open('/s/token').read())"
    body = pod("mounted", script)
    body.spec.containers[0].env.append(client.V1EnvVar(name="MSG", value="/dev/termination-log"))
    body.spec.containers[0].volume_mounts = [client.V1VolumeMount(name="s", mount_path="/s")]
    body.spec.containers[0].command = [sys.executable, "-c", script.replace(
        "'/s/token'", "os.environ['TOKEN_FILE']")]
    body.spec.containers[0].env.append(client.V1EnvVar(name="TOKEN_FILE", value="/s/token"))
    body.spec.volumes = [client.V1Volume(name="s", secret=client.V1SecretVolumeSource(
        secret_name="mounted", items=[client.V1KeyToPath(key="t", path="token")]))]
    await core.create_namespaced_pod("default", body)
    await asyncio.sleep(0.5)
    waiting = await core.read_namespaced_pod("mounted", "default")
    assert waiting.status.phase == "Pending"  # the Secret is not there yet
    secret = await core.create_namespaced_secret("default", client.V1Secret(
        metadata=client.V1ObjectMeta(name="mounted"), string_data={"t": "s3cret"}))
    done = await until(core, "mounted", lambda p: p.status.phase == "Succeeded")
    assert done.status.container_statuses[0].state.terminated.message == "s3cret"
    # Owned by the Secret: deleting the Secret deletes the Pod (the garbage collector).
    await core.patch_namespaced_pod("mounted", "default", {"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "Secret", "name": "mounted", "uid": secret.metadata.uid}]}})
    await core.delete_namespaced_secret("mounted", "default")
    await gone(core, "mounted")


async def test_image_entrypoint_runs_unless_command_replaces_it(
        entrypoint_standin: StandIn) -> None:
    api_client = await config.new_client_from_config(
        config_file=str(entrypoint_standin.kubeconfig))
    core = client.CoreV1Api(api_client)

    async def message(name: str, **kw: Any) -> str:
        container = client.V1Container(name="main", image="entry:1", **kw)
        await core.create_namespaced_pod("default", client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"suite": "standin"}),
            spec=client.V1PodSpec(containers=[container], restart_policy="Never")))
        done = await until(core, name, lambda p: p.status.phase in ("Succeeded", "Failed"))
        await core.delete_namespaced_pod(name, "default")
        return str(done.status.container_statuses[0].state.terminated.exit_code)

    try:
        # The image's ENTRYPOINT is `sh -c 'exit 7' --`: `args` run under it, `command`
        # replaces it.
        assert await message("with-args", args=["ignored"]) == "7"
        assert await message("with-command", command=["sh", "-c", "exit 3"]) == "3"
    finally:
        await api_client.close()


@pytest.fixture(scope="module")
def entrypoint_standin() -> Iterator[StandIn]:
    from k8s_standin import Image

    with StandIn(images={"entry:1": Image(entrypoint=["sh", "-c", "exit 7", "--"])}) as k8s:
        yield k8s


CUT_OFF_SCRIPT = "import time; time.sleep(61)"  # its own, to find its process by


async def command_process(script: str) -> psutil.Process:
    """The stand-in process running `script` (waits for it to exist)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        for proc in standin_processes():
            with contextlib.suppress(psutil.Error):
                if script in proc.cmdline():
                    return proc
        await asyncio.sleep(0.05)
    raise AssertionError(f"no stand-in process runs {script!r}")


async def test_quota_partition_and_graceful_deletion(
        standin: StandIn, core: client.CoreV1Api) -> None:
    standin.set_pod_quota(0)
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod("default", pod("over-quota"))
    assert refused.value.status == 403 and "exceeded quota" in refused.value.body
    standin.set_pod_quota(None)
    await core.create_namespaced_pod("default", pod("cut-off", CUT_OFF_SCRIPT))
    await until(core, "cut-off", lambda p: p.status.phase == "Running")
    # The container's own command, once it runs: "Running" comes while the isolating
    # prelude may still be mounting, so a count of processes then is not a count of it.
    container = await command_process(CUT_OFF_SCRIPT)
    standin.partition("standin-node")
    try:
        node = await core.read_node("standin-node")
        assert node.status.conditions[0].status == "Unknown"
        # A graceful delete a cut-off kubelet never carries out; a forced one removes the
        # object while the container keeps running on the node.
        await core.delete_namespaced_pod("cut-off", "default")
        await asyncio.sleep(1.5)
        assert (await core.read_namespaced_pod("cut-off", "default")).metadata.deletion_timestamp
        await core.delete_namespaced_pod("cut-off", "default", grace_period_seconds=0)
        await gone_at_once(core, "cut-off")
        assert container.is_running() and container in standin_processes()
    finally:
        standin.reconnect("standin-node")  # back: it kills what was deleted meanwhile
    deadline = time.monotonic() + HANG_GUARD_S
    while standin_processes() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert standin_processes() == []
    assert (await core.read_node("standin-node")).status.conditions[0].status == "True"


def test_simulated_kubelet_runs_pods_on_a_schedule_with_no_processes() -> None:
    from k8s_standin import SimContainer

    def behaviour(pod: dict[str, Any], container: str, volumes: Any) -> SimContainer:
        return SimContainer(run_s=0.05, message=f"sim {container}")

    async def go(k8s: StandIn) -> client.V1Pod:
        api_client = await config.new_client_from_config(config_file=str(k8s.kubeconfig))
        core = client.CoreV1Api(api_client)
        try:
            await core.create_namespaced_pod("default", _ordered_pod("simulated"))
            return await until(core, "simulated", lambda p: p.status.phase == "Succeeded")
        finally:
            await api_client.close()

    with StandIn(simulate=behaviour) as k8s:
        done = asyncio.run(go(k8s))
        assert done.status.container_statuses[0].state.terminated.message == "sim main"
        assert [s.name for s in done.status.init_container_statuses] == ["side", "init"]
        assert standin_processes() == []
