"""The policy is an adversary: a scripted policy drives the stock `mini` harness to attack the
score, its neighbours and the host, in every sandbox mode and executor.

Each run is a real `openforge run` (scripted engine, recording gateway, local executor or the
Kubernetes stand-in) over `AttackEnv`'s unsolvable tasks, one per attack (tests/attack_plugins.py):

- `forge`: collect every token-shaped string from every readable /proc/*/cmdline and environ
  and from every file of the run's folders (spec.json, the store, ...), POST a passing
  result with each, print a fake `OPENFORGE_RESULT` line to stdout, to the termination-log
  paths and into its ancestors' stdout (the harness's; the supervisor's when it can open it);
- `kill`: SIGKILL the rollout supervisor (any ancestor named like it);
- `orphans`: `(setsid env -u OPENFORGE_SANDBOX_ID sleep N &)` and a double-forked,
  marker-less `sleep N+1` (N unique to this test process, so that a suite running next to
  another one on the same machine counts only its own leftovers);
- `canary`: read a canary file in the runner's HOME and look for the canary in every readable
  process environment (the runner's has it);
- `link`: answer with a symbolic link to the grader's copy of the answer (a file no view
  shows), and leave a FIFO;
- `trojan`: leave a script the checker runs while scoring, which reads the host and makes a
  model call with the agent's token;
- `neighbour`: connect to a port the test process listens on (like a neighbour rollout's
  mock services, whose state its grader reads, or any other loopback service of the host);
- `all`: forge, orphans, canary and kill in one shell call (the issue's attack);
- `tamper` then `exploit`, one at a time: rewrite the task data the reward reads (outside the
  workspace) to match a forged answer, then, in the next rollout, just give that answer;
- `victim` + `sibling`, at concurrency 2: while the victim rollout waits, the sibling looks for
  the victim's token and uses it for a model call and a forged result. They meet on the
  victim's port when the sibling can reach it, else through the test's meeting point (a
  unix socket in the task data that both sandboxes see).

For every attack and mode: 0 passes, 0 rewards above 0 in the store and in the exports, 0
processes left (none with the canary sleep durations, none adopted by the runner), and the
attempt's status says what happened: a forged result line is a `violation` naming where it
was found; a killed supervisor an `infra_error` saying so; the links and FIFOs removed
before scoring are counted in the reward's details; the other attacks end `ok`, scored 0
(what they tried got them nothing; the trojan's refused model call shows in the checker's
output, not in the status: the gateway does not count calls refused after the seal). In the isolating modes (bubblewrap, namespaces, the
agent's own container in a Pod) the canary never reaches a recorded call or an export, and no attack finds
another rollout's token; locally (bubblewrap, namespaces) no attack reaches a port of the
host's loopback other than the gateway's and its own services' (the Kubernetes stand-in runs
containers in the host's network: a real Pod has its own). docs/sandboxing.md cites these tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest
import yaml
from attack_plugins import (
    ATTACKS,
    CANARY,
    DISK_ATTACKS,
    LIMIT_ATTACKS,
    SECRET_ANSWER,
    SIBLING_ATTACKS,
    TAMPER_ATTACKS,
    TMP_ATTACKS,
    solutions,
)
from sandbox_modes import ALL_MODES, ISOLATING_MODES
from socket_servers import serve

from openforge.config import EngineConfig, RunConfig
from openforge.export import export_run
from openforge.npm import cache_root
from openforge.runner import AttemptRecord, read_results, run_from_config
from openforge.sandbox import cgroups, disk
from openforge.store import Store, secret_hash
from openforge.types import Call, RolloutResult

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NEIGHBOUR_SAYS = b"neighbour-state"


@contextlib.contextmanager
def neighbour() -> Iterator[int]:
    """A port on 127.0.0.1 that no rollout's supervisor owns (a neighbour's mock service)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)

        def answer(conn: socket.socket) -> None:
            with conn:
                conn.sendall(NEIGHBOUR_SAYS)

        serve(server, answer)
        yield int(server.getsockname()[1])
        server.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def meeting(path: Path) -> Iterator[None]:
    """Where the victim and the sibling meet when the sibling cannot reach the victim's port:
    the victim registers and waits; the sibling is told `met` once the victim is there, and
    what it sends next goes to the victim."""
    lock, victim_here = threading.Lock(), threading.Condition()
    victims: list[socket.socket] = []

    def handle(conn: socket.socket) -> None:
        role = conn.recv(16).strip()
        if role == b"victim":
            with victim_here:
                victims.append(conn)
                victim_here.notify_all()
            return
        with victim_here:
            if not victim_here.wait_for(lambda: bool(victims), timeout=25):
                conn.close()
                return
            waiting = victims[-1]
        with lock:
            conn.sendall(b"met")
            conn.settimeout(60)
            try:
                waiting.sendall(conn.recv(64))
            except OSError:
                pass
        conn.close()

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(16)
        serve(server, handle)
        try:
            yield
        finally:
            server.shutdown(socket.SHUT_RDWR)
            for conn in victims:
                conn.close()


