"""Reward integrity on Kubernetes: the agent's container cannot write the result the
executor reads, nor hold a credential that can, nor outlive its container.

The policy is an adversary (`k8s_standin.plugins.AttackHarness`): in the agent's container
it forges a result on its stdout and in every termination log it can name (a violation,
scored 0, that says where), looks for the
trusted side's volume, the spec (with the task's data), the host's HOME, the supervisor's
and verifier's processes and their environment, tries to kill them, and leaves a setsid'd
orphan without the marker variable. The stand-in runs each container in PID and mount
namespaces of its own (as a container runtime does), which needs root: CI runs as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kubernetes_asyncio", reason="pip install 'openforge[kubernetes]'")

from k8s_standin import Image, StandIn, standin_processes  # noqa: E402

from openforge.config import EngineConfig, GatewayConfig  # noqa: E402
from openforge.executors.k8s_api import KubeApi  # noqa: E402
from openforge.executors.k8s_pods import pod_name, run_selector  # noqa: E402
from openforge.executors.kubernetes import KubernetesExecutor  # noqa: E402
from openforge.gateway.server import Gateway  # noqa: E402
from openforge.store import Store  # noqa: E402
from openforge.types import RolloutResult, RolloutSpec, Task  # noqa: E402

TESTS_DIR = Path(__file__).parent
IMAGE = "openforge/rollout:test"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    tini = Image(entrypoint=[sys.executable, "-m", "k8s_standin.tini", "--"])
    # A folder of the image (its PYTHONPATH): an installed package's files.
    image_data = tmp_path_factory.mktemp("k8s-image")
    with StandIn(image_env={"PYTHONPATH": f"{TESTS_DIR}:{image_data}"},
                 images={IMAGE: tini}) as k8s:
        k8s.image_data = image_data  # type: ignore[attr-defined]
        if not k8s.isolated:
            pytest.skip("containers run in their own PID and mount namespaces only as root "
                        "with unshare and setpriv (util-linux): CI runs as root")
        yield k8s


@pytest.fixture
async def kube(standin: StandIn) -> AsyncIterator[KubeApi]:
    api = await KubeApi.connect(Path(standin.kubeconfig), None, "default")
    yield api
    await api.close()


def _executor(standin: StandIn, **options: str) -> KubernetesExecutor:
    return KubernetesExecutor(image=IMAGE, kubeconfig=str(standin.kubeconfig),
                              python=sys.executable, requests={"cpu": "100m"}, backoff_s=0.05,
                              termination_grace_s=1, force_delete_after_s=2, **options)


async def _run(standin: StandIn, spec: RolloutSpec,
               during: Callable[[RolloutSpec], Awaitable[None]] | None = None,
               **options: str) -> RolloutResult:
    """One attempt through a fresh executor (`options` are its own); `during` runs while the
    attempt does (what happens to its Pod from outside)."""
    executor = _executor(standin, **options)
    try:
        attempt = asyncio.create_task(executor.run(spec))
        if during is not None:
            await during(spec)
        return await attempt
    finally:
        await executor.close()


def _spec(run_id: str, harness: str, env: str, **options: str) -> RolloutSpec:
    rollout_id = f"only.0.0.{uuid.uuid4().hex[:6]}"
    options = {k: v.replace("{rollout}", rollout_id) for k, v in options.items()}
    return RolloutSpec(run_id=run_id, rollout_id=rollout_id, task=Task(id="only", prompt="p"),
                       harness=harness, harness_options=options, environment=env,
                       reward="checker", gateway_url="http://127.0.0.1:9",
                       session_token=f"tok-{uuid.uuid4().hex}", timeout_s=60)


async def _clean(kube: KubeApi, run_id: str) -> None:
    for _ in range(150):
        pods, _ = await kube.list_pods(run_selector(run_id))
        if not pods and not standin_processes():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"left: {len(pods)} Pods, processes {standin_processes()}")


async def test_the_agent_cannot_forge_read_or_outlive_its_container(
        standin: StandIn, kube: KubeApi) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    canary = Path.home() / f".openforge-k8s-canary-{uuid.uuid4().hex}"
    canary.write_text("the orchestrator's secret")
    spec = _spec(run_id, "k8s_standin.plugins:AttackHarness", "k8s_standin.plugins:AttackEnv",
                 rollout="{rollout}", canary=str(canary))
    try:
        result = await _run(standin, spec)
    finally:
        canary.unlink()
    # The verdict, from the verifier: neither forged line was taken as a result, and writing
    # them is a violation, scored 0, saying where each was (the supervisor found the one on
    # the harness's stdout, the executor the one in the agent's own termination message).
    assert result.status == "violation", result.error
    assert result.reward is not None and not result.reward.passed
    assert result.reward.score == 0.0
    error = result.error or ""
    assert error.startswith("violation: forged result line in the agent container's "
                            "termination message: OPENFORGE_RESULT ")
    assert "forged result line in the agent's output (harness.stdout)" in error
    found = json.loads(result.final_answer or "{}")  # what the attack found, as its answer
    assert found["orphan"]  # the attack did run
    assert found["forged_files"] == ["/dev/termination-log"]  # its own: nobody reads it
    assert found["spec"] is None  # the Secret is the supervisor's alone
    assert found["canary"] is None  # no host HOME in a container
    assert found["trusted_dir"] is False  # the supervisor/verifier volume is not there
    assert found["trusted_processes_seen"] == [] and found["killed"] == []
    await _clean(kube, run_id)  # the orphan died with the agent's container


async def test_the_agent_cannot_kill_its_launcher(standin: StandIn, kube: KubeApi) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    # The harness writes the file that would pass, then SIGKILLs the process that runs it:
    # its container's first process, which no process inside can kill. The harness then
    # ends on its own, and the attempt is scored on what it left.
    spec = _spec(run_id, "executor_plugins:KillParentHarness", "executor_plugins:OneTaskEnv")
    result = await _run(standin, spec)
    assert result.status == "ok", result.error
    assert result.reward is not None and result.reward.passed
    await _clean(kube, run_id)


# -- hidden folders: an answer key the environment ships in the image -------------------------


def _hidden_spec(standin: StandIn, run_id: str, **options: object) -> tuple[RolloutSpec, Path]:
    """An attempt whose agent copies the environment's answer key if it can see it (the
    checker passes it then), and says what it saw of the key's folder."""
    answers = standin.image_data / f"answers-{uuid.uuid4().hex[:8]}"  # type: ignore[attr-defined]
    answers.mkdir()
    (answers / "answer.txt").write_text("42\n")
    prompt = (f"cp {answers}/answer.txt answer.txt 2>/dev/null; touch {answers}/mine 2>/dev/null;"
              f" echo \"seen:[$(ls -A {answers})]\"")
    spec = _spec(run_id, "executor_plugins:ShellHarness", "executor_plugins:HiddenAnswersEnv")
    return spec.model_copy(update={"task": Task(id="only", prompt=prompt),
                                   "environment_options": {"answers": str(answers),
                                                           **options}}), answers


