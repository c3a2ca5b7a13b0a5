"""The `namespaces` sandbox: bubblewrap's isolation built from user, mount, PID and network
namespaces.

    python -m openforge.sandbox.nsinit PLAN_JSON INFO_FD STATUS_FD -- ARGV...
    python -m openforge.sandbox.nsinit --reap STATUS_FD [--relay DIR PORT,...] -- ARGV...
    python -m openforge.sandbox.nsinit --probe

For machines without bubblewrap whose kernel lets an unprivileged user create namespaces.
Three processes:

- the **outer** process (this program as started) unshares a user, mount, PID, IPC, UTS,
  cgroup and network namespace, maps its own uid and gid to 0 inside, brings up `lo` (the
  only interface: no host port is reachable), forks the sandbox's PID 1, reports
  that child's pid and PID namespace on INFO_FD as `{"child-pid": N, "pid-namespace": I}`
  and waits for it;
- **PID 1** of the new PID namespace builds the `View` on an empty tmpfs (read-only binds
  remounted read-only one mount at a time, `/proc` of the new namespace, a minimal `/dev`),
  pivots into it and detaches the host's root, drops every capability (bounding set too) and
  sets no_new_privs, then `reap`s: makes itself non-dumpable (the agent cannot open its
  `/proc/1/fd`), listens on 127.0.0.1 (and ::1) for each relayed port, forks the harness,
  passes each connection to a relayed port on to the trusted relay's unix socket
  (`openforge.sandbox.relay`, a directory mapped read-only), reaps until the harness ends,
  reports on STATUS_FD `{"exit": CODE, "left": N}` (the harness's exit code, negative for a signal, and how many
  processes it left running), then exits, and the kernel kills every process left in the
  namespace: nothing outlives the harness, whatever it did (setsid, double fork, dropping
  every marker). In bubblewrap the same `reap` runs as PID 1 (`--reap`, `--as-pid-1`;
  bubblewrap has unshared the network and brought up `lo` itself);
- the **harness** (PID 2), exec'd with the environment this program was given.

A setup failure is reported on INFO_FD as `{"error": "..."}` and ends with exit code 125.
Only the standard library: this runs before anything else is imported.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import json
import os
import platform
import signal
import socket
import struct
import sys
import threading
from typing import Any

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID = 0x08000000, 0x10000000, 0x20000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
# statvfs flags -> mount flags a remount must keep (a user namespace may not clear them).
_KEEP = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
         (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
         (os.ST_RELATIME, MS_RELATIME))
SETUP_FAILED = 125

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class SetupError(Exception):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(src.encode() if src else None, dst.encode(),
                       fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                       data.encode() if data else None), f"mount {src or fstype} on {dst}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mkdirs(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)


def _touch(path: str) -> None:
    _mkdirs(os.path.dirname(path))
    if not os.path.exists(path):
        with open(path, "w"):
            pass


def _unescape(field: str) -> str:
    """A mountinfo path: spaces and friends are octal escapes (`\\040`)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts_under(path: str, proc: str) -> list[str]:
    """Mount points at or under `path`, outermost first (`proc`: where /proc is mounted)."""
    found = []
    with open(proc + "/self/mountinfo") as f:
        for line in f:
            point = _unescape(line.split()[4])
            if point == path or point.startswith(path.rstrip("/") + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"))


def _remount_readonly(path: str, proc: str) -> None:
    for point in _mounts_under(path, proc):
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue  # a mount we cannot stat is one the agent cannot use either
        keep = 0
        for st, ms in _KEEP:
            if flags & st:
                keep |= ms
        _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def _bind(src: str, dst: str, rw: bool, proc: str) -> None:
    if os.path.isdir(src):
        _mkdirs(dst)
    else:
        _touch(dst)
    _mount(src, dst, None, MS_BIND | MS_REC)
    if not rw:
        _remount_readonly(dst, proc)


def _drop_capabilities() -> None:
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header = Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (Data * 2)()
    _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def build_root(view: dict[str, Any], base: str) -> None:
    """Lay out the view under `base` + /newroot (host paths under `base` + /oldroot)."""
    new, old = base + "/newroot", base + "/oldroot"
    _mkdirs(new)
    _mount(new, new, None, MS_BIND | MS_REC)  # pivot_root wants a mount point
    # /dev: a tmpfs with the few devices a program needs, bound from the host.
    _mkdirs(new + "/dev")
    _mount("tmpfs", new + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755")
    for device in ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                   "/dev/tty"):
        if os.path.exists(old + device):
            _touch(new + device)
            _mount(old + device, new + device, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                         ("ptmx", "pts/ptmx")):
        os.symlink(target, f"{new}/dev/{name}")
    _mkdirs(new + "/proc")
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    size = f",size={view['tmpfs_size']}" if view.get("tmpfs_size") else ""
    for path in view["tmpfs"]:
        _mkdirs(new + path)
        _mount("tmpfs", new + path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777" + size)
    for bind in view["binds"]:
        _bind(old + bind["src"], new + bind["dst"], bind["rw"], new + "/proc")
    for path in view["hidden"]:  # after the binds: over the folder a read-only bind shows
        _mount("tmpfs", new + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
               "mode=0755")
    for target, path in view["symlinks"]:
        _mkdirs(os.path.dirname(new + path))
        os.symlink(target, new + path)
    for path in view["masks"]:
        _touch(new + path)
        _mount(old + "/dev/null", new + path, None, MS_BIND)
        _remount_readonly(new + path, new + "/proc")


def _pivot_root(new_root: str, put_old: str) -> None:
    number = _PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise SetupError(f"pivot_root: unknown syscall number on {platform.machine()}")
    _check(_libc.syscall(number, new_root.encode(), put_old.encode()), "pivot_root")


def enter_root(view: dict[str, Any], base: str) -> None:
    """Mount the view and make it the root; the host's root is detached afterwards."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    _mkdirs(base + "/oldroot")
    _pivot_root(base, base + "/oldroot")
    base = ""  # the tmpfs is the root now; the host's root is at /oldroot
    build_root(view, base)
    os.chdir("/newroot")
    _pivot_root(".", ".")  # newroot becomes "/", the tmpfs (holding /oldroot) stacked on it
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _loopback_up() -> None:
    """Bring up `lo` of the new network namespace (it starts down: not even 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


Relay = tuple[str, list[int]]  # (the relay's directory as the sandbox sees it, its ports)


def _listen(relay: Relay | None) -> list[tuple[socket.socket, str]]:
    """Sockets listening on 127.0.0.1:PORT (and [::1]:PORT where the namespace has IPv6) for
    each relayed port, each with the relay's unix socket it leads to. Bound before the harness
    starts, so its first connection is queued, never refused."""
    if relay is None:
        return []
    directory, ports = relay
    listeners = []
    for port in ports:
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                continue  # no IPv6 here
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((host, port))
                sock.listen(64)
            except OSError:
                sock.close()
                if family == socket.AF_INET:
                    raise
                continue
            listeners.append((sock, f"{directory}/{port}.sock"))
    return listeners


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy `source` to `sink` until `source` ends (or either breaks); then half-close `sink`:
    the other direction may still carry an answer. Both halves of a relayed connection use
    it: here in the sandbox's PID 1, and `openforge.sandbox.relay` on the trusted side."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
        try:
            sock.shutdown(how)
        except OSError:
            pass


def _join(inside: socket.socket, path: str) -> None:
    """One connection of the harness, joined to the relay's unix socket for its port."""
    outside = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        outside.connect(path)
    except OSError:
        outside.close()
        inside.close()
        return
    answer = threading.Thread(target=pump, args=(outside, inside), daemon=True)
    answer.start()
    pump(inside, outside)
    answer.join()
    inside.close()
    outside.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_join, args=(conn, path), daemon=True).start()


def forward(listeners: list[tuple[socket.socket, str]]) -> None:
    """Serve `_listen`'s sockets in threads of PID 1 (started after the harness is forked: a
    fork copies only the forking thread). They end with PID 1, and the namespace with them."""
    for listener, path in listeners:
        threading.Thread(target=_serve, args=(listener, path), daemon=True).start()


def _report(fd: int, data: dict[str, Any]) -> None:
    try:
        os.write(fd, json.dumps(data).encode() + b"\n")
    except OSError:
        pass


def _left_in_namespace() -> int:
    """Processes of this PID namespace other than this one (PID 1) that are still running."""
    left = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == "1":
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            left += 1
    return left


def reap(argv: list[str], cwd: str, status_fd: int, relay: Relay | None = None) -> None:
    """PID 1's job: run the harness, carry its connections to the relayed ports (`forward`),
    reap every orphan until the harness ends, report on STATUS_FD how it ended and how many
    processes it left running, then exit: the kernel kills whatever is left in the
    namespace. Does not return."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the agent cannot open /proc/1/fd
    try:
        listeners = _listen(relay)
    except OSError as exc:
        _report(status_fd, {"exec_error": f"cannot listen on a relayed port: {exc}"})
        os._exit(0)
    # exec's outcome: the pipe closes on a successful exec, or carries why it failed.
    exec_r, exec_w = os.pipe2(os.O_CLOEXEC)
    harness = os.fork()
    if harness == 0:
        os.close(status_fd)
        os.close(exec_r)
        try:
            os.chdir(cwd)
            os.setsid()
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(exec_w, f"cannot run {argv[0]}: {exc.strerror or exc}".encode())
        os._exit(127)
    os.close(exec_w)
    failed = os.read(exec_r, 4096)
    os.close(exec_r)
    if failed:
        os.waitpid(harness, 0)
        _report(status_fd, {"exec_error": failed.decode(errors="replace")})
        os._exit(0)
    forward(listeners)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        except InterruptedError:
            continue
        if pid == harness:
            _report(status_fd, {"exit": os.waitstatus_to_exitcode(status),
                                "left": _left_in_namespace()})
            os._exit(0)


def _pid1(view: dict[str, Any], base: str, argv: list[str], info_fd: int, alive_r: int,
          status_fd: int, relay: Relay | None) -> None:
    """PID 1 of the sandbox: build the root, then `reap`."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.set_blocking(alive_r, False)
        try:
            if os.read(alive_r, 1) == b"":
                os._exit(SETUP_FAILED)  # the outer process is already gone
        except BlockingIOError:
            pass
        os.close(alive_r)
        enter_root(view, base)
        socket.sethostname("openforge")
        _drop_capabilities()
    except (SetupError, OSError) as exc:
        _report(info_fd, {"error": f"namespaces sandbox setup failed: {exc}"})
        os._exit(SETUP_FAILED)
    os.close(info_fd)
    reap(argv, view["cwd"], status_fd, relay)


def run(view: dict[str, Any], base: str, argv: list[str], info_fd: int, status_fd: int,
        relay: Relay | None = None) -> None:
    """The outer process (see the module docstring); does not return."""
    uid, gid = os.getuid(), os.getgid()
    try:
        _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC
                             | CLONE_NEWUTS | CLONE_NEWCGROUP | CLONE_NEWNET), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
        _loopback_up()
    except (SetupError, OSError) as exc:
        _report(info_fd, {"error": f"namespaces sandbox setup failed: {exc}"})
        os._exit(SETUP_FAILED)
    alive_r, alive_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(alive_w)
        _pid1(view, base, argv, info_fd, alive_r, status_fd, relay)
    os.close(alive_r)
    os.close(status_fd)
    try:
        namespace = os.readlink(f"/proc/{child}/ns/pid")
    except OSError:
        namespace = ""
    _report(info_fd, {"child-pid": child, "pid-namespace": namespace[5:-1] if namespace else None})
    os.close(info_fd)

    def end(signum: int, frame: Any) -> None:
        os.kill(child, signal.SIGKILL)  # PID 1 gone: the whole namespace goes

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, end)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)  # how it ended is on STATUS_FD