@dataclass
class AttackRun:
    """One finished run of attacks, and what the store and the exports hold."""

    mode: str
    run_dir: Path
    data: Path
    records: dict[str, AttemptRecord]
    results: dict[str, RolloutResult] = field(default_factory=dict)  # session id -> result
    calls: dict[str, list[Call]] = field(default_factory=dict)  # task id -> every try's calls
    token_hashes: dict[str, str] = field(default_factory=dict)  # token hash -> task id
    exports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rewards: list[float | None] = field(default_factory=list)

    @property
    def isolating(self) -> bool:
        return self.mode != "none"

    def said(self, task_id: str) -> str:
        """Everything the attack's tool calls printed, as recorded in the calls' requests."""
        return "\n".join(json.dumps(c.request) for c in self.calls[task_id])

    def found_tokens(self, task_id: str) -> dict[str, str | None]:
        """Each token the attack reported finding -> the task whose session it opens (None:
        not a session token of this run)."""
        found: dict[str, str | None] = {}
        for line in self.said(task_id).replace("\\n", "\n").splitlines():
            if line.startswith("FOUND "):
                token = line.split()[1]
                found[token] = self.token_hashes.get(secret_hash(token))
        return found


def attack_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, attacks: tuple[str, ...],
               executor: str = "local", executor_options: dict[str, Any] | None = None,
               concurrency: int = 2, data: Path | None = None) -> AttackRun:
    runs, base = tmp_path / "runs", tmp_path / "sandboxes"
    data = data or tmp_path / "data"  # the task's data (on Kubernetes: part of the image)
    data.mkdir()
    (data / "expected.txt").write_text(SECRET_ANSWER)
    hidden = tmp_path / "grader" / "answer.txt"  # the grader's copy: never in any view
    hidden.parent.mkdir()
    hidden.write_text(SECRET_ANSWER)
    home = tmp_path / "home"
    home.mkdir()
    (home / "canary.txt").write_text(CANARY)
    monkeypatch.setenv("OPENFORGE_CACHE", str(cache_root()))  # the tiny model, built once
    monkeypatch.setenv("HOME", str(home))  # the runner's HOME, with a secret in it
    monkeypatch.setenv("MY_SERVICE_SECRET", CANARY)  # and one in the runner's environment
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    # What the attacker knows: where things are, and how the canary starts (not the canary
    # itself: the policy's own command must not carry it into the recorded calls).
    stack = contextlib.ExitStack()
    meet = data / "meet.sock"
    if "victim" in attacks:
        stack.enter_context(meeting(meet))
    know = {"roots": [str(runs), str(base)], "canary_prefix": CANARY[:12], "data": str(data),
            "hidden": str(hidden),
            "canary_paths": [str(home / "canary.txt")], "port": _free_port(),
            "neighbour": stack.enter_context(neighbour()), "meet": str(meet),
            "sleeps": [int(s) for s in SLEEPS], "fork_tries": FORK_TRIES, "hog_mib": HOG_MIB,
            "fill_mib": FILL_MIB, "litter_files": LITTER_FILES, "outlast_s": OUTLAST_S,
            "stuff_mib": STUFF_MIB, "spin_procs": SPIN_PROCS, "spin_s": SPIN_S}
    script = tmp_path / "attacks.yaml"
    script.write_text(yaml.safe_dump(solutions(know)))
    options = executor_options or {"sandbox": mode, "base_dir": str(base)}
    config = RunConfig(engine=EngineConfig(name="scripted", options={"script": str(script)}),
                       harness="mini", harness_options={"max_steps": 5, "max_tokens": 1024},
                       environment="attack_plugins:AttackEnv",
                       environment_options={"attacks": list(attacks), "data": str(data)},
                       reward="checker", executor=executor, executor_options=options,
                       runs_dir=runs, concurrency=concurrency, k=1, max_infra_retries=1,
                       timeout_s=180)
    with stack:
        summary = run_from_config(config)
    run = AttackRun(mode, summary.run_dir, data,
                    {r.task_id: r for r in read_results(summary.run_dir)})
    with Store(summary.run_dir / "store.sqlite") as store:
        for session in store.list_sessions():
            run.token_hashes[session.token_hash] = session.task_id
            run.rewards.append(session.reward)
            result = store.get_result(session.id)
            if result is not None:
                run.results[session.id] = result
            run.calls.setdefault(session.task_id, []).extend(store.list_calls(session.id))
    for fmt in ("samples", "verl", "sft"):
        out = export_run(summary.run_dir, fmt, tmp_path / f"export-{fmt}")
        run.exports[fmt] = pq.read_table(out).to_pylist()
    return run