async def test_the_environments_hidden_folders_are_empty_in_the_agents_container(
        standin: StandIn, kube: KubeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    import executor_plugins

    # Where the executor lists them: off the event loop that watches every Pod (building the
    # environment may load a whole benchmark).
    on_loop: list[bool] = []
    listed = executor_plugins.HiddenAnswersEnv.hidden_paths

    def hidden_paths(env: executor_plugins.HiddenAnswersEnv, task: Task) -> list[Path]:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return listed(env, task)

    monkeypatch.setattr(executor_plugins.HiddenAnswersEnv, "hidden_paths", hidden_paths)
    run_id = "i-" + uuid.uuid4().hex[:8]
    spec, answers = _hidden_spec(standin, run_id)
    result = await _run(standin, spec)
    assert on_loop == [False]
    assert result.status == "ok", result.error
    assert result.final_answer == "seen:[]"  # an empty folder, read-only, where the key is
    assert result.reward is not None and not result.reward.passed  # it could not copy it
    assert result.reward.details["key_read"]  # the supervisor's checker read it
    assert sorted(p.name for p in answers.iterdir()) == ["answer.txt"]
    await _clean(kube, run_id)


async def test_an_image_that_would_show_a_hidden_folder_runs_no_agent(
        standin: StandIn, kube: KubeApi) -> None:
    # The runner finds no hidden folder where the Pod's supervisor, in the image, finds one:
    # the image installs the environment elsewhere. The supervisor refuses to start the agent.
    run_id = "i-" + uuid.uuid4().hex[:8]
    spec, answers = _hidden_spec(standin, run_id, only_in_pod=True)
    result = await _run(standin, spec)
    assert result.status == "infra_error" and result.reward is None, result.error
    assert f"the agent's container would show the environment's hidden folder(s) {answers}" \
        in (result.error or "")
    await _clean(kube, run_id)


# -- whose end: what the agent does to its own container is scored, never retried -------------

# What a tool call of the agent runs (after it wrote the file that passes), and what the
# attempt ends as. Each one ended the agent container by a signal before its launcher ran
# as the container's first process: the Pod failed, an `infra_error` (retried, never scored).
ENDINGS = [
    # Every process it may signal: the harness and, under the image's init, the launcher.
    pytest.param("kill -9 -1", "harness_error", id="kill-all"),
    # The container's first process (forwarded by the image's init to the launcher, which
    # then ends the harness; the agent waits for that, or its next call may finish first).
    pytest.param("kill -TERM 1; sleep 60", "harness_error", id="term-pid-1"),
    # The harness's parent, the launcher: ignored, as the container's first process.
    pytest.param("kill -9 $(cut -d' ' -f4 /proc/$PPID/stat)", "ok", id="kill-launcher"),
    pytest.param("kill -STOP $(cut -d' ' -f4 /proc/$PPID/stat)", "ok", id="stop-launcher"),
]


@contextlib.asynccontextmanager
async def _gateway(tmp_path: Path, command: str) -> AsyncIterator[Gateway]:
    """A gateway whose scripted model has the agent write ok.txt (the task) and then run
    `command` in the same tool call, then says it is done; the Pods reach it on 127.0.0.1."""
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump([{"replies": [
        {"tool_calls": [{"name": "shell",
                         "arguments": {"command": f"echo ok > ok.txt; {command}"}}]},
        {"content": "Done: ok.txt"}]}]))
    store = Store(tmp_path / "store.sqlite")
    gw = Gateway(GatewayConfig(), EngineConfig(name="scripted", options={"script": str(script)}),
                 store)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()
        store.close()