def probe() -> int:
    """Build a minimal sandbox and run `true` in it: prints ok when this machine can."""
    import tempfile

    from openforge.sandbox.view import SYSTEM_DIRS, Bind, View

    base = tempfile.mkdtemp(prefix="openforge-nsprobe-")
    plan = View(binds=[Bind(p, p) for p in SYSTEM_DIRS if os.path.isdir(p) and not os.path.islink(p)],
                symlinks=[(os.readlink(p), p) for p in SYSTEM_DIRS if os.path.islink(p)])
    view = plan.to_json()
    r, w = os.pipe()
    status_r, status_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(status_r)
        run(view, base, ["true"], w, status_w)
    os.close(w)
    os.close(status_w)
    info = os.read(r, 4096)
    _, status = os.waitpid(pid, 0)
    reported = os.read(status_r, 4096)
    os.rmdir(base)
    ok = os.WIFEXITED(status) and b"child-pid" in info and b'"exit": 0' in reported
    print("ok" if ok else f"no: {info.decode(errors='replace').strip()}")
    return 0 if ok else 1


USAGE = """usage: python -m openforge.sandbox.nsinit PLAN_JSON INFO_FD STATUS_FD -- ARGV...
       python -m openforge.sandbox.nsinit --reap STATUS_FD [--relay DIR PORT,...] -- ARGV...
                                                                    (PID 1 in bubblewrap)
       python -m openforge.sandbox.nsinit --probe"""


def _relay(directory: str, ports: list[Any]) -> Relay:
    return directory, [int(p) for p in ports if str(p)]


def main(args: list[str]) -> int:
    if args == ["--probe"]:
        return probe()
    if len(args) >= 4 and args[0] == "--reap" and args[2] == "--":
        reap(args[3:], os.getcwd(), int(args[1]))
    if len(args) >= 7 and args[0] == "--reap" and args[2] == "--relay" and args[5] == "--":
        reap(args[6:], os.getcwd(), int(args[1]), _relay(args[3], args[4].split(",")))
    if len(args) < 5 or args[3] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    with open(args[0]) as f:
        plan = json.load(f)
    relay = plan.get("relay")
    run(plan["view"], plan["base"], args[4:], int(args[1]), int(args[2]),
        _relay(relay["dir"], relay["ports"]) if relay else None)
    return SETUP_FAILED  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