# The limit attacks: forks a fork bomb tries at most, MiB a memory hog takes at most (both
# bounded, so that a missing limit fails the test instead of the machine).
FORK_TRIES, HOG_MIB = 2000, 1024
# The disk attacks: MiB written, empty files made, then seconds they stay (below mini's
# 30 s shell timeout): far past the limits the test sets, bounded all the same.
FILL_MIB, LITTER_FILES, OUTLAST_S = 64, 5000, 20
# MiB the tmpfs attack writes into /tmp and into /dev/shm, at most (past the test's limit).
STUFF_MIB = 96
# The CPU attack: busy processes, and the seconds they spin.
SPIN_PROCS, SPIN_S = 4, 2


# The orphans' `sleep` durations, unique to this test process: a suite run next to this one
# (another checkout on the machine) leaves orphans of its own that are not ours to count.
SLEEPS = [str(6013 + 2 * os.getpid()), str(6014 + 2 * os.getpid())]
ORPHANS = [["sleep", s] for s in SLEEPS]


def leftovers(started: float) -> list[str]:
    """Attack processes still alive, and live children this process adopted during the run."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if cmdline[:2] in ORPHANS:
                found.append(f"{proc.pid} {cmdline} (parent {proc.ppid()})")
        except psutil.Error:
            continue
    for child in psutil.Process().children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and child.create_time() >= started:
                found.append(f"child {child.pid} {child.cmdline()}")
        except psutil.Error:
            continue
    return found


def assert_nothing_forged(run: AttackRun) -> None:
    """0 passes, 0 rewards above 0 in results.jsonl, the store and every export."""
    assert [r.task_id for r in run.records.values() if r.passed] == []
    assert [r for r in run.records.values() if (r.reward or 0.0) > 0.0] == []
    assert [r for r in run.rewards if (r or 0.0) > 0.0] == []
    assert [r for r in run.results.values() if r.reward and r.reward.score > 0.0] == []
    for fmt, rows in run.exports.items():
        assert [row for row in rows if (row.get("reward") or 0.0) > 0.0] == [], fmt
        assert [row for row in rows if (row.get("extra_info") or {}).get("passed")] == [], fmt
    assert run.exports["sft"] == []  # nothing passed, so nothing to imitate


@pytest.fixture
def clean() -> Iterator[float]:
    """The test's start time; at its end, whatever an attack left is reported and killed."""
    started = time.time()
    yield started
    left = leftovers(started)
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if (proc.info["cmdline"] or [])[:2] in ORPHANS:
                proc.kill()
        except psutil.Error:
            continue
    assert left == []