def _mini_spec(gateway: Gateway, run_id: str, harness: str = "mini") -> RolloutSpec:
    """An attempt of the mini harness (or `harness`) in a session of `gateway`, with the
    scoring credential the trusted side reads the session's calls with."""
    rollout_id = f"only.0.0.{uuid.uuid4().hex[:6]}"
    session = gateway.open_session(run_id, rollout_id, "only")
    return RolloutSpec(run_id=run_id, rollout_id=rollout_id,
                       task=Task(id="only", prompt="write ok.txt"), harness=harness,
                       harness_options={"max_steps": 3} if harness == "mini" else {},
                       environment="executor_plugins:OneTaskEnv", reward="checker",
                       gateway_url=gateway.url, session_token=session.token,
                       session_id=session.id, scoring_token=session.scoring_token, timeout_s=60)


@pytest.mark.parametrize("command, status", ENDINGS)
async def test_what_the_agent_does_to_its_container_is_scored(
        standin: StandIn, kube: KubeApi, tmp_path: Path, command: str, status: str) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    async with _gateway(tmp_path, command) as gateway:
        result = await _run(standin, _mini_spec(gateway, run_id))
    # Scored on its final state (the file it wrote passes), whatever it ended.
    assert result.status == status, result.error
    assert not result.is_retried
    assert result.reward is not None and result.reward.passed
    if status == "harness_error":  # the harness was ended after the model's first answer
        assert "the harness crashed after the model answered" in (result.error or "")
    await _clean(kube, run_id)


async def test_an_agent_that_stalls_until_its_time_is_up_is_scored(
        standin: StandIn, kube: KubeApi, tmp_path: Path) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    async with _gateway(tmp_path, "sleep 600") as gateway:
        spec = _mini_spec(gateway, run_id).model_copy(update={"timeout_s": 15})
        result = await _run(standin, spec)
    # The launcher ends the harness at its deadline; the supervisor scores what it left.
    assert result.status == "harness_error" and not result.is_retried, result.error
    assert result.reward is not None and result.reward.passed
    assert "ran out of time after the model answered 1 call(s)" in (result.error or "")
    await _clean(kube, run_id)