# -- the executors and sandbox modes under attack ----------------------------------------------

# On Kubernetes a task's data comes with the image: each container has its own read-only
# copy. The stand-in's image holds its PYTHONPATH entries, this folder among them.
K8S_DATA = "k8s-image-data"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("kubernetes_asyncio", reason="pip install 'openforge[kubernetes]'")
    from k8s_standin import StandIn

    image_data = tmp_path_factory.mktemp(K8S_DATA)
    with StandIn(image_env={"PYTHONPATH": f"{HERE}:{image_data}"}) as k8s:
        k8s.image_data = image_data
        if not k8s.isolated:
            pytest.skip("the stand-in runs containers in their own PID and mount namespaces "
                        "only as root with unshare and setpriv (util-linux): CI runs as root")
        yield k8s


def kubernetes_options(standin: Any) -> dict[str, Any]:
    """The Kubernetes executor on the stand-in: the agent in its own container of the Pod;
    the checks that run its code while scoring in the supervisor container's best mode."""
    import sys

    return {"image": "openforge/rollout:test", "kubeconfig": str(standin.kubeconfig),
            "namespace": "default", "python": sys.executable, "requests": {"cpu": "100m"},
            "backoff_s": 0.05, "resync_s": 10, "termination_grace_s": 1}


def executors() -> list[Any]:
    """(executor, sandbox) pairs: local in every mode; the Kubernetes stand-in, where the
    agent's sandbox is its own container of the attempt's Pod (`pod`)."""
    return [pytest.param("local", *p.values, marks=p.marks, id=f"local-{p.id}")  # type: ignore[attr-defined]
            for p in ALL_MODES] + [pytest.param("kubernetes", "pod", id="kubernetes-pod")]


@pytest.fixture
def attack(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
           clean: float) -> Callable[..., AttackRun]:
    """`attack(executor, mode, attacks, concurrency=2)`: run `attacks` there, and check what
    every attack must leave: no process (the `clean` fixture kills and reports them at the
    end too) and nothing forged."""

    def run_attacks(executor: str, mode: str, attacks: tuple[str, ...],
                    concurrency: int = 2) -> AttackRun:
        if executor == "kubernetes":
            standin = request.getfixturevalue("standin")
            run = attack_run(tmp_path, monkeypatch, mode, attacks, "kubernetes",
                             kubernetes_options(standin), concurrency,
                             data=standin.image_data / tmp_path.name)
        else:
            run = attack_run(tmp_path, monkeypatch, mode, attacks, concurrency=concurrency)
        assert leftovers(clean) == []
        assert_nothing_forged(run)
        return run

    return run_attacks


@pytest.mark.parametrize("executor, mode", executors())
def test_attacks_never_score_and_leave_nothing(attack: Callable[..., AttackRun], executor: str,
                                               mode: str) -> None:
    run = attack(executor, mode, ATTACKS)
    records = run.records
    assert set(records) == set(ATTACKS)
    assert {r.sandbox for r in records.values()} == {mode}
    # A run without isolation says so loudly in its report (and in its header: see
    # test_local_executor.py::test_describe_sandbox_names_the_mode_and_warns_without_isolation).
    report = json.loads((run.run_dir / "report.json").read_text())
    html = (run.run_dir / "report.html").read_text()
    if run.isolating:
        assert report["sandbox"]["warning"] is None and "WITHOUT isolation" not in html
    else:
        assert report["sandbox"]["unisolated_attempts"] == len(ATTACKS)
        assert "WITHOUT isolation" in report["sandbox"]["warning"]
        assert "WARNING" in html and "WITHOUT isolation" in html

    # forge: no route takes a result from a token, and no line it wrote is taken as a
    # result; writing one is a violation (scored 0, not retried) that says where it was.
    forge = run.said("forge")
    assert "POST own 404" in forge
    forged = records["forge"]
    assert (forged.status, forged.reward, forged.tries) == ("violation", 0.0, 1), forge
    assert forged.reward_details["violation"] == "forged result line"
    error = forged.error or ""
    assert error.startswith("violation: forged result line in ")
    # In the harness's own stdout, which the supervisor captured (in every mode) ...
    assert "forged result line in the agent's output (harness.stdout)" in error
    if executor == "local":
        # ... and without isolation in the supervisor's stdout too, before its signed line.
        # Isolated, it finds no supervisor.
        assert ("in the supervisor's stdout" in error) == (not run.isolating)
    else:
        # ... and in the agent container's own termination message, which nobody reads.
        assert "WROTE /dev/termination-log" in forge
        assert "in the agent container's termination message" in error
    # kill: only without isolation can the agent see its supervisor; then it is an
    # infrastructure failure (retried, excluded), never a pass.
    if run.isolating:
        assert "KILLED" not in run.said("kill")
        assert records["kill"].status == "ok" and records["kill"].reward == 0.0
        # `all` forges a line before it tries to kill: that is what it did.
        assert records["all"].status == "violation" and records["all"].reward == 0.0
        assert "forged result line" in (records["all"].error or "")
    else:
        for task in ("kill", "all"):
            assert records[task].status == "infra_error", records[task]
            assert (records[task].error or "").startswith(
                "rollout supervisor died: killed by signal SIGKILL")
            assert records[task].tries == 2 and records[task].reward is None
    # orphans: found and ended whatever they dropped (the `clean` fixture checks), and
    # counted (locally: a Pod's compact result leaves the harness output out).
    assert records["orphans"].status == "ok"
    if executor == "local":
        orphans = run.results[records["orphans"].session_id]
        assert orphans.harness_output["ended_processes"] >= 2
    # link: the trusted side never follows a link out of the sandbox's view (nor opens a
    # FIFO); what it removed is counted in the reward's details (not a violation: benign
    # links exist, a virtualenv's python among them).
    link = records["link"]
    assert link.status == "ok" and link.reward == 0.0
    assert link.reward_details["scrubbed_links"] >= 1, link.reward_details
    assert link.reward_details["scrubbed_special_files"] >= 1, link.reward_details
    if executor == "local":
        removed = run.results[records["link"].session_id].harness_output["removed_files"]
        assert any("answer.txt" in r for r in removed) and any("stall.fifo" in r for r in removed)
    # trojan: the agent's script the checker runs cannot add a call (the session is sealed
    # before scoring) and, isolated, sees no more of the host than the agent did. The
    # refused call shows in the checker's output only: the status stays `ok`.
    trojan = str(records["trojan"].reward_details.get("verify_output"))
    assert records["trojan"].status == "ok" and records["trojan"].reward == 0.0
    assert "CALL 401" in trojan, trojan
    assert not [c for task_calls in run.calls.values() for c in task_calls
                if "from-the-checker" in json.dumps(c.request)]
    if run.isolating:
        assert "READ canary: not there" in trojan and "READ hidden: False" in trojan
    # neighbour: a port on the host's loopback that is not the rollout's own is out of reach
    # in the local isolating modes (their own network namespace); the same user on the
    # host's network reaches it. (The Kubernetes stand-in's containers share the host's
    # network; a real Pod has its own.)
    if executor == "local":
        reached = f"NEIGHBOUR said {NEIGHBOUR_SAYS!r}" in run.said("neighbour")
        assert reached == (not run.isolating), run.said("neighbour")
        if run.isolating:
            assert "NEIGHBOUR ConnectionRefusedError" in run.said("neighbour")
    # canary and tokens: in the isolating modes nothing of the host or of other rollouts.
    if run.isolating:
        for task in ATTACKS:
            assert CANARY not in run.said(task), task
            assert not [t for t, owner in run.found_tokens(task).items()
                        if owner not in (None, task)], task
        for fmt, rows in run.exports.items():
            assert CANARY not in json.dumps(rows, default=str), fmt