async def _agent_running(kube: KubeApi, run_id: str) -> None:
    for _ in range(600):
        pods, _ = await kube.list_pods(run_selector(run_id))
        states = [s.get("state") or {} for p in pods
                  for s in (p.get("status") or {}).get("initContainerStatuses") or []
                  if s.get("name") == "agent"]
        if any("running" in state for state in states):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the agent container never ran")


async def test_an_agent_container_oom_killed_after_the_model_answered_counts_as_0(
        standin: StandIn, kube: KubeApi, tmp_path: Path) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    async with _gateway(tmp_path, "sleep 50") as gateway:
        async def answered_then_oom(spec: RolloutSpec) -> None:
            # The agent used all its memory once the model had answered: the OOM killer
            # ends its whole container (cgroup v2's memory.oom.group), and the Pod fails.
            while gateway.store.first_call(spec.session_id) is None:
                await asyncio.sleep(0.1)
            standin.oom(pod_name(spec), "agent")

        result = await _run(standin, _mini_spec(gateway, run_id), answered_then_oom)
    # The agent's own end: not retried; its final state went with the Pod (the file it
    # wrote would pass): 0, labelled.
    assert result.status == "harness_error" and not result.is_retried, result.error
    assert result.reward is not None and result.reward.score == 0.0
    assert result.reward.details["unscored"].startswith("the Pod failed with the agent's")
    error = result.error or ""
    assert "the agent container was killed (exit code 137, OOMKilled)" in error
    assert "crashed after the model answered 1 call(s)" in error
    await _clean(kube, run_id)


async def test_an_agent_container_oom_killed_before_the_model_answered_is_infra(
        standin: StandIn, kube: KubeApi, tmp_path: Path) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    async with _gateway(tmp_path, "true") as gateway:
        async def running_then_oom(spec: RolloutSpec) -> None:
            await _agent_running(kube, run_id)
            standin.oom(pod_name(spec), "agent")

        # A harness that never calls the model: nothing the policy decided ran.
        spec = _mini_spec(gateway, run_id, harness="executor_plugins:HangHarness")
        result = await _run(standin, spec, running_then_oom)
    assert result.status == "infra_error" and result.is_retried, result.error
    assert result.reward is None
    assert "the agent container was killed (exit code 137, OOMKilled)" in (result.error or "")
    await _clean(kube, run_id)


# -- filling the disk: the agent's volumes have a size limit, and going past it is its doing ---

# Past the workspace's limit (1 MiB here): 2 MiB of real blocks, then wait to be evicted.
FILL = "head -c 2097152 /dev/zero > fill; sleep 50"
OVER_LIMIT = 'Evicted: Usage of EmptyDir volume "workspace" exceeds the limit "1Mi".'


async def test_an_agent_that_fills_its_workspace_after_the_model_answered_counts_as_0(
        standin: StandIn, kube: KubeApi, tmp_path: Path) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    # The model's answer has the agent write the file that passes, then fill the workspace:
    # the kubelet evicts the Pod (only it), which was an infra_error, retried.
    async with _gateway(tmp_path, FILL) as gateway:
        result = await _run(standin, _mini_spec(gateway, run_id), workspace_size_limit="1Mi")
    # Judged as an OOM kill of its container is: its own end, not retried, 0 (unscored).
    assert result.status == "harness_error" and not result.is_retried, result.error
    assert result.reward is not None and result.reward.score == 0.0
    assert not result.reward.passed
    assert result.reward.details["unscored"].startswith("the Pod failed with the agent's")
    error = result.error or ""
    assert OVER_LIMIT in error and "crashed after the model answered 1 call(s)" in error
    await _clean(kube, run_id)


async def test_an_agent_that_fills_its_workspace_before_the_model_answered_is_infra(
        standin: StandIn, kube: KubeApi, tmp_path: Path) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    async with _gateway(tmp_path, "true") as gateway:
        # A harness that fills the workspace itself and never calls the model: nothing the
        # policy decided ran, so the infrastructure's (a harness, a task, too big for it).
        spec = _mini_spec(gateway, run_id, harness="executor_plugins:ShellHarness")
        spec = spec.model_copy(update={"task": Task(id="only", prompt=FILL)})
        result = await _run(standin, spec, workspace_size_limit="1Mi")
    assert result.status == "infra_error" and result.is_retried, result.error
    assert result.reward is None
    assert OVER_LIMIT in (result.error or "")
    await _clean(kube, run_id)