@pytest.mark.parametrize("executor, mode", executors())
def test_tampered_task_data_never_scores(attack: Callable[..., AttackRun], executor: str,
                                         mode: str) -> None:
    run = attack(executor, mode, TAMPER_ATTACKS, 1)
    tamper, exploit = run.records["tamper"], run.records["exploit"]
    if run.isolating:
        # The data is mapped read-only: the write fails, the honest score is 0.
        assert "COULD NOT TAMPER" in run.said("tamper")
        assert (run.data / "expected.txt").read_text() == SECRET_ANSWER
        assert (tamper.status, tamper.reward) == ("ok", 0.0)
        assert (exploit.status, exploit.reward) == ("ok", 0.0)
    else:
        # The same user can write it: the supervisor sees the change (a violation, scored
        # 0), and the runner scores no later attempt against the forged data.
        assert (run.data / "expected.txt").read_text() == "forged"
        assert (tamper.status, tamper.reward) == ("violation", 0.0)
        assert "the agent changed the task's data" in (tamper.error or "")
        assert exploit.status == "infra_error" and exploit.reward is None
        assert "the task's data changed after the run started" in (exploit.error or "")


@pytest.mark.parametrize("executor, mode", executors())
def test_a_sibling_cannot_use_its_neighbours_token(attack: Callable[..., AttackRun],
                                                   executor: str, mode: str) -> None:
    run = attack(executor, mode, SIBLING_ATTACKS)
    assert "victim released: b'done'" in run.said("victim")  # they did run side by side
    assert {r.status for r in run.records.values()} == {"ok"}
    stolen = {t for t, owner in run.found_tokens("sibling").items() if owner == "victim"}
    hijacked = [c for c in run.calls["victim"] if "hijacked" in json.dumps(c.request)]
    if run.isolating:
        assert stolen == set() and hijacked == []
        if executor == "local":  # nor could it reach the victim's port: they met outside
            assert "sibling: the victim's port: ConnectionRefusedError" in run.said("sibling")
    else:
        # Without isolation the same user reads the victim's environment: the token works
        # for model calls (its trajectory gets a stranger's call), never for a result.
        assert stolen and "result 404" in run.said("sibling")


NO_CGROUPS = cgroups.unavailable(["processes", "memory", "cpu"])


@pytest.mark.skipif(NO_CGROUPS is not None, reason=f"no cgroup this user can make: {NO_CGROUPS}")
@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_fork_bomb_a_memory_hog_and_a_cpu_hog_stop_at_their_rollouts_limits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean: float, mode: str) -> None:
    options = {"sandbox": mode, "base_dir": str(tmp_path / "sandboxes"), "max_processes": 64,
               "memory_max": "256MiB", "cpu_max": 0.25}
    run = attack_run(tmp_path, monkeypatch, mode, LIMIT_ATTACKS, executor_options=options)
    assert leftovers(clean) == []
    assert_nothing_forged(run)
    bomb, hog = run.records["forkbomb"], run.records["hog"]
    assert (bomb.status, bomb.reward, hog.status, hog.reward) == ("ok", 0.0, "ok", 0.0)
    # The agent's forks and, while scoring, those of the script it left stop at the limit
    # (without one, each would stop at FORK_TRIES).
    agent = re.search(r"AGENT forked (\d+)", run.said("forkbomb"))
    checker = re.search(r"VERIFIER forked (\d+)", bomb.reward_details["verify_output"])
    assert agent and checker and 0 < int(agent[1]) < 64 and 0 < int(checker[1]) < 64
    assert bomb.limits_reached["processes"] >= 2 and "memory" not in bomb.limits_reached
    said = run.said("hog")
    assert "HOG allocating" in said and "HOG survived" not in said  # ended at 256 of 1024 MiB
    assert hog.limits_reached["memory"] >= 1
    # The spinner's processes ran in its rollout's cpu cgroup, held to a quarter of a core
    # all together: the kernel made them wait (4 busy processes for 2 s want 8 CPU-seconds),
    # counted in that cgroup; the rollout still ran to its end, scored.
    spinner = run.records["spin"]
    assert (spinner.status, spinner.reward) == ("ok", 0.0)
    assert "SPIN done" in run.said("spin")
    assert spinner.limits_reached["cpu"] >= 1
    # Each rollout's cgroups are gone with it.
    made = {f"openforge-{r.rollout_id[:40]}-" for r in run.records.values()}
    left = [p for h in cgroups.hierarchies().values() if h.controller in ("pids", "memory", "cpu")
            for p in h.own.iterdir() if p.is_dir() and p.name[:-8] in made]
    assert left == []


@pytest.mark.skipif(disk.unavailable() is not None, reason=f"{disk.unavailable()}")
@pytest.mark.parametrize("mode", ALL_MODES)
def test_an_agent_that_fills_the_disk_is_ended_at_its_rollouts_limit_and_scored_0(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        clean: float, mode: str) -> None:
    base = tmp_path / "sandboxes"
    options = {"sandbox": mode, "base_dir": str(base), "disk_max": "16MiB", "files_max": 1000,
               "disk_check_s": 0.2}
    run = attack_run(tmp_path, monkeypatch, mode, DISK_ATTACKS, executor_options=options)
    assert leftovers(clean) == []
    assert_nothing_forged(run)
    fill, litter = run.records["fill"], run.records["litter"]
    # Ended once past the limit, after the model answered: the agent's doing, one attempt,
    # 0 (without the limit each would have stayed 20 s, said so and ended "ok").
    for record in (fill, litter):
        assert (record.status, record.reward, record.tries) == ("harness_error", 0.0, 1)
        assert record.limits_reached == {"disk": 1}
        assert "its final state was not scored, reward 0" in (record.error or "")
        assert "survived" not in run.said(record.task_id)
    assert re.search(r"its folder took [\d.]+ MiB on disk, past its limit of 16\.0 MiB",
                     fill.error or ""), fill.error
    assert re.search(r"its folder took [\d,]+ files, past its limit of 1,000",
                     litter.error or ""), litter.error
    assert [p.name for p in base.iterdir()] == []  # the folders went with their rollouts
    said = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "attempts that reached their rollout's limits: disk 2 (limits_reached" in said


def test_a_folder_past_its_limit_before_the_model_answered_is_infrastructures(
        tmp_path: Path) -> None:
    """Nothing recorded (here: no session to ask) leaves room for the harness or the
    environment to have filled it: `infra_error`, retried, as on Kubernetes."""
    from openforge.executors.local import LocalExecutor
    from openforge.types import RolloutSpec, Task

    executor = LocalExecutor(sandbox="none", base_dir=str(tmp_path))
    spec = RolloutSpec(run_id="r", rollout_id="r-1", task=Task(id="t", prompt="p"),
                       harness="mini", environment="demo", reward="checker",
                       gateway_url="http://127.0.0.1:9", session_token="x", timeout_s=10)
    result = asyncio.run(executor._ended_for_disk(spec, "its folder took 20.0 MiB", 1.0))
    assert (result.status, result.reward) == ("infra_error", None)
    assert result.error == ("rollout ended: its folder took 20.0 MiB (executor options "
                            "disk_max, files_max); no result")


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_the_sandboxs_tmp_and_shm_take_no_more_memory_than_tmp_max(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean: float, mode: str) -> None:
    options = {"sandbox": mode, "base_dir": str(tmp_path / "sandboxes"), "tmp_max": "16MiB"}
    run = attack_run(tmp_path, monkeypatch, mode, TMP_ATTACKS, executor_options=options)
    assert leftovers(clean) == []
    assert_nothing_forged(run)
    said = run.said("stuff").replace("\\n", "\n")
    for folder in ("/tmp", "/dev/shm"):
        found = re.search(rf"STUFF {folder} (\d+) MiB: ([^\\\n]+)", said)
        # Refused within the 16 MiB (less what the harness keeps there); without the size,
        # all 96 MiB would have gone into memory.
        assert found and 0 < int(found[1]) <= 16 and found[2] == "No space left on device", \
            (folder, said[-2000:])
    # Ended as any agent whose write was refused: scored as it ended, not retried.
    assert (run.records["stuff"].status, run.records["stuff"].tries) == ("ok", 1)

